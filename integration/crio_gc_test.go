// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/vishvananda/netlink"

	"github.com/podwire/podwire/integration/crio"
	"github.com/podwire/podwire/integration/nodestate"
	"github.com/podwire/podwire/integration/nstest"
	"github.com/podwire/podwire/pkg/agent/cri"
	"github.com/podwire/podwire/pkg/agent/gc"
)

// crioLeak makes CRI-O lose pod id while it is down, the way a node loses a pod across
// a runtime restart: CRI-O is stopped, and the sandbox's spec in its storage
// (overlay-containers/<id>/userdata/config.json, which CRI-O restores sandboxes from)
// is gone, so at its next start CRI-O cannot restore the pod, deletes what is left of
// it from storage and never sends it a DEL itself. The pod's netns stays mounted, as
// pinns' mounts do on a node, so its veth survives too; what the plugins made for it
// outside the netns (lease, host veth, IFB, libcni cache entry) is left to GC. With
// dropCache the libcni cache entry goes too (a lost /var/lib/cni/results). It returns
// what the pod had. With dropNetns the pod's netns mount goes as well (and the kernel
// destroys the netns and its veth pair with it), as a pod killed with its namespaces.
func crioLeak(t *testing.T, h *nstest.H, d *crio.Daemon, conf *crioConf, id string, dropCache, dropNetns bool) *leakedPod {
	t.Helper()
	p, podNS := crioPodNS(t, d, id)
	l := &leakedPod{id: id, ip: p.Status.Network.IP, netns: podNS,
		hostVeth: checkHostVeth(t, h, checkPodInterfaces(t, podNS, net.ParseIP(p.Status.Network.IP)), conf.bridge)}
	t.Cleanup(func() {
		for _, f := range libcniCacheFiles(id) {
			_ = os.Remove(f)
		}
	})
	d.Stop()
	spec := filepath.Join(d.Root, "overlay-containers", id, "userdata", "config.json")
	if err := os.Remove(spec); err != nil {
		t.Fatalf("removing sandbox %s's spec from CRI-O's storage: %v", short(id), err)
	}
	if dropNetns {
		podNS.Close() // an open file of the netns would keep its mount busy
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, args := range [][]string{{"umount", p.NetNS()}, {"rm", "-f", p.NetNS()}} {
			if out, err := d.InMountNS(ctx, args[0], args[1:]...).CombinedOutput(); err != nil {
				t.Fatalf("%v in CRI-O's mount namespace: %v %s", args, err, out)
			}
		}
	}
	if dropCache {
		for _, f := range libcniCacheFiles(id) {
			if err := os.Remove(f); err != nil {
				t.Fatal(err)
			}
		}
	}
	d.StartAgain()
	if out := d.MustCrictl("pods", "-q"); strings.Contains(out, id) {
		t.Fatalf("CRI-O restored sandbox %s without its spec:\n%s", short(id), out)
	}
	return l
}

// TestCRIOStartupGC: a pod CRI-O loses while it is down is reclaimed by CRI-O's own
// startup GC (libcni's GCNetworkList over its network name: DEL of the cached
// attachment, then GC to every plugin at 1.1.0 with the live pod as the valid
// attachment), leaving the node exactly as before that pod; the live pod keeps
// everything.
func TestCRIOStartupGC(t *testing.T) {
	h := nstest.New(t)
	repo, err := nstest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	conf := crioKubenet(t, h, repo, "1.1.0", nil)
	d := startCRIO(t, h, repo, conf, crio.Options{})
	crioWaitNetwork(t, d, true, 30*time.Second)
	liveID := crioRun(t, d, "live", nil)
	waitNoTentative(t, h)
	before := settledSnapshot(t, h)
	leakID := crioRun(t, d, "leak", map[string]any{"annotations": map[string]string{
		"kubernetes.io/ingress-bandwidth": e2eBandwidth, "kubernetes.io/egress-bandwidth": e2eBandwidth,
	}})
	n := len(cniCalls(t, conf))
	start := time.Now()
	l := crioLeak(t, h, d, conf, leakID, false, false)
	took := waitReclaimed(t, h, conf.network, l, before, 20*time.Second)
	calls := cniCalls(t, conf)[n:]
	dels := verbs(calls, leakID)
	if strings.Join(dels, ", ") != "bandwidth DEL, portmap DEL, bridge DEL" {
		t.Errorf("CRI-O's startup GC sent the lost pod %v; want bandwidth DEL, portmap DEL, bridge DEL", dels)
	}
	var gcs []string
	for _, c := range calls {
		if c.verb == "GC" {
			gcs = append(gcs, c.plugin+" GC "+c.msg)
		}
	}
	if len(gcs) < 3 {
		t.Errorf("CRI-O's startup GC sent GC to %v; want every plugin", gcs)
	}
	if !strings.Contains(d.Log(), "Could not restore sandbox "+leakID) {
		t.Errorf("CRI-O's log does not say it could not restore %s", short(leakID))
	}
	t.Logf("check: CRI-O could not restore pod %s after its restart; its startup GC sent %s, then %s; node as before the pod %s after the restart began (%s after CRI-O answered)",
		short(leakID), strings.Join(dels, ", "), strings.Join(gcs, ", "), time.Since(start).Round(100*time.Millisecond), took.Round(100*time.Millisecond))
	requireLive(t, h, d, conf, liveID)
}

