// SPDX-License-Identifier: Apache-2.0

package crio

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

	"github.com/podwire/podwire/integration/containerd"
)

// Packages are the Debian packages a private CRI-O needs: conmon and runc run its
// pods, skopeo puts images into its storage, gcc (and libc6-dev, checked by its
// headers) build pinns.
var Packages = map[string]string{
	"conmon": Conmon, "runc": Runc, "skopeo": "/usr/bin/skopeo", "gcc": "/usr/bin/gcc",
}

// Missing returns the Debian packages from Packages that are not installed.
func Missing() []string {
	var out []string
	for pkg, prog := range Packages {
		if _, err := os.Stat(prog); err != nil {
			out = append(out, pkg)
		}
	}
	if _, err := os.Stat("/usr/include/stdio.h"); err != nil {
		out = append(out, "libc6-dev")
	}
	return out
}

// Options configures a private CRI-O.
type Options struct {
	// NetNS is the network namespace CRI-O runs in: every plugin it execs, every
	// bridge, rule and hostPort it makes, lives there and not in the machine's.
	NetNS string
	// CNIBinDir and CNIConfDir become [crio.network] plugin_dirs and network_dir.
	CNIBinDir, CNIConfDir string
	// Dir is an empty directory owned by the caller; everything CRI-O writes goes below it.
	Dir string
	// Repo is podwire's checkout: the pause binary is built from it, crictl cached in it.
	Repo string
	Bin  Binaries
	// Images are imported into CRI-O's storage besides the pause image.
	Images []containerd.Image
}

// Daemon is a running private CRI-O.
type Daemon struct {
	t testing.TB
	Paths
	Bin          Binaries
	CgroupParent string // a cgroup parent unique to this daemon, for pod configs
	Version      string // `crio --version`'s first line
	crictl       string
	crictlConf   string
	cmd          *exec.Cmd
	exited       chan struct{}
	logPath      string
	cfgPath      string
	netNS        string
	// mntNS pins the mount namespace CRI-O runs in (see pinMountNS).
	mntNS    string
	stopOnce sync.Once
	// cgroupsBefore are CRI-O's default cgroup parents that existed before Start.
	cgroupsBefore map[string]bool
}

// Start writes the config, pins a private mount namespace, imports the sandbox image
// (and o.Images) into CRI-O's storage, starts CRI-O inside o.NetNS and that mount
// namespace, and waits for its CRI socket. A cleanup removes every pod, stops CRI-O,
// releases the mount namespace (and with it every overlay, shm and netns mount CRI-O
// made) and removes the pods' cgroups, even when the test fails.
func Start(t testing.TB, o Options) *Daemon {
	t.Helper()
	var rnd [3]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		t.Fatal(err)
	}
	d := &Daemon{t: t, Paths: PathsIn(o.Dir), Bin: o.Bin, netNS: o.NetNS,
		CgroupParent: "/podwire-crio-" + hex.EncodeToString(rnd[:]),
		logPath:      filepath.Join(o.Dir, "crio.log"), cfgPath: filepath.Join(o.Dir, "crio.conf"),
		cgroupsBefore: existingDefaultCgroups()}
	for _, dir := range []string{d.Root, d.RunRoot, d.NamespacesDir, d.ExitsDir, d.AttachDir, d.LogDir, d.Tmp,
		d.HooksDir, d.CDIDir, d.KeysDir, filepath.Join(o.Dir, "conf.d"), filepath.Dir(d.VersionFilePers)} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	crictl, err := containerd.EnsureCrictl(o.Repo)
	if err != nil {
		t.Fatalf("installing crictl: %v", err)
	}
	d.crictl, d.crictlConf = crictl, filepath.Join(o.Dir, "crictl.yaml")
	crictlConf := fmt.Sprintf("runtime-endpoint: unix://%s\nimage-endpoint: unix://%s\ntimeout: 60\npull-image-on-create: false\n", d.Socket, d.Socket)
	runtime, err := RuntimePath(o.Repo, o.Dir)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := Config(ConfigParams{Paths: d.Paths, Pinns: o.Bin.Pinns, RuntimePath: runtime, CNIConfDir: o.CNIConfDir, CNIBinDir: o.CNIBinDir})
	if err != nil {
		t.Fatal(err)
	}
	for path, content := range map[string]string{d.crictlConf: crictlConf, d.cfgPath: cfg,
		d.SignaturePolicy: SignaturePolicy, filepath.Join(o.Dir, "mounts.conf"): ""} {
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command(o.Bin.Crio, "--config", d.cfgPath, "--config-dir", filepath.Join(o.Dir, "conf.d"), "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --version: %v\n%s", o.Bin.Crio, err, out)
	}
	d.Version = versionLine(string(out))

	d.mntNS = d.pinMountNS()
	d.stopOnSignal()
	t.Cleanup(d.stop)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("CRI-O log (last lines of %s):\n%s", d.logPath, d.LogTail(15))
		}
	})
	d.importImages(o.Repo, o.Images)
	if err := d.launch(); err != nil {
		t.Fatal(err)
	}
	if err := d.waitReady(60 * time.Second); err != nil {
		t.Fatalf("CRI-O did not come up: %v\n%s", err, d.LogTail(40))
	}
	return d
}

