// SPDX-License-Identifier: Apache-2.0

package crio

import (
	"bytes"
	"fmt"
	"path/filepath"
	"strconv"
	"text/template"
)

// SandboxImage is the name the locally built pause image is imported under and
// CRI-O's pause_image. containers/storage needs a fully qualified name.
const SandboxImage = "podwire.test/pause:e2e"

// Host programs the config names outside the test's directory: Debian's runc and
// conmon run every pod.
const (
	Runc   = "/usr/sbin/runc"
	Conmon = "/usr/bin/conmon"
)

// Paths is where a private CRI-O keeps everything, all below Dir.
type Paths struct {
	Dir                          string
	Root, RunRoot                string // containers/storage
	Socket                       string // CRI listen socket
	NamespacesDir                string // pinns bind-mounts pod namespaces below it
	ExitsDir, AttachDir, LogDir  string
	RuncRoot                     string
	VersionFile, VersionFilePers string
	CleanShutdownFile            string
	SignaturePolicy              string
	HooksDir, CDIDir, KeysDir    string
	Tmp                          string
}

// PathsIn lays out a private CRI-O below dir.
func PathsIn(dir string) Paths {
	j := func(p ...string) string { return filepath.Join(append([]string{dir}, p...)...) }
	return Paths{
		Dir:  dir,
		Root: j("storage"), RunRoot: j("run", "storage"),
		Socket:        j("crio.sock"),
		NamespacesDir: j("run", "ns"),
		ExitsDir:      j("run", "exits"), AttachDir: j("run", "attach"), LogDir: j("pods"),
		RuncRoot:    j("run", "runc"),
		VersionFile: j("run", "version"), VersionFilePers: j("lib", "version"),
		CleanShutdownFile: j("lib", "clean.shutdown"),
		SignaturePolicy:   j("policy.json"),
		HooksDir:          j("hooks.d"), CDIDir: j("cdi"), KeysDir: j("keys"),
		Tmp: j("tmp"),
	}
}

// ConfigParams is what the config file needs besides the paths.
type ConfigParams struct {
	Paths
	Pinns string
	// RuntimePath is the runc handler's runtime_path; "" is Debian's runc.
	RuntimePath string
	CNIConfDir  string
	CNIBinDir   string
	LogLevel    string
	// PauseImage is pause_image; "" is SandboxImage. CRI-O needs it in its storage even
	// for pods that run no infra container.
	PauseImage string
}

// Config renders CRI-O's config file: every path CRI-O writes to is below p.Dir, so
// two CRI-Os (or a node's own) never share a file. Each choice that is not CRI-O's
// default says why.
func Config(p ConfigParams) (string, error) {
	if p.RuntimePath == "" {
		p.RuntimePath = Runc
	}
	if p.LogLevel == "" {
		p.LogLevel = "info"
	}
	if p.PauseImage == "" {
		p.PauseImage = SandboxImage
	}
	var b bytes.Buffer
	if err := configTemplate.Execute(&b, p); err != nil {
		return "", err
	}
	return b.String(), nil
}

var configTemplate = template.Must(template.New("crio.conf").Funcs(template.FuncMap{
	"q":      strconv.Quote,
	"conmon": func() string { return Conmon },
}).Parse(`# Written by podwire's integration harness (integration/crio).
[crio]
root = {{q .Root}}
runroot = {{q .RunRoot}}
# overlay works on this machine's ext4; vfs would copy every layer.
storage_driver = "overlay"
log_dir = {{q .LogDir}}
version_file = {{q .VersionFile}}
version_file_persist = {{q .VersionFilePers}}
clean_shutdown_file = {{q .CleanShutdownFile}}

[crio.api]
listen = {{q .Socket}}
stream_address = "127.0.0.1"
stream_port = "0"

[crio.runtime]
# Debian ships runc, not crun (CRI-O's default runtime).
default_runtime = "runc"
# The machine runs no systemd for the tests; cgroupfs needs conmon in the pod's cgroup.
cgroup_manager = "cgroupfs"
log_level = {{q .LogLevel}}
namespaces_dir = {{q .NamespacesDir}}
pinns_path = {{q .Pinns}}
container_exits_dir = {{q .ExitsDir}}
container_attach_socket_dir = {{q .AttachDir}}
hooks_dir = [{{q .HooksDir}}]
cdi_spec_dirs = [{{q .CDIDir}}]
decryption_keys_path = {{q .KeysDir}}
irqbalance_config_file = {{q (print .Dir "/irqbalance")}}
# Restoring the irqbalance config would write into /etc/sysconfig.
irqbalance_config_restore_file = "disable"
default_mounts_file = {{q (print .Dir "/mounts.conf")}}
blockio_config_file = ""
rdt_config_file = ""

[crio.runtime.runtimes.runc]
runtime_path = {{q .RuntimePath}}
runtime_type = "oci"
runtime_root = {{q .RuncRoot}}
monitor_path = {{q (conmon)}}
monitor_cgroup = "pod"

[crio.image]
pause_image = {{q .PauseImage}}
signature_policy = {{q .SignaturePolicy}}
signature_policy_dir = {{q (print .Dir "/policies")}}
global_auth_file = ""
big_files_temporary_dir = {{q .Tmp}}

[crio.network]
network_dir = {{q .CNIConfDir}}
plugin_dirs = [{{q .CNIBinDir}}]

[crio.metrics]
enable_metrics = false

[crio.nri]
# Its socket (/var/run/nri/nri.sock) would collide with a containerd 2.x on the node.
enable_nri = false
`))

// SignaturePolicy accepts every image: the tests import only images they built.
const SignaturePolicy = `{"default":[{"type":"insecureAcceptAnything"}]}` + "\n"

// String is the paths as a list, for error messages.
func (p Paths) String() string { return fmt.Sprintf("CRI-O in %s (socket %s)", p.Dir, p.Socket) }