// requireLive checks that pod id is SANDBOX_READY, holds its lease and pings its gateway.
func requireLive(t *testing.T, h *nstest.H, d *crio.Daemon, conf *crioConf, id string) {
	t.Helper()
	p, podNS := crioPodNS(t, d, id)
	if p.Status.State != "SANDBOX_READY" {
		t.Fatalf("live pod %s: %s", short(id), p.Status.State)
	}
	if b, err := os.ReadFile(filepath.Join(h.DataDir, conf.network, p.Status.Network.IP)); err != nil || !strings.Contains(string(b), id) {
		t.Fatalf("live pod's lease of %s: %q, %v", p.Status.Network.IP, b, err)
	}
	h.MustPing(podNS, conf.gateway.String())
	t.Logf("check: live pod %s still SANDBOX_READY, holds its lease of %s and pings its gateway", short(id), p.Status.Network.IP)
}

// TestCRIOAgentGC is the agent's GC driver (pkg/agent/gc with the agent's CRI client,
// as cmd/podwire-agent --cri-socket wires it) over CRI-O's socket while CRI-O runs,
// for what CRI-O's startup GC cannot see: a conflist at cniVersion 1.0.0 (libcni then
// sends no GC verb) and a pod lost with its netns and its libcni cache entry, so
// CRI-O's GC has nothing to DEL. The lease, IFB and masquerade rule stay after CRI-O's
// restart (the veth pair went with the netns); one run of the driver (which runs GC
// at 1.1.0 whatever the conflist says, with CRI-O's sandboxes as the valid
// attachments) reclaims them, leaving the live pod alone.
func TestCRIOAgentGC(t *testing.T) {
	h := nstest.New(t)
	repo, err := nstest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	conf := crioKubenet(t, h, repo, "1.0.0", nil)
	list, err := libcni.ConfListFromBytes(conf.raw)
	if err != nil {
		t.Fatal(err)
	}
	d := startCRIO(t, h, repo, conf, crio.Options{})
	crioWaitNetwork(t, d, true, 30*time.Second)
	client, err := cri.Dial(d.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	name, ver, err := client.Version(context.Background())
	if err != nil {
		t.Fatal(err)
	}
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
		if err := h.InHost(func() error {
			var err error
			res, err = driver.Run(context.Background(), list)
			return err
		}); err != nil {
			t.Fatalf("GC driver: %v", err)
		}
		return res
	}

	liveID := crioRun(t, d, "live", nil)
	waitNoTentative(t, h)
	before := settledSnapshot(t, h)
	leakID := crioRun(t, d, "leak", map[string]any{"annotations": map[string]string{
		"kubernetes.io/ingress-bandwidth": e2eBandwidth, "kubernetes.io/egress-bandwidth": e2eBandwidth,
	}})
	both := settledSnapshot(t, h)
	if res := runGC(); res.Stale != 0 || res.Valid < 2 || len(res.Reclaimed) > 0 && sum(res.Reclaimed) > 0 {
		t.Fatalf("GC with both pods live: %+v; want both valid and nothing reclaimed", res)
	}
	requireSettledUnchanged(t, h, both)
	t.Logf("check: the GC driver over %s %s's socket with pods %s and %s live: both valid, node unchanged", name, ver, short(liveID), short(leakID))

	l := crioLeak(t, h, d, conf, leakID, true, true)
	time.Sleep(2 * time.Second) // CRI-O's startup GC runs once STATUS passes; give it its chance
	if _, err := os.Stat(filepath.Join(h.DataDir, conf.network, l.ip)); err != nil {
		t.Fatalf("the lost pod's lease of %s: %v; want CRI-O's GC to have left it (1.0.0, no cache entry)", l.ip, err)
	}
	if _, err := netlinkInHost(h, func() (netlink.Link, error) { return netlink.LinkByName(l.hostVeth) }); err == nil {
		t.Fatalf("the lost pod's host veth %s outlived its netns", l.hostVeth)
	}
	diff := nodestate.Diff(before, h.Snapshot())
	if !strings.Contains(diff, "ifb") || !strings.Contains(diff, l.ip) {
		t.Fatalf("the lost pod left no IFB and lease on the node:\n%s", diff)
	}
	t.Logf("check: CRI-O restarted without pod %s (its spec, netns and libcni cache entry gone; the veth pair went with the netns); its startup GC at 1.0.0 left:\n%s", short(leakID), diff)

	res := runGC()
	if res.Reclaimed["lease"] != 1 || res.Reclaimed["ifb"] != 1 {
		t.Errorf("GC driver after the loss: %+v; want 1 lease and 1 IFB reclaimed", res)
	}
	took := waitReclaimed(t, h, conf.network, l, before, 10*time.Second)
	t.Logf("check: one run of the agent's GC driver while CRI-O runs (valid %d, stale %d, reclaimed %v) left the node as before the lost pod, %s after the run",
		res.Valid, res.Stale, res.Reclaimed, took.Round(time.Millisecond))
	requireLive(t, h, d, conf, liveID)
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