// versionLine turns `crio --version` ("crio version 1.34.0\nGitCommit: ...") into
// its first line.
func versionLine(out string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(out), "\n")
	return strings.TrimSpace(line)
}

// pinMountNS creates the mount namespace CRI-O runs in and pins it at a file below
// Dir, so it outlives every CRI-O process: pinns bind-mounts each pod's netns below
// namespaces_dir inside it, and a pod has to keep its netns across a CRI-O restart
// (a pod with no infra process has nothing else holding it). The namespace is private,
// so none of CRI-O's overlay, shm or netns mounts ever appear in the machine's mount
// table; releasing the pin (stop) drops all of them at once. unshare needs the pin's
// directory on a private mount, hence the bind of the directory onto itself.
func (d *Daemon) pinMountNS() string {
	t := d.t
	dir := filepath.Join(d.Dir, "mntns")
	file := filepath.Join(dir, "mnt")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"mount", "--bind", dir, dir},
		{"mount", "--make-private", dir},
		{"touch", file},
		{"unshare", "--mount=" + file, "--propagation", "private", "true"},
	} {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			d.unpinMountNS(dir, file)
			t.Fatalf("pinning CRI-O's mount namespace: %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	t.Cleanup(func() { d.unpinMountNS(dir, file) })
	return file
}

func (d *Daemon) unpinMountNS(dir, file string) {
	for _, target := range []string{file, dir} {
		// Each umount only if mounted: a failed pin may have got half way.
		if exec.Command("mountpoint", "-q", target).Run() != nil {
			continue
		}
		if out, err := exec.Command("umount", target).CombinedOutput(); err != nil {
			d.t.Errorf("cleanup: umount %s: %v %s", target, err, out)
		}
	}
}

// InMountNS runs a command inside CRI-O's mount namespace (where the pods' netns
// files and overlay mounts are), in the caller's network namespace.
func (d *Daemon) InMountNS(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "nsenter", append([]string{"--mount=" + d.mntNS, name}, args...)...)
}

// NetNSPath returns a path to a pod's netns (a file pinns mounted in CRI-O's mount
// namespace) that opens from the test's mount namespace, through /proc/<pid>/root of
// the running CRI-O.
func (d *Daemon) NetNSPath(podNetNS string) string {
	return fmt.Sprintf("/proc/%d/root%s", d.Pid(), podNetNS)
}

// launch starts CRI-O with d's config, appending to its log.
func (d *Daemon) launch() error {
	logFile, err := os.OpenFile(d.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	d.exited = make(chan struct{})
	// nsenter execs in place, so cmd's process is CRI-O itself.
	d.cmd = exec.Command("nsenter", "--mount="+d.mntNS, "--net="+d.netNS,
		d.Bin.Crio, "--config", d.cfgPath, "--config-dir", filepath.Join(d.Dir, "conf.d"))
	d.cmd.Env = append(os.Environ(), "PATH="+os.Getenv("PATH")+":/usr/local/sbin:/usr/sbin:/sbin", "TMPDIR="+d.Tmp)
	d.cmd.Stdout, d.cmd.Stderr = logFile, logFile
	// Its own process group, so a ^C reaches only the test, whose handler stops
	// pods and CRI-O in order.
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := d.cmd.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("starting CRI-O: %w", err)
	}
	exited, cmd := d.exited, d.cmd
	go func() {
		_ = cmd.Wait()
		logFile.Close()
		close(exited)
	}()
	return nil
}

// Stop stops CRI-O with SIGTERM, as a node's service manager does; its pods (their
// conmon and container processes, their netns mounts) keep running.
func (d *Daemon) Stop() {
	d.t.Helper()
	if !d.running() {
		return
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(30 * time.Second):
		d.t.Fatalf("CRI-O ignored SIGTERM for 30s")
	}
}

