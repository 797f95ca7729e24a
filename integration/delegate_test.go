// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	"golang.org/x/sys/unix"

	"github.com/podwire/podwire/integration/nstest"
)

// execWatch counts the opens of one file (an exec opens the binary) through inotify.
type execWatch struct{ fd int }

func watchOpens(t *testing.T, path string) *execWatch {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatalf("inotify: %v", err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if _, err := unix.InotifyAddWatch(fd, path, unix.IN_OPEN); err != nil {
		t.Fatalf("watching %s: %v", path, err)
	}
	return &execWatch{fd}
}

// drain returns how many opens were queued since the last call. inotify merges an
// event into an identical one still unread, so this tells none from some, not how many.
func (w *execWatch) drain(t *testing.T) int {
	t.Helper()
	n := 0
	buf := make([]byte, 4096)
	for {
		m, err := unix.Read(w.fd, buf)
		if errors.Is(err, unix.EAGAIN) {
			return n
		}
		if err != nil {
			t.Fatalf("reading inotify events: %v", err)
		}
		n += m / unix.SizeofInotifyEvent // events on a file watch carry no name
	}
}

// TestBridgeIPAMInProcess: bridge runs podwire's host-local in its own process when
// CNI_PATH names the host-local built from the same sources, and executes any other
// host-local. Both ways give the same results, leases and errors.
func TestBridgeIPAMInProcess(t *testing.T) {
	h := nstest.New(t)
	realHL := filepath.Join(h.BinDir, "host-local")

	// A CNI_PATH whose first host-local is a wrapper around the real one: not the same
	// build, so bridge must execute it.
	wrapDir := t.TempDir()
	wrapper := fmt.Sprintf("#!/bin/sh\nexec %s \"$@\"\n", realHL)
	if err := os.WriteFile(filepath.Join(wrapDir, "host-local"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	modes := []struct {
		name    string
		cni     *libcni.CNIConfig
		opens   func(n int) bool
		wantHow string
	}{
		{"in-process", libcni.NewCNIConfig([]string{h.BinDir}, nil), func(n int) bool { return n == 0 }, "no exec of host-local"},
		{"executed", libcni.NewCNIConfig([]string{wrapDir, h.BinDir}, nil), func(n int) bool { return n > 0 }, "host-local executed"},
	}

	// The watch must see an exec, or "no opens" proves nothing.
	w := watchOpens(t, realHL)
	if out, err := exec.Command(realHL).CombinedOutput(); err != nil && !strings.Contains(string(out), "CNI") {
		t.Fatalf("running host-local for its about text: %v: %s", err, out)
	}
	if w.drain(t) == 0 {
		t.Fatalf("inotify saw no open of %s when it was executed; this test cannot tell exec from in-process here", realHL)
	}

	results := map[string][]string{}
	for i, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			dataDir := filepath.Join(h.DataDir, m.name)
			conf := func(octet int, ranges, version string) *libcni.NetworkConfigList {
				return h.Conflist(fmt.Sprintf(`{"cniVersion":%q,"name":"@PREFIX@n%d","plugins":[
				 {"type":"bridge","bridge":"@PREFIX@b%d%d","isGateway":true,"ipMasq":true,
				  "ipam":{"type":"host-local","ranges":%s,"dataDir":%q,
				          "routes":[{"dst":"0.0.0.0/0"},{"dst":"192.0.2.0/24","gw":"10.%d.%d.1"}]}}]}`,
					version, i, octet, i, ranges, dataDir, octet, i))
			}
			list := conf(31, fmt.Sprintf(`[[{"subnet":"10.31.%d.0/30"}]]`, i), "1.1.0")
			// The first call reads the binary once to compare builds; from then on an
			// in-process call opens nothing.
			warm := h.RT(h.NewPod(), "eth0", nstest.WithContainerID(h.Name("warm")))
			h.MustAdd(list, warm)
			if err := h.DelWith(m.cni, list, warm); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			w.drain(t)

			rt := h.RT(h.NewPod(), "eth0", nstest.WithContainerID(h.Name("a")))
			res, err := h.AddWith(m.cni, list, rt)
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			// A /30 has one free address after the gateway: the next ADD fails in IPAM.
			rt2 := h.RT(h.NewPod(), "eth0", nstest.WithContainerID(h.Name("b")))
			_, fullErr := h.AddWith(m.cni, list, rt2)
			var bad error
			{
				badList := conf(31, fmt.Sprintf(`[[{"subnet":"10.31.%d.0/24","rangeStart":"10.99.0.1"}]]`, i), "1.1.0")
				_, bad = h.AddWith(m.cni, badList, h.RT(h.NewPod(), "eth0", nstest.WithContainerID(h.Name("c"))))
			}
			// An old cniVersion: the IPAM result goes through the same conversion.
			old := conf(32, fmt.Sprintf(`[[{"subnet":"10.32.%d.0/24"}]]`, i), "0.3.1")
			rt3 := h.RT(h.NewPod(), "eth1", nstest.WithContainerID(h.Name("d")))
			oldRes, err := h.AddWith(m.cni, old, rt3)
			if err != nil {
				t.Fatalf("ADD with cniVersion 0.3.1: %v", err)
			}
			if err := h.DelWith(m.cni, list, rt); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			if err := h.DelWith(m.cni, old, rt3); err != nil {
				t.Fatalf("DEL (0.3.1): %v", err)
			}
			if n := w.drain(t); !m.opens(n) {
				t.Errorf("%s: host-local was opened %d times, want %s", m.name, n, m.wantHow)
			}
			if leases, _ := filepath.Glob(filepath.Join(dataDir, fmt.Sprintf("%sn%d", h.Prefix, i), "10.*")); len(leases) != 0 {
				t.Errorf("leases left after DEL: %v", leases)
			}
			// Normalise what legitimately differs between the two networks (index i).
			norm := func(s string) string {
				return strings.NewReplacer(fmt.Sprintf("10.31.%d.", i), "10.31.X.", fmt.Sprintf("10.32.%d.", i), "10.32.X.",
					fmt.Sprintf("%sn%d", h.Prefix, i), "NET", dataDir, "DATADIR").Replace(s)
			}
			results[m.name] = []string{
				norm(ipamPart(res)), norm(ipamPart(oldRes)),
				norm(errText(fullErr)), norm(errText(bad)),
			}
		})
	}
	in, ex := results["in-process"], results["executed"]
	if len(in) == 0 || len(ex) == 0 {
		t.Fatal("a mode did not finish")
	}
	for k, what := range []string{"ADD result", "ADD result at cniVersion 0.3.1", "error when the range is full", "error for a bad range"} {
		if in[k] != ex[k] {
			t.Errorf("%s differs:\n in-process: %s\n executed:   %s", what, in[k], ex[k])
		}
	}
	if in[2] == "no error" || in[3] == "no error" {
		t.Errorf("the failing ADDs succeeded: %q, %q", in[2], in[3])
	}
}

// ipamPart is the part of a bridge result that comes from IPAM.
func ipamPart(r *current.Result) string {
	var b strings.Builder
	for _, ip := range r.IPs {
		fmt.Fprintf(&b, "ip %s gw %v; ", ip.Address.String(), ip.Gateway)
	}
	for _, rt := range r.Routes {
		fmt.Fprintf(&b, "route %s via %v; ", rt.Dst.String(), rt.GW)
	}
	fmt.Fprintf(&b, "dns %+v", r.DNS)
	return b.String()
}

// errText renders a CNI error with its code, or "no error".
func errText(err error) string {
	if err == nil {
		return "no error"
	}
	if e, ok := cniErr(err); ok {
		return fmt.Sprintf("code %d: %s; %s", e.Code, e.Msg, e.Details)
	}
	return "not a CNI error: " + err.Error()
}
