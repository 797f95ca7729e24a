// SPDX-License-Identifier: Apache-2.0

package nstest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"

	"github.com/podwire/podwire/internal/testenv"
)

// H is one test's private world: a host netns in which the plugins run, any number of
// pod netns, a private dataDir and libcni cache, and a unique name prefix.
type H struct {
	t       testing.TB
	Prefix  string // 4-6 characters, unique per test; use it in every kernel name
	HostNS  ns.NetNS
	BinDir  string
	DataDir string // use as host-local's dataDir
	CNI     *libcni.CNIConfig
}

// RequireRoot ends the test unless it runs as root: a skip with a clear message on a
// developer's machine, a failure under CI=true (testenv.RequireRoot).
func RequireRoot(t testing.TB) {
	t.Helper()
	testenv.RequireRoot(t)
}

// Missing reports a tool or reference binary the test needs but cannot have: a skip
// on a developer's machine, a failure under CI=true, where .ci/run installs everything
// (a missing tool there is a broken CI script, and tests proving compatibility with
// the reference must never quietly not run). See testenv.Missing.
func Missing(t testing.TB, format string, a ...any) {
	t.Helper()
	testenv.Missing(t, format, a...)
}

// New builds the plugins (once), creates the host netns and registers cleanup. The
// first cleanup it registers runs last, after all of the test's own: it fails the test
// when a process the test started is still there (RequireNoNewProcs).
func New(t testing.TB) *H {
	t.Helper()
	RequireRoot(t)
	RequireNoNewProcs(t)
	bin, err := BinDir()
	if err != nil {
		t.Fatalf("building plugins: %v", err)
	}
	var b [2]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	h := &H{t: t, Prefix: "t" + hex.EncodeToString(b[:]), BinDir: bin}
	h.HostNS, err = testutils.NewNS()
	if err != nil {
		t.Fatalf("creating host netns: %v", err)
	}
	t.Cleanup(func() { closeNS(t, h.HostNS) })
	h.DataDir = t.TempDir()
	h.CNI = libcni.NewCNIConfigWithCacheDir([]string{bin}, filepath.Join(t.TempDir(), "cache"), nil)
	// Bring the host's lo up, as on a real node (hostPort via 127.0.0.1 needs it).
	h.Run(h.HostNS, "ip", "link", "set", "lo", "up")
	return h
}

func closeNS(t testing.TB, n ns.NetNS) {
	if n == nil {
		return
	}
	// Deleting the namespace removes every link, rule and qdisc inside it.
	if err := n.Close(); err != nil {
		t.Errorf("closing netns %s: %v", n.Path(), err)
	}
	if err := testutils.UnmountNS(n); err != nil {
		t.Errorf("removing netns %s: %v", n.Path(), err)
	}
}

// Name returns prefix+suffix, for names of bridges and other kernel objects.
func (h *H) Name(suffix string) string { return h.Prefix + suffix }

// NewPod creates a fresh pod netns, removed at cleanup unless DeletePod removed it.
// It is safe to call from several goroutines.
func (h *H) NewPod() ns.NetNS {
	h.t.Helper()
	p, err := testutils.NewNS()
	if err != nil {
		h.t.Fatalf("creating pod netns: %v", err)
	}
	h.t.Cleanup(func() {
		if _, err := os.Stat(p.Path()); err == nil {
			closeNS(h.t, p)
		}
	})
	return p
}

// DeletePod removes a pod netns now, as a runtime does when a sandbox dies.
func (h *H) DeletePod(p ns.NetNS) {
	h.t.Helper()
	closeNS(h.t, p)
}

// Conflist parses a conflist, replacing every "@PREFIX@" with the test prefix and
// "@DATADIR@" with the test's data directory.
func (h *H) Conflist(text string) *libcni.NetworkConfigList {
	h.t.Helper()
	text = strings.ReplaceAll(text, "@PREFIX@", h.Prefix)
	text = strings.ReplaceAll(text, "@DATADIR@", h.DataDir)
	list, err := libcni.NetworkConfFromBytes([]byte(text))
	if err != nil {
		h.t.Fatalf("parsing conflist: %v\n%s", err, text)
	}
	return list
}

// RT builds the RuntimeConf a runtime would pass for pod p and interface ifName.
// containerID defaults to the pod's netns base name.
func (h *H) RT(p ns.NetNS, ifName string, opts ...func(*libcni.RuntimeConf)) *libcni.RuntimeConf {
	rt := &libcni.RuntimeConf{
		ContainerID: filepath.Base(p.Path()),
		NetNS:       p.Path(),
		IfName:      ifName,
	}
	for _, o := range opts {
		o(rt)
	}
	return rt
}

// WithCaps sets runtimeConfig capability args (portMappings, bandwidth, ips, mac...).
func WithCaps(caps map[string]any) func(*libcni.RuntimeConf) {
	return func(rt *libcni.RuntimeConf) { rt.CapabilityArgs = caps }
}

