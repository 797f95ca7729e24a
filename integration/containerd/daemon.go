// SPDX-License-Identifier: Apache-2.0

package containerd

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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

// sbinPath makes runc (in /usr/sbin) findable even when the test runs with a user's PATH.
const sbinPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

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
	// Runtime is the containerd release to run; the zero value is Debian's.
	Runtime Runtime
}

// Daemon is a running private containerd.
type Daemon struct {
	t            testing.TB
	Dir          string
	Root, State  string // containerd's root and state dirs
	Socket       string // its gRPC (and CRI) socket
	CgroupParent string // a cgroup parent unique to this daemon, for pod configs
	Version      string // `containerd --version`
	Runtime      Runtime
	crictl       string
	crictlConf   string
	cmd          *exec.Cmd
	exited       chan struct{}
	logPath      string
	cfgPath      string
	netNS        string
	stopOnce     sync.Once
	// machineDirs are directories outside Dir that did not exist before Start; stop
	// removes them again if containerd left them empty.
	machineDirs []string
}

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
	rt := o.Runtime
	if rt.Containerd == "" {
		rt = Debian()
	}
	d := &Daemon{
		t:            t,
		Runtime:      rt,
		Dir:          o.Dir,
		Root:         filepath.Join(o.Dir, "root"),
		State:        filepath.Join(o.Dir, "state"),
		Socket:       filepath.Join(o.Dir, "containerd.sock"),
		CgroupParent: "/podwire-e2e-" + hex.EncodeToString(rnd[:]),
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
	cfg, err := rt.config(configParams{Root: d.Root, State: d.State, Temp: filepath.Join(o.Dir, "tmp"), Socket: d.Socket,
		Opt: filepath.Join(o.Dir, "opt"), SandboxImage: SandboxImage, CNIBinDir: o.CNIBinDir, CNIConfDir: o.CNIConfDir,
		RuncRoot: filepath.Join(d.State, "runc"), Shim: lookup(rt.Shim)})
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(o.Dir, "config.toml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(lookup(rt.Containerd), "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --version: %v\n%s", rt.Containerd, err, out)
	}
	d.Version = strings.TrimSpace(string(out))

	d.cfgPath, d.netNS = cfgPath, o.NetNS
	if err := d.launch(); err != nil {
		t.Fatal(err)
	}
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

// launch starts containerd with d's config, appending to its log.
func (d *Daemon) launch() error {
	logFile, err := os.OpenFile(d.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	d.exited = make(chan struct{})
	// unshare and nsenter exec in place, so cmd's process is containerd itself.
	d.cmd = exec.Command("unshare", "--mount", "--propagation", "private",
		"nsenter", "--net="+d.netNS, lookup(d.Runtime.Containerd), "--config", d.cfgPath, "--log-level", "debug")
	d.cmd.Env = append(os.Environ(), "PATH="+os.Getenv("PATH")+":"+sbinPath)
	d.cmd.Stdout, d.cmd.Stderr = logFile, logFile
	// Its own process group, so a ^C reaches only the test, whose handler
	// stops pods and containerd in order.
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := d.cmd.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("starting containerd: %w", err)
	}
	exited := d.exited
	cmd := d.cmd
	go func() {
		_ = cmd.Wait()
		logFile.Close()
		close(exited)
	}()
	return nil
}

// Restart stops containerd with SIGTERM, as a node's service manager does on an
// upgrade (its shims, and so the pods, keep running), starts it again with the same
// config and dirs, and waits for the CRI plugin, which then recovers its sandboxes
// from containerd's metadata.
func (d *Daemon) Restart() {
	t := d.t
	t.Helper()
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(15 * time.Second):
		t.Fatalf("containerd ignored SIGTERM for 15s")
	}
	if err := d.launch(); err != nil {
		t.Fatal(err)
	}
	if err := d.waitReady(30 * time.Second); err != nil {
		t.Fatalf("containerd did not come back: %v\n%s", err, d.LogTail(40))
	}
}

// Ctr runs this release's ctr against this containerd in the CRI plugin's namespace.
func (d *Daemon) Ctr(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, lookup(d.Runtime.Ctr), append([]string{"--address", d.Socket, "--namespace", criNamespace}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
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
	out, err := exec.CommandContext(ctx, lookup(d.Runtime.Ctr), "--address", d.Socket, "--namespace", criNamespace,
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
