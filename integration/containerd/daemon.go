package containerd

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// SandboxImage is the name the locally built pause image is imported under and the
// CRI plugin's sandbox_image.
const SandboxImage = "podwire.test/pause:e2e"

// criNamespace is the containerd namespace the CRI plugin works in.
const criNamespace = "k8s.io"

// Paths outside Dir that containerd 1.6 uses whatever its config says: libcni's result
// cache (go-cni offers no setting for it) and the shims' socket directory.
const (
	LibcniCacheDir = "/var/lib/cni"
	shimSocketDir  = "/run/containerd/s"
)

// Programs are the executables a private containerd needs, with the Debian package
// that ships each.
var Programs = map[string]string{
	"containerd":              "containerd",
	"containerd-shim-runc-v2": "containerd",
	"ctr":                     "containerd",
	"runc":                    "runc",
	"unshare":                 "util-linux",
	"nsenter":                 "util-linux",
}

// sbinPath makes runc (in /usr/sbin) findable even when the test runs with a user's PATH.
const sbinPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Missing lists the Debian packages whose programs are not installed.
func Missing() []string {
	seen := map[string]bool{}
	var out []string
	for prog, pkg := range Programs {
		if !found(prog) && !seen[pkg] {
			seen[pkg] = true
			out = append(out, pkg)
		}
	}
	sort.Strings(out)
	return out
}

// found looks prog up in PATH and in the sbin directories a root PATH may lack.
func found(prog string) bool {
	if _, err := exec.LookPath(prog); err == nil {
		return true
	}
	for _, dir := range filepath.SplitList(sbinPath) {
		if fi, err := os.Stat(filepath.Join(dir, prog)); err == nil && fi.Mode()&0o111 != 0 {
			return true
		}
	}
	return false
}

// Options configures a private containerd.
type Options struct {
	// NetNS is the network namespace containerd runs in; every CNI plugin it execs,
	// and so every bridge, rule and hostPort, lives there and not in the machine's.
	NetNS string
	// CNIBinDir and CNIConfDir become the CRI plugin's cni bin_dir and conf_dir.
	CNIBinDir, CNIConfDir string
	// Dir is an empty directory owned by the caller; containerd's config, root, state,
	// socket and logs all go below it.
	Dir string
	// Repo is podwire's checkout: the pause binary is built from it, crictl cached in it.
	Repo string
}

// Daemon is a running private containerd.
type Daemon struct {
	t            testing.TB
	Dir          string
	Root, State  string // containerd's root and state dirs
	Socket       string // its gRPC (and CRI) socket
	CgroupParent string // a cgroup parent unique to this daemon, for pod configs
	Version      string // `containerd --version`
	crictl       string
	crictlConf   string
	cmd          *exec.Cmd
	exited       chan struct{}
	logPath      string
	stopOnce     sync.Once
	// machineDirs are directories outside Dir that did not exist before Start; stop
	// removes them again if containerd left them empty.
	machineDirs []string
}

const configTemplate = `# Written by podwire's containerd end-to-end test: a private containerd 1.6
# (config schema version 2) that shares nothing with a system containerd.
version = 2
root = %[1]q
state = %[2]q
temp = %[3]q
# Snapshotters this test never uses; skipping them keeps start-up quiet.
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = %[4]q

[plugins."io.containerd.internal.v1.opt"]
  path = %[5]q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[6]q
  # Pod netns are bind-mounted under state, not /var/run/netns.
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  # Never ask for an oom_score_adj below containerd's own: lowering it needs
  # CAP_SYS_RESOURCE, which sandboxed CI machines drop (runc then fails the sandbox's
  # default -998 with "failed to update /proc/self/oom_score_adj: Permission denied").
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[7]q
    conf_dir = %[8]q
    max_conf_num = 1

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        # runc's state goes under ours, not /run/containerd/runc.
        Root = %[9]q
        SystemdCgroup = false
`