// WithArgs sets CNI_ARGS pairs.
func WithArgs(kv ...[2]string) func(*libcni.RuntimeConf) {
	return func(rt *libcni.RuntimeConf) { rt.Args = append(rt.Args, kv...) }
}

// WithContainerID overrides the container ID.
func WithContainerID(id string) func(*libcni.RuntimeConf) {
	return func(rt *libcni.RuntimeConf) { rt.ContainerID = id }
}

// inHost runs f on a thread in the host netns, so plugins exec'd by libcni from f
// inherit that namespace and never see the machine's real one.
func (h *H) inHost(f func() error) error {
	return h.HostNS.Do(func(ns.NetNS) error { return f() })
}

func ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 2*time.Minute)
}

// Add runs ADD for the list and returns the result as a 1.x result.
func (h *H) Add(list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) (*current.Result, error) {
	var res types.Result
	err := h.inHost(func() error {
		c, cancel := ctx()
		defer cancel()
		var err error
		res, err = h.CNI.AddNetworkList(c, list, rt)
		return err
	})
	if err != nil {
		return nil, err
	}
	return current.NewResultFromResult(res)
}

// MustAdd is Add that fails the test on error.
func (h *H) MustAdd(list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) *current.Result {
	h.t.Helper()
	r, err := h.Add(list, rt)
	if err != nil {
		h.t.Fatalf("ADD %s %s: %v", list.Name, rt.IfName, err)
	}
	return r
}

// Del runs DEL for the list.
func (h *H) Del(list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) error {
	return h.inHost(func() error {
		c, cancel := ctx()
		defer cancel()
		return h.CNI.DelNetworkList(c, list, rt)
	})
}

// MustDel is Del that fails the test on error.
func (h *H) MustDel(list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) {
	h.t.Helper()
	if err := h.Del(list, rt); err != nil {
		h.t.Fatalf("DEL %s %s: %v", list.Name, rt.IfName, err)
	}
}

// Check runs CHECK for the list (needs cniVersion >= 0.4.0 and a cached ADD result).
func (h *H) Check(list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) error {
	return h.inHost(func() error {
		c, cancel := ctx()
		defer cancel()
		return h.CNI.CheckNetworkList(c, list, rt)
	})
}

// GC runs GC with the given valid attachments.
func (h *H) GC(list *libcni.NetworkConfigList, valid []types.GCAttachment) error {
	return h.inHost(func() error {
		c, cancel := ctx()
		defer cancel()
		return h.CNI.GCNetworkList(c, list, &libcni.GCArgs{ValidAttachments: valid})
	})
}

// Status runs STATUS.
func (h *H) Status(list *libcni.NetworkConfigList) error {
	return h.inHost(func() error {
		c, cancel := ctx()
		defer cancel()
		return h.CNI.GetStatusNetworkList(c, list)
	})
}

// Exec runs a plugin binary directly with the given environment and stdin, in the host
// netns, and returns stdout and the exit code: for bad-input tests that must see
// exactly what a runtime sees.
func (h *H) Exec(plugin string, env map[string]string, stdin string) (stdout string, exit int) {
	h.t.Helper()
	_ = h.inHost(func() error {
		cmd := exec.Command(filepath.Join(h.BinDir, plugin))
		cmd.Env = []string{"CNI_PATH=" + h.BinDir}
		for k, v := range env {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.Output()
		stdout = string(out)
		if ee, ok := err.(*exec.ExitError); ok {
			exit = ee.ExitCode()
		} else if err != nil {
			h.t.Fatalf("exec %s: %v", plugin, err)
		}
		return nil
	})
	return stdout, exit
}

// CNIError parses a JSON CNI error from a plugin's stdout.
func CNIError(stdout string) (*types.Error, error) {
	var e types.Error
	if err := json.Unmarshal([]byte(stdout), &e); err != nil {
		return nil, fmt.Errorf("stdout is not a JSON CNI error: %w: %q", err, stdout)
	}
	if e.Code == 0 {
		return nil, fmt.Errorf("stdout has no error code: %q", stdout)
	}
	return &e, nil
}

// InHost runs f on a thread in the host netns; commands and plugins started from f
// (on the same goroutine) run in that namespace.
func (h *H) InHost(f func() error) error { return h.inHost(f) }

// AddWith runs ADD through another libcni client (e.g. one whose CNI_PATH holds
// wrappers) and returns the result's addresses as strings.
func (h *H) AddWith(c *libcni.CNIConfig, list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) (*current.Result, error) {
	var res types.Result
	err := h.inHost(func() error {
		cx, cancel := ctx()
		defer cancel()
		var err error
		res, err = c.AddNetworkList(cx, list, rt)
		return err
	})
	if err != nil {
		return nil, err
	}
	return current.NewResultFromResult(res)
}

// DelWith runs DEL through another libcni client.
func (h *H) DelWith(c *libcni.CNIConfig, list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) error {
	return h.inHost(func() error {
		cx, cancel := ctx()
		defer cancel()
		return c.DelNetworkList(cx, list, rt)
	})
}
