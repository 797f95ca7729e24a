// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/podwire/podwire/integration/nstest"
)

// pid1Request and pid1Response mirror integration/pid1's request and response.
type pid1Request struct {
	Verb, HostNS, BinDir, CacheDir string
	Conflist                       json.RawMessage
	ContainerID, NetNS, IfName     string
	CapabilityArgs                 map[string]any       `json:",omitempty"`
	Valid                          []types.GCAttachment `json:",omitempty"`
}

type pid1Response struct {
	Err    string
	Others []string
}

var (
	pid1Build    sync.Once
	pid1BinPath  string
	pid1BuildErr error
)

// pid1Runtime is integration/pid1 running as PID 1 of its own pid namespace: a
// runtime that reaps only the children it started.
type pid1Runtime struct {
	t      *testing.T
	h      *nstest.H
	cache  string
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Scanner
	stderr bytes.Buffer
	seen   map[string]bool // processes already reported, so each is reported once
	left   []string        // every leftover seen, "after <call>: <pid comm state>"
	calls  int
}

func startPID1(t *testing.T, h *nstest.H) *pid1Runtime {
	t.Helper()
	pid1Build.Do(func() {
		repo, err := nstest.RepoRoot()
		if err != nil {
			pid1BuildErr = err
			return
		}
		dir, err := os.MkdirTemp("", "podwire-pid1-")
		if err != nil {
			pid1BuildErr = err
			return
		}
		pid1BinPath = filepath.Join(dir, "pid1")
		if out, err := exec.Command("go", "build", "-o", pid1BinPath, filepath.Join(repo, "integration/pid1")).CombinedOutput(); err != nil {
			pid1BuildErr = fmt.Errorf("building integration/pid1: %v\n%s", err, out)
		}
	})
	if pid1BuildErr != nil {
		t.Fatal(pid1BuildErr)
	}
	r := &pid1Runtime{t: t, h: h, cache: t.TempDir(), seen: map[string]bool{}}
	r.cmd = exec.Command(pid1BinPath)
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS}
	r.cmd.Stderr = &r.stderr
	var err error
	if r.in, err = r.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := r.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	r.out = bufio.NewScanner(stdout)
	r.out.Buffer(nil, 1<<20)
	if err := r.cmd.Start(); err != nil {
		t.Fatalf("starting pid1 in a new pid namespace: %v", err)
	}
	// Closing stdin ends it; its pid namespace, and whatever is left in it, goes too.
	t.Cleanup(func() {
		r.in.Close()
		done := make(chan error, 1)
		go func() { done <- r.cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("pid1: %v\n%s", err, r.stderr.String())
			}
		case <-time.After(10 * time.Second):
			r.cmd.Process.Kill()
			<-done
			t.Errorf("pid1 did not exit when its stdin closed")
		}
	})
	return r
}

// call runs one verb under pid1 and reports, as a test error, every process of its
// pid namespace that was not there before the call: what a plugin left behind.
func (r *pid1Runtime) call(verb string, list *libcni.NetworkConfigList, pod ns.NetNS, rt *libcni.RuntimeConf, valid ...types.GCAttachment) error {
	r.t.Helper()
	req := pid1Request{Verb: verb, HostNS: r.h.HostNS.Path(), BinDir: r.h.BinDir, CacheDir: r.cache, Conflist: list.Bytes, Valid: valid}
	what := verb + " " + list.Name
	if rt != nil {
		req.ContainerID, req.NetNS, req.IfName, req.CapabilityArgs = rt.ContainerID, rt.NetNS, rt.IfName, rt.CapabilityArgs
		what += " " + rt.IfName
	}
	b, err := json.Marshal(req)
	if err != nil {
		r.t.Fatal(err)
	}
	if _, err := r.in.Write(append(b, '\n')); err != nil {
		r.t.Fatalf("writing to pid1: %v\n%s", err, r.stderr.String())
	}
	if !r.out.Scan() {
		r.t.Fatalf("pid1 did not answer %s: %v\n%s", what, r.out.Err(), r.stderr.String())
	}
	r.calls++
	var resp pid1Response
	if err := json.Unmarshal(r.out.Bytes(), &resp); err != nil {
		r.t.Fatalf("pid1's answer to %s: %v: %s", what, err, r.out.Bytes())
	}
	var added []string
	for _, p := range resp.Others {
		pid := strings.Fields(p)[0]
		if !r.seen[pid] {
			r.seen[pid] = true
			added = append(added, p)
			r.left = append(r.left, what+": "+p)
		}
	}
	if len(added) > 0 {
		r.t.Errorf("after %s, %d process(es) left in the runtime's pid namespace (pid comm state; Z = zombie): %s; a plugin must leave no process when it exits",
			what, len(added), strings.Join(added, ", "))
	}
	if resp.Err != "" {
		return fmt.Errorf("%s", resp.Err)
	}
	return nil
}