// Start writes a config, starts containerd inside o.NetNS and in a private mount
// namespace (so the overlay, shm and netns mounts it makes never appear in the
// machine's mount table), waits for the CRI plugin to serve, imports the locally built
// sandbox image, and registers a cleanup that removes every pod, stops containerd and
// its shims and removes the cgroups, even when the test fails.
func Start(t testing.TB, o Options) *Daemon {
	t.Helper()
	var rnd [3]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		t.Fatal(err)
	}
	d := &Daemon{
		t:            t,
		Dir:          o.Dir,
		Root:         filepath.Join(o.Dir, "root"),
		State:        filepath.Join(o.Dir, "state"),
		Socket:       filepath.Join(o.Dir, "containerd.sock"),
		CgroupParent: "/podwire-e2e-" + hex.EncodeToString(rnd[:]),
		exited:       make(chan struct{}),
		logPath:      filepath.Join(o.Dir, "containerd.log"),
	}
	for _, dir := range []string{LibcniCacheDir, LibcniCacheDir + "/results", filepath.Dir(shimSocketDir), shimSocketDir} {
		if _, err := os.Stat(dir); os.IsNotExist(err) {
			d.machineDirs = append(d.machineDirs, dir)
		}
	}
	for _, sub := range []string{"root", "state", "tmp", "opt", "logs"} {
		if err := os.MkdirAll(filepath.Join(o.Dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	crictl, err := EnsureCrictl(o.Repo)
	if err != nil {
		t.Fatalf("installing crictl: %v", err)
	}
	d.crictl = crictl
	d.crictlConf = filepath.Join(o.Dir, "crictl.yaml")
	crictlConf := fmt.Sprintf("runtime-endpoint: unix://%s\nimage-endpoint: unix://%s\ntimeout: 60\npull-image-on-create: false\n", d.Socket, d.Socket)
	if err := os.WriteFile(d.crictlConf, []byte(crictlConf), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(configTemplate, d.Root, d.State, filepath.Join(o.Dir, "tmp"), d.Socket,
		filepath.Join(o.Dir, "opt"), SandboxImage, o.CNIBinDir, o.CNIConfDir, filepath.Join(d.State, "runc"))
	cfgPath := filepath.Join(o.Dir, "config.toml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("containerd", "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("containerd --version: %v\n%s", err, out)
	}
	d.Version = strings.TrimSpace(string(out))

	logFile, err := os.Create(d.logPath)
	if err != nil {
		t.Fatal(err)
	}
	// unshare and nsenter exec in place, so cmd's process is containerd itself.
	d.cmd = exec.Command("unshare", "--mount", "--propagation", "private",
		"nsenter", "--net="+o.NetNS, "containerd", "--config", cfgPath, "--log-level", "debug")
	d.cmd.Env = append(os.Environ(), "PATH="+os.Getenv("PATH")+":"+sbinPath)
	d.cmd.Stdout, d.cmd.Stderr = logFile, logFile
	// Its own process group, so a ^C reaches only the test, whose handler below
	// stops pods and containerd in order.
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := d.cmd.Start(); err != nil {
		logFile.Close()
		t.Fatalf("starting containerd: %v", err)
	}
	go func() {
		_ = d.cmd.Wait()
		logFile.Close()
		close(d.exited)
	}()
	d.stopOnSignal()
	t.Cleanup(d.stop)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("containerd log (last lines of %s):\n%s", d.logPath, d.LogTail(80))
		}
	})

	if err := d.waitReady(30 * time.Second); err != nil {
		t.Fatalf("containerd did not come up: %v\n%s", err, d.LogTail(40))
	}
	d.importSandboxImage(o.Repo)
	return d
}