// StartAgain starts a stopped CRI-O with the same config and dirs and waits for its
// socket; it then restores its pods from its storage and runs its startup CNI GC.
func (d *Daemon) StartAgain() {
	d.t.Helper()
	if err := d.launch(); err != nil {
		d.t.Fatal(err)
	}
	if err := d.waitReady(60 * time.Second); err != nil {
		d.t.Fatalf("CRI-O did not come back: %v\n%s", err, d.LogTail(40))
	}
}

// Restart is Stop then StartAgain.
func (d *Daemon) Restart() {
	d.t.Helper()
	d.Stop()
	d.StartAgain()
}

// Log returns CRI-O's whole log.
func (d *Daemon) Log() string {
	b, _ := os.ReadFile(d.logPath)
	return string(b)
}

// LogTail returns the last n lines of CRI-O's log.
func (d *Daemon) LogTail(n int) string {
	lines := strings.Split(strings.TrimRight(d.Log(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Pid is CRI-O's process ID.
func (d *Daemon) Pid() int { return d.cmd.Process.Pid }

func (d *Daemon) running() bool {
	if d.exited == nil {
		return false
	}
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
			return fmt.Errorf("CRI-O exited: %v", d.cmd.ProcessState)
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

// importImages builds the pause binary, packs it (and imgs) into OCI archives and
// copies them with skopeo into CRI-O's containers/storage, inside CRI-O's mount
// namespace, before CRI-O starts (CRI-O lists what its storage holds, so no
// registry and no pull is involved).
func (d *Daemon) importImages(repo string, imgs []containerd.Image) {
	t := d.t
	t.Helper()
	bin, err := os.ReadFile(d.buildGo(repo, "pause", "./integration/containerd/pause"))
	if err != nil {
		t.Fatal(err)
	}
	// skopeo (containers/image) keeps a blob-info cache in /var/lib/containers/cache
	// as root and has no option to put it elsewhere: remove what it creates there.
	defer removeIfCreated(t, blobInfoCacheDir, []string{"cache", "cache/blob-info-cache-v1.boltdb"})()
	all := append([]containerd.Image{{Name: SandboxImage, Entrypoint: []string{"/pause"},
		Files: []containerd.File{{Path: "/pause", Mode: 0o755, Data: bin}}}}, imgs...)
	for i, img := range all {
		var archive bytes.Buffer
		if err := containerd.WriteOCIArchive(&archive, img); err != nil {
			t.Fatal(err)
		}
		tarPath := filepath.Join(d.Dir, fmt.Sprintf("image-%d.tar", i))
		if err := os.WriteFile(tarPath, archive.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		dest := fmt.Sprintf("containers-storage:[overlay@%s+%s]%s", d.Root, d.RunRoot, img.Name)
		cmd := d.InMountNS(ctx, "skopeo", "--insecure-policy", "--tmpdir", d.Tmp, "copy", "--quiet", "oci-archive:"+tarPath, dest)
		cmd.Env = append(os.Environ(), "TMPDIR="+d.Tmp)
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("skopeo copy oci-archive:%s %s: %v\n%s", tarPath, dest, err, out)
		}
	}
}

// blobInfoCacheDir is where containers/image run as root keeps its blob-info cache.
const blobInfoCacheDir = "/var/lib/containers"

// removeIfCreated returns a func that removes dir if it did not exist when
// removeIfCreated was called and holds nothing but the given entries (relative paths).
func removeIfCreated(t testing.TB, dir string, only []string) func() {
	if _, err := os.Stat(dir); err == nil {
		return func() {}
	}
	return func() {
		allowed := map[string]bool{".": true}
		for _, e := range only {
			allowed[e] = true
		}
		var foreign []string
		_ = filepath.WalkDir(dir, func(path string, _ os.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			rel, _ := filepath.Rel(dir, path)
			if !allowed[rel] {
				foreign = append(foreign, rel)
			}
			return nil
		})
		if len(foreign) > 0 {
			t.Logf("leaving %s: it now holds %v besides the image import's cache", dir, foreign)
			return
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("removing %s (created by the image import): %v", dir, err)
		}
	}
}

// buildGo builds a static program of podwire's tree into Dir and returns its path.
func (d *Daemon) buildGo(repo, name, pkg string) string {
	d.t.Helper()
	out := filepath.Join(d.Dir, name)
	if err := BuildGo(repo, pkg, out); err != nil {
		d.t.Fatal(err)
	}
	return out
}

// Crictl runs crictl against this CRI-O and returns its stdout.
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

// CrictlConfig is the crictl config file naming this CRI-O's socket.
func (d *Daemon) CrictlConfig() string { return d.crictlConf }
