// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/podwire/podwire/integration/containerd"
	"github.com/podwire/podwire/integration/nodestate"
	"github.com/podwire/podwire/integration/nstest"
	"github.com/podwire/podwire/pkg/agent/cri"
	"github.com/podwire/podwire/pkg/agent/gc"
)

// TestContainerdAgentGC is the agent's GC driver (pkg/agent/gc with the agent's CRI
// client, pkg/agent/cri) against a real CRI runtime: a private containerd in the
// test's node netns, a pod that keeps running and a pod whose sandbox containerd
// forgets without CNI DEL (leakSandbox). The driver lists the sandboxes over
// containerd's CRI socket, builds the valid attachments from them and libcni's cache,
// and runs the chain's GC, in the node netns as the agent (hostNetwork) does. A run
// while both pods live must change nothing; the first run after the leak must reclaim
// the leaked pod's lease, host veth, IFB, rules and cache entry, leaving the node
// exactly as before that pod with the running pod untouched. podwire-agent runs this
// driver at startup and every --gc-period, so a leak is gone within one period; the
// binary itself needs an API server (it has no mode without one), so its periodic
// loop is TestAgentGCWithContainerd (agent_cluster_gc_test.go).
func TestContainerdAgentGC(t *testing.T) {
	nstest.RequireRoot(t)
	forEachContainerd(t, testContainerdAgentGC)
}

func testContainerdAgentGC(t *testing.T, rt containerd.Runtime) {
	h := nstest.New(t)
	repo, err := nstest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	conf := loadKubenetExample(t, h, repo)
	confDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(confDir, "10-kubenet.conflist"), conf.raw, 0o644); err != nil {
		t.Fatal(err)
	}
	list, err := libcni.ConfListFromBytes(conf.raw)
	if err != nil {
		t.Fatal(err)
	}
	d := containerd.Start(t, containerd.Options{
		NetNS: h.HostNS.Path(), CNIBinDir: h.BinDir, CNIConfDir: confDir, Dir: t.TempDir(), Repo: repo, Runtime: rt,
	})
	requireCRIReady(t, d)
	client, err := cri.Dial(d.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	// The agent's wiring (cmd/podwire-agent's run and Agent.RunGC): libcni with the
	// runtime's result cache, the plugins in the CNI bin dir, sandboxes over CRI.
	cni := libcni.NewCNIConfigWithCacheDir([]string{h.BinDir}, e2eLibcniCache, nil)
	driver := &gc.Driver{CNI: cni,
		Counter: gc.HostCounter{DataDir: h.DataDir, CNI: cni, Links: gc.BridgeLinks(conf.bridge)},
		Sandboxes: func(ctx context.Context) ([]string, error) {
			sbs, err := client.Sandboxes(ctx)
			var ids []string
			for _, s := range sbs {
				ids = append(ids, s.ID)
			}
			return ids, err
		}}
	runGC := func() gc.Result {
		t.Helper()
		var res gc.Result
		err := h.InHost(func() error {
			var err error
			res, err = driver.Run(context.Background(), list)
			return err
		})
		if err != nil {
			t.Fatalf("GC driver: %v", err)
		}
		return res
	}

	liveID := runPod(t, d, "live", conf)
	livePod, err := d.InspectPod(liveID)
	if err != nil || livePod.Status.Network.IP == "" {
		t.Fatalf("live pod: %+v, %v; want an IP", livePod, err)
	}
	liveIP := livePod.Status.Network.IP
	waitNoTentative(t, h)
	before := settledSnapshot(t, h)
	leakID := runPod(t, d, "leak", conf)
	waitNoTentative(t, h)
	both := settledSnapshot(t, h)
	if res := runGC(); res.Stale != 0 || res.Valid < 2 {
		t.Fatalf("GC with both pods live: %+v; want both valid and nothing stale", res)
	}
	requireSettledUnchanged(t, h, both)
	t.Logf("check: GC driver with pods %s and %s live (listed over CRI): both attachments valid, node unchanged", short(liveID), short(leakID))

	l := leakSandbox(t, h, d, conf, leakID)
	diff := requireLeaked(t, h, conf.network, l, before)
	t.Logf("check: %s forgot sandbox %s without CNI DEL (pause killed; task, container and sandbox record deleted with ctr; containerd restarted); left on the node:\n%s",
		rt.Name, short(leakID), diff)

	res := runGC()
	if res.Stale != 1 || res.Reclaimed["lease"] != 1 || res.Reclaimed["veth"] != 1 || res.Reclaimed["ifb"] != 1 || res.Reclaimed["attachment"] != 1 {
		t.Errorf("GC after the leak: %+v; want 1 stale attachment and 1 lease, veth, IFB and cache entry reclaimed", res)
	}
	took := waitReclaimed(t, h, conf.network, l, before, 10*time.Second)
	t.Logf("check: one GC run (valid %d, stale %d, reclaimed %v) removed everything the leaked pod left; node as before it %s after the run",
		res.Valid, res.Stale, res.Reclaimed, took.Round(time.Millisecond))

	// This driver has no Networks: containerd's own loopback network (cni-loopback) is
	// left to the agent, which GCs the networks containerd reports
	// (TestAgentGCWithContainerd). Loopback made nothing outside the pod's netns, so
	// its cache file is all that is left here.
	if left := libcniCacheFiles(leakID); len(left) > 0 {
		t.Logf("note: libcni cache entries of the leaked sandbox outside network %s stay: %v", conf.network, left)
	}

	pod, err := d.InspectPod(liveID)
	if err != nil || pod.Status.State != "SANDBOX_READY" {
		t.Fatalf("live pod after GC: %+v, %v", pod, err)
	}
	liveNS, err := ns.GetNS(fmt.Sprintf("/proc/%d/ns/net", pod.Info.Pid))
	if err != nil {
		t.Fatal(err)
	}
	defer liveNS.Close()
	h.MustPing(liveNS, conf.gateway.String())
	if b, err := os.ReadFile(filepath.Join(h.DataDir, conf.network, liveIP)); err != nil || !strings.Contains(string(b), liveID) {
		t.Fatalf("live pod's lease of %s: %q, %v; want it to name sandbox %s", liveIP, b, err, liveID)
	}
	t.Logf("check: live pod %s still SANDBOX_READY, holds its lease of %s and pings its gateway", short(liveID), liveIP)
}

