// SPDX-License-Identifier: Apache-2.0

package containerd

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// Runtime is one containerd release the harness can run: its programs and the config
// schema it reads.
type Runtime struct {
	// Name names the release in test names and logs: "containerd-<major>.<minor>".
	Name string
	// Containerd, Shim and Ctr are its programs: absolute paths, or names that are
	// looked up in PATH (and in the sbin directories).
	Containerd, Shim, Ctr string
	// ConfigVersion is the config schema Start writes: 2 for containerd 1.x, 3 for 2.x.
	ConfigVersion int
	// Packages maps each program the release needs from Debian to its package.
	Packages map[string]string
}

// hostPrograms are the Debian programs every release needs beside its own.
var hostPrograms = map[string]string{
	"runc":    "runc",
	"unshare": "util-linux",
	"nsenter": "util-linux",
}

// Programs are the executables Debian's containerd needs, with the Debian package that
// ships each.
var Programs = func() map[string]string {
	m := map[string]string{"containerd": "containerd", "containerd-shim-runc-v2": "containerd", "ctr": "containerd"}
	for prog, pkg := range hostPrograms {
		m[prog] = pkg
	}
	return m
}()

// Debian is the containerd that Debian's `containerd` package installs (1.6 on
// bookworm). Its Name comes from `containerd --version`, or is "containerd-debian"
// when it is not installed (Missing then says which packages to install).
func Debian() Runtime {
	rt := Runtime{Name: "containerd-debian", Containerd: "containerd", Shim: "containerd-shim-runc-v2", Ctr: "ctr",
		ConfigVersion: 2, Packages: Programs}
	if out, err := exec.Command(lookup("containerd"), "--version").Output(); err == nil {
		// "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3"
		if f := strings.Fields(string(out)); len(f) >= 3 {
			if mm := majorMinor(f[2]); mm != "" {
				rt.Name = "containerd-" + mm
				if strings.HasPrefix(mm, "2.") {
					rt.ConfigVersion = 3
				}
			}
		}
	}
	return rt
}

// majorMinor returns "1.6" for "1.6.20~ds1" or "v1.6.20", "" when v is no version.
func majorMinor(v string) string {
	f := strings.SplitN(strings.TrimPrefix(v, "v"), ".", 3)
	if len(f) < 2 || f[0] == "" || f[1] == "" || strings.Trim(f[0]+f[1], "0123456789") != "" {
		return ""
	}
	return f[0] + "." + f[1]
}

// Missing lists the Debian packages whose programs rt needs and are not installed.
func (rt Runtime) Missing() []string {
	seen := map[string]bool{}
	var out []string
	for prog, pkg := range rt.Packages {
		if !found(prog) && !seen[pkg] {
			seen[pkg] = true
			out = append(out, pkg)
		}
	}
	sort.Strings(out)
	return out
}

// Missing lists the Debian packages whose programs Debian's containerd needs and are
// not installed.
func Missing() []string { return Debian().Missing() }

// lookup returns prog's path: prog itself when it is a path, else from PATH or the
// sbin directories; prog unchanged when it is nowhere (exec then reports it).
func lookup(prog string) string {
	if strings.Contains(prog, "/") {
		return prog
	}
	if p, err := exec.LookPath(prog); err == nil {
		return p
	}
	for _, dir := range filepath.SplitList(sbinPath) {
		if p := filepath.Join(dir, prog); found(p) {
			return p
		}
	}
	return prog
}

// configParams are the values a config template takes, in its %[n] order.
type configParams struct {
	Root, State, Temp, Socket, Opt, SandboxImage, CNIBinDir, CNIConfDir, RuncRoot, Shim string
}

func (p configParams) args() []any {
	return []any{p.Root, p.State, p.Temp, p.Socket, p.Opt, p.SandboxImage, p.CNIBinDir, p.CNIConfDir, p.RuncRoot, p.Shim}
}

// config renders the config file for rt's schema.
func (rt Runtime) config(p configParams) (string, error) {
	switch rt.ConfigVersion {
	case 2:
		return fmt.Sprintf(configV2, p.args()...), nil
	case 3:
		return fmt.Sprintf(configV3, p.args()...), nil
	}
	return "", fmt.Errorf("%s: no config template for schema version %d", rt.Name, rt.ConfigVersion)
}

const configV2 = `# Written by podwire's containerd end-to-end test: a private containerd 1.x
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

// configV3 is configV2 in containerd 2.x's schema (docs/cri/config.md): the CRI
// plugin is split into io.containerd.cri.v1.images (snapshotter, sandbox image),
// io.containerd.cri.v1.runtime (runtimes, cni) and io.containerd.grpc.v1.cri (the
// streaming server), and cni takes bin_dirs (bin_dir is deprecated since 2.1).
const configV3 = `# Written by podwire's containerd end-to-end test: a private containerd 2.x
# (config schema version 3) that shares nothing with a system containerd.
version = 3
root = %[1]q
state = %[2]q
temp = %[3]q
# Snapshotters this test never uses, and NRI, whose socket (/var/run/nri/nri.sock)
# is one per machine.
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.blockfile", "io.containerd.snapshotter.v1.erofs", "io.containerd.nri.v1.nri"]

[grpc]
  address = %[4]q

[plugins.'io.containerd.internal.v1.opt']
  path = %[5]q

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"

  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = %[6]q

[plugins.'io.containerd.cri.v1.runtime']
  # Pod netns are bind-mounted under state, not /var/run/netns.
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  # As in the 1.x config: never ask for an oom_score_adj below containerd's own.
  restrict_oom_score_adj = true

  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [%[7]q]
    conf_dir = %[8]q
    max_conf_num = 1

  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"

    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      # The shim built with this containerd, not one a package put in PATH.
      runtime_path = %[10]q

      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        # runc's state goes under ours, not /run/containerd/runc.
        Root = %[9]q
        SystemdCgroup = false

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
`