func (r *pid1Runtime) must(verb string, list *libcni.NetworkConfigList, pod ns.NetNS, rt *libcni.RuntimeConf, valid ...types.GCAttachment) {
	r.t.Helper()
	if err := r.call(verb, list, pod, rt, valid...); err != nil {
		r.t.Fatalf("%s %s: %v", verb, list.Name, err)
	}
}

// TestPluginsUnderPID1 runs every plugin and verb (ADD, CHECK, DEL, GC, STATUS) under a
// runtime that is PID 1 of its own pid namespace and reaps only its own children, as a
// runtime does in a container: the kubenet chain (bridge with ipMasq and host-local,
// portmap with a hostPort, bandwidth ingress and egress) and loopback, with both
// netfilter backends, including GC of a pod the runtime lost and a DEL whose netns is
// gone. After every call no other process may exist in that namespace, zombie or alive:
// when a plugin exits, its work is done and nothing it started is left.
func TestPluginsUnderPID1(t *testing.T) {
	for _, backend := range []string{"iptables", "nftables"} {
		t.Run(backend, func(t *testing.T) {
			h := nstest.New(t)
			r := startPID1(t, h)
			kubenet := h.Conflist(`{"cniVersion":"1.1.0","name":"@PREFIX@net","plugins":[
			 {"type":"bridge","bridge":"@PREFIX@br","isGateway":true,"isDefaultGateway":true,"ipMasq":true,"ipMasqBackend":"` + backend + `",
			  "ipam":{"type":"host-local","ranges":[[{"subnet":"10.79.0.0/24"}]],"dataDir":"@DATADIR@"}},
			 {"type":"portmap","backend":"` + backend + `","capabilities":{"portMappings":true}},
			 {"type":"bandwidth","capabilities":{"bandwidth":true}}]}`)
			lo := h.Conflist(`{"cniVersion":"1.1.0","name":"@PREFIX@lo","plugins":[{"type":"loopback"}]}`)
			caps := map[string]any{
				"portMappings": []map[string]any{{"protocol": "tcp", "hostPort": 18080, "containerPort": 80}},
				"bandwidth": map[string]any{"ingressRate": 10_000_000, "ingressBurst": containerdBurst,
					"egressRate": 20_000_000, "egressBurst": containerdBurst},
			}
			type pod struct {
				ns       ns.NetNS
				eth, loo *libcni.RuntimeConf
			}
			newPod := func() pod {
				p := h.NewPod()
				return pod{ns: p, eth: h.RT(p, "eth0", nstest.WithCaps(caps)), loo: h.RT(p, "lo")}
			}
			add := func(p pod) {
				r.must("ADD", lo, p.ns, p.loo)
				r.must("ADD", kubenet, p.ns, p.eth)
			}
			del := func(p pod) {
				r.must("DEL", kubenet, p.ns, p.eth)
				r.must("DEL", lo, p.ns, p.loo)
			}

			r.must("STATUS", kubenet, nil, nil)
			r.must("STATUS", lo, nil, nil)
			// A first pod makes the bridge and the node sysctls; the snapshot is taken
			// after it, so it must come back exactly at the end.
			warm := newPod()
			add(warm)
			waitLinkLocal(t, h, h.Name("br"))
			del(warm)
			settleBridge(t, h, h.Name("br"))
			before := h.Snapshot()

			p1, p2, p3 := newPod(), newPod(), newPod()
			add(p1)
			r.must("CHECK", kubenet, p1.ns, p1.eth)
			r.must("CHECK", lo, p1.ns, p1.loo)
			add(p2)
			// The runtime lost p2: GC with only p1 valid DELs it (libcni's cached
			// attachments) and runs every plugin's GC.
			r.must("GC", kubenet, nil, nil, types.GCAttachment{ContainerID: p1.eth.ContainerID, IfName: "eth0"})
			r.must("GC", lo, nil, nil, types.GCAttachment{ContainerID: p1.loo.ContainerID, IfName: "lo"})
			r.must("CHECK", kubenet, p1.ns, p1.eth)
			r.must("STATUS", kubenet, nil, nil)
			del(p1)
			del(p1) // a repeated DEL succeeds
			// A sandbox whose netns is already gone.
			add(p3)
			h.DeletePod(p3.ns)
			del(p3)
			h.DeletePod(p2.ns)
			r.must("GC", kubenet, nil, nil)
			r.must("GC", lo, nil, nil)
			r.must("STATUS", kubenet, nil, nil)

			if len(r.left) > 0 {
				zombies := 0
				for _, l := range r.left {
					if strings.HasSuffix(l, " Z") {
						zombies++
					}
				}
				t.Errorf("%d process(es) left in all (%d zombies):\n%s", len(r.left), zombies, strings.Join(r.left, "\n"))
			}
			t.Logf("%d libcni calls under a PID 1 that reaps only its own children; %d processes left", r.calls, len(r.left))
			settleBridge(t, h, h.Name("br"))
			h.RequireUnchanged(before)
		})
	}
}