// leakedPod is a sandbox the CRI runtime forgot without running CNI DEL.
type leakedPod struct {
	id       string
	ip       string
	hostVeth string
	netns    ns.NetNS // the pod netns, pinned as its leftover /var/run/netns file pins it on a node
}

// leakSandbox makes containerd forget sandbox id without CNI DEL, the way sandboxes
// leak on nodes: the pod's processes die (an OOM kill, a crash of the shim), and
// containerd's record of the sandbox goes (here with ctr, as an operator cleaning up
// by hand or a crash that lost containerd's metadata would), so that after a restart
// the CRI plugin recovers every sandbox but this one, and kubelet never asks for its
// StopPodSandbox. The pod's netns file stays mounted on a node (containerd mounts it
// under /var/run/netns, outside any process), so the netns and the pod's veth survive;
// the test holds the netns open for the same effect. What the plugins made for the
// pod outside its netns (lease, host veth, IFB, hostPort and masquerade rules,
// libcni's cache entry) is left behind.
func leakSandbox(t *testing.T, h *nstest.H, d *containerd.Daemon, conf *kubenetConf, id string) *leakedPod {
	t.Helper()
	pod, err := d.InspectPod(id)
	if err != nil {
		t.Fatal(err)
	}
	podNS, err := ns.GetNS(fmt.Sprintf("/proc/%d/ns/net", pod.Info.Pid))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { podNS.Close() })
	peer := checkPodInterfaces(t, podNS, net.ParseIP(pod.Status.Network.IP))
	l := &leakedPod{id: id, ip: pod.Status.Network.IP, netns: podNS, hostVeth: checkHostVeth(t, h, peer, conf.bridge)}
	// Whatever the test's outcome, libcni's cache entries of the leaked sandbox go with it.
	t.Cleanup(func() {
		for _, f := range libcniCacheFiles(id) {
			_ = os.Remove(f)
		}
	})

	if err := syscall.Kill(pod.Info.Pid, syscall.SIGKILL); err != nil {
		t.Fatalf("killing pod %s's pause (pid %d): %v", short(id), pod.Info.Pid, err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if p, err := d.InspectPod(id); err == nil && p.Status.State == "SANDBOX_NOTREADY" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s still not SANDBOX_NOTREADY 30s after its pause was killed", short(id))
		}
	}
	// containerd's record of the sandbox: its container (task first, when the CRI
	// plugin has not deleted the exited task itself), and in containerd 2.x also its
	// entry in the sandbox store, which the CRI plugin recovers sandboxes from too.
	// `ctr sandboxes rm` goes through the pod sandbox controller's Stop and Shutdown,
	// which stop and delete the task and container; CNI teardown is only in the CRI
	// plugin's StopPodSandbox, which nothing calls.
	if d.Runtime.ConfigVersion >= 3 {
		if _, err := d.Ctr("sandboxes", "rm", "--force", id); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := d.Ctr("tasks", "delete", "--force", id); err != nil && !strings.Contains(out, "not found") {
		t.Fatal(err)
	}
	if out, err := d.Ctr("containers", "delete", id); err != nil && !strings.Contains(out, "not found") {
		t.Fatal(err)
	}
	for _, what := range []string{"containers", "sandboxes"} {
		if what == "sandboxes" && d.Runtime.ConfigVersion < 3 {
			continue // containerd 1.6 has no sandbox store
		}
		if out, err := d.Ctr(what, "ls"); err != nil || strings.Contains(out, id) {
			t.Fatalf("ctr %s ls: %v; still lists %s:\n%s", what, err, short(id), out)
		}
	}
	d.Restart()
	if out := d.MustCrictl("pods", "-q"); strings.Contains(out, id) {
		t.Fatalf("after a restart containerd still lists sandbox %s:\n%s", short(id), out)
	}
	return l
}