// LogTail returns the last n lines of containerd's log.
func (d *Daemon) LogTail(n int) string {
	b, _ := os.ReadFile(d.logPath)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Pid is containerd's process ID.
func (d *Daemon) Pid() int { return d.cmd.Process.Pid }

func (d *Daemon) running() bool {
	select {
	case <-d.exited:
		return false
	default:
		return true
	}
}

func (d *Daemon) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		if !d.running() {
			return fmt.Errorf("containerd exited: %v", d.cmd.ProcessState)
		}
		if _, err := os.Stat(d.Socket); err == nil {
			if _, last = d.Crictl("version"); last == nil {
				return nil
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("no CRI on %s after %s: %v", d.Socket, timeout, last)
}

// importSandboxImage builds the pause binary, packs it into an OCI archive and
// imports it with ctr into the CRI plugin's namespace, then waits until the CRI
// image service lists it (the CRI plugin learns of imports through events).
func (d *Daemon) importSandboxImage(repo string) {
	t := d.t
	t.Helper()
	pause := filepath.Join(d.Dir, "pause")
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", pause, "./integration/containerd/pause")
	build.Dir = repo
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the pause binary: %v\n%s", err, out)
	}
	bin, err := os.ReadFile(pause)
	if err != nil {
		t.Fatal(err)
	}
	var archive bytes.Buffer
	img := Image{Name: SandboxImage, Entrypoint: []string{"/pause"}, Files: []File{{Path: "/pause", Mode: 0o755, Data: bin}}}
	if err := WriteOCIArchive(&archive, img); err != nil {
		t.Fatal(err)
	}
	tarPath := filepath.Join(d.Dir, "pause-image.tar")
	if err := os.WriteFile(tarPath, archive.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ctr", "--address", d.Socket, "--namespace", criNamespace,
		"images", "import", tarPath).CombinedOutput()
	if err != nil {
		t.Fatalf("ctr images import %s: %v\n%s", tarPath, err, out)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := d.Crictl("inspecti", SandboxImage)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the CRI plugin does not list the imported sandbox image %s: %v", SandboxImage, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Crictl runs crictl against this containerd and returns its stdout.
func (d *Daemon) Crictl(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, d.crictl, append([]string{"--config", d.crictlConf}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("crictl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// MustCrictl is Crictl that fails the test.
func (d *Daemon) MustCrictl(args ...string) string {
	d.t.Helper()
	out, err := d.Crictl(args...)
	if err != nil {
		d.t.Fatal(err)
	}
	return out
}

// PodInspect is the part of `crictl inspectp -o json` the test reads.
type PodInspect struct {
	Status struct {
		ID      string `json:"id"`
		State   string `json:"state"`
		Network struct {
			IP            string `json:"ip"`
			AdditionalIPs []struct {
				IP string `json:"ip"`
			} `json:"additionalIps"`
		} `json:"network"`
	} `json:"status"`
	Info struct {
		Pid         int `json:"pid"`
		RuntimeSpec struct {
			Linux struct {
				Namespaces []struct {
					Type string `json:"type"`
					Path string `json:"path"`
				} `json:"namespaces"`
			} `json:"linux"`
		} `json:"runtimeSpec"`
	} `json:"info"`
}

// NetNSPath is the pod's network namespace file, as containerd mounted it.
func (p *PodInspect) NetNSPath() string {
	for _, n := range p.Info.RuntimeSpec.Linux.Namespaces {
		if n.Type == "network" {
			return n.Path
		}
	}
	return ""
}

// RunPod writes a PodSandboxConfig (JSON) and runs `crictl runp` on it.
func (d *Daemon) RunPod(name string, config any) (string, error) {
	b, err := json.MarshalIndent(config, "", "  ")
	if err != nil {
		return "", err
	}
	path := filepath.Join(d.Dir, name+"-pod.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return "", err
	}
	out, err := d.Crictl("runp", path)
	return strings.TrimSpace(out), err
}

// InspectPod runs `crictl inspectp -o json`.
func (d *Daemon) InspectPod(id string) (*PodInspect, error) {
	out, err := d.Crictl("inspectp", "-o", "json", id)
	if err != nil {
		return nil, err
	}
	var p PodInspect
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		return nil, fmt.Errorf("parsing crictl inspectp output: %w\n%s", err, out)
	}
	return &p, nil
}

// Mounts lists the mount points under d.Dir in containerd's mount namespace.
func (d *Daemon) Mounts() ([]string, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/mountinfo", d.Pid()))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && strings.HasPrefix(fields[4], d.Dir+"/") {
			out = append(out, fields[4])
		}
	}
	return out, sc.Err()
}

// Cgroups lists the cgroup directories below CgroupParent, in every hierarchy.
func (d *Daemon) Cgroups() []string { return d.cgroupDirs(false) }

// cgroupDirs lists, parents before children, the directories below CgroupParent in
// every hierarchy, and CgroupParent itself when withParent.
func (d *Daemon) cgroupDirs(withParent bool) []string {
	var out []string
	parents, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", d.CgroupParent))
	for _, p := range parents {
		_ = filepath.WalkDir(p, func(path string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() && (withParent || path != p) {
				out = append(out, path)
			}
			return nil
		})
	}
	return out
}

// stopOnSignal handles SIGINT and SIGTERM while the daemon runs. Without it a ^C ends
// the test binary without running any cleanup, leaving containerd, its shims and the
// pods running; with it they are stopped first, and then the binary exits as the
// signal would have made it.
func (d *Daemon) stopOnSignal() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case s := <-sigs:
			fmt.Fprintf(os.Stderr, "%v: stopping the test's containerd (%s) before exiting\n", s, d.Socket)
			d.stop()
			os.Exit(130)
		case <-done:
		}
	}()
	d.t.Cleanup(func() {
		signal.Stop(sigs)
		close(done)
	})
}

// stop removes every pod through CRI (as kubelet would on drain), stops containerd,
// then kills any shim (and its container processes) that outlived it and removes the
// test's cgroups. It logs what it had to force, since that means an unclean stop.
// It runs once, from the test's cleanup or from the signal handler.
func (d *Daemon) stop() { d.stopOnce.Do(d.doStop) }