// requireLeaked checks that the leaked pod's objects are still on the node: the lease,
// the host veth, libcni's cache entry, and a difference to the snapshot before the pod.
func requireLeaked(t *testing.T, h *nstest.H, network string, l *leakedPod, before nodestate.Snapshot) string {
	t.Helper()
	if _, err := os.Stat(filepath.Join(h.DataDir, network, l.ip)); err != nil {
		t.Fatalf("leaked pod's lease of %s: %v; want it left behind", l.ip, err)
	}
	if _, err := netlinkInHost(h, func() (netlink.Link, error) { return netlink.LinkByName(l.hostVeth) }); err != nil {
		t.Fatalf("leaked pod's host veth %s: %v; want it left behind", l.hostVeth, err)
	}
	if len(libcniCacheFiles(l.id)) == 0 {
		t.Fatalf("leaked pod %s has no libcni cache entry in %s", short(l.id), e2eLibcniCache)
	}
	diff := nodestate.Diff(before, h.Snapshot())
	if diff == "" {
		t.Fatalf("the leaked pod left nothing on the node")
	}
	return diff
}

// waitReclaimed waits until the node is as before the leaked pod (links, addresses,
// routes, iptables, nftables, qdiscs, filters, sysctls, leases) and libcni's cache
// has no entry of it in network, and returns how long that took.
func waitReclaimed(t *testing.T, h *nstest.H, network string, l *leakedPod, before nodestate.Snapshot, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	var diff string
	for time.Since(start) < timeout {
		if diff = nodestate.Diff(before, h.Snapshot()); diff == "" && len(networkCacheFiles(network, l.id)) == 0 {
			return time.Since(start)
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("%s after the leak the node still differs from before it (- before, + now), libcni cache %v:\n%s",
		timeout, networkCacheFiles(network, l.id), diff)
	return 0
}

// networkCacheFiles lists libcni's cached results of sandbox id in network.
func networkCacheFiles(network, id string) []string {
	m, _ := filepath.Glob(filepath.Join(e2eLibcniCache, "results", network+"-"+id+"-*"))
	return m
}