func (d *Daemon) doStop() {
	t := d.t
	if d.running() {
		if out, err := d.Crictl("pods", "-q"); err == nil {
			for _, id := range strings.Fields(out) {
				if _, err := d.Crictl("stopp", id); err != nil {
					t.Logf("cleanup: %v", err)
				}
				if _, err := d.Crictl("rmp", id); err != nil {
					t.Logf("cleanup: %v", err)
				}
			}
		}
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.exited:
		case <-time.After(15 * time.Second):
			t.Logf("cleanup: containerd ignored SIGTERM for 15s; killing it")
			_ = d.cmd.Process.Kill()
			<-d.exited
		}
	}
	d.killShims()
	d.removeCgroups()
	for i := len(d.machineDirs) - 1; i >= 0; i-- {
		_ = os.Remove(d.machineDirs[i]) // only if empty: never anything we did not create
	}
}

// killShims finds shims serving this containerd (their -address is our socket) and
// kills their children (the pods' pause processes) and then the shims themselves.
func (d *Daemon) killShims() {
	procs, _ := filepath.Glob("/proc/[0-9]*")
	ppid := map[int]int{}
	var shims []int
	var leftovers []string // files the killed shims' sandboxes leave outside Dir
	for _, p := range procs {
		pid, _ := strconv.Atoi(filepath.Base(p))
		if stat, err := os.ReadFile(p + "/stat"); err == nil {
			// "pid (comm) state ppid ...": comm may contain spaces, so cut after ')'.
			if i := bytes.LastIndexByte(stat, ')'); i > 0 {
				if f := strings.Fields(string(stat[i+1:])); len(f) > 1 {
					ppid[pid], _ = strconv.Atoi(f[1])
				}
			}
		}
		cmdline, err := os.ReadFile(p + "/cmdline")
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		if !strings.HasPrefix(filepath.Base(args[0]), "containerd-shim") {
			continue
		}
		var addr, ns, id string
		for i := 0; i+1 < len(args); i++ {
			switch args[i] {
			case "-address":
				addr = args[i+1]
			case "-namespace":
				ns = args[i+1]
			case "-id":
				id = args[i+1]
			}
		}
		if addr != d.Socket {
			continue
		}
		shims = append(shims, pid)
		// containerd 1.6 puts shim sockets in /run/containerd/s/ under a hash of
		// (address, namespace, id); a killed shim leaves its socket behind.
		sum := sha256.Sum256([]byte(filepath.Join(addr, ns, id)))
		leftovers = append(leftovers, filepath.Join(shimSocketDir, hex.EncodeToString(sum[:])))
		// A sandbox whose CNI DEL never ran leaves libcni's cached result behind
		// (sandbox IDs are 64 hex digits, so the pattern matches only its entries).
		if len(id) == 64 {
			cached, _ := filepath.Glob(filepath.Join(LibcniCacheDir, "results", "*-"+id+"-*"))
			leftovers = append(leftovers, cached...)
		}
	}
	for _, shim := range shims {
		for pid, parent := range ppid {
			if parent == shim {
				d.t.Logf("cleanup: killing pid %d left running under containerd shim %d", pid, shim)
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		d.t.Logf("cleanup: killing containerd shim %d that outlived containerd", shim)
		_ = syscall.Kill(shim, syscall.SIGKILL)
	}
	for deadline := time.Now().Add(10 * time.Second); len(shims) > 0 && time.Now().Before(deadline); {
		alive := shims[:0]
		for _, pid := range shims {
			if syscall.Kill(pid, 0) == nil {
				alive = append(alive, pid)
			}
		}
		shims = alive
		time.Sleep(100 * time.Millisecond)
	}
	for _, f := range leftovers {
		if err := os.Remove(f); err == nil {
			d.t.Logf("cleanup: removed %s", f)
		}
	}
}

// removeCgroups removes CgroupParent and everything below it in every hierarchy,
// deepest first (cgroup directories are removed with rmdir, never recursively).
func (d *Daemon) removeCgroups() {
	dirs := d.cgroupDirs(true)
	for i := len(dirs) - 1; i >= 0; i-- {
		// Walk order puts parents first, so reverse order removes children first.
		if err := os.Remove(dirs[i]); err != nil && !os.IsNotExist(err) {
			d.t.Errorf("cleanup: removing cgroup %s: %v", dirs[i], err)
		}
	}
}
