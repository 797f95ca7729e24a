// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/podwire/podwire/integration/nodestate"
	"github.com/podwire/podwire/integration/nstest"
)

// bandwidthConf is the intended chain: bridge + host-local, then bandwidth.
func bandwidthConf(h *nstest.H) *libcni.NetworkConfigList {
	return h.Conflist(`{"cniVersion":"1.1.0","name":"@PREFIX@net","plugins":[
	 {"type":"bridge","bridge":"@PREFIX@br","isGateway":true,
	  "ipam":{"type":"host-local","ranges":[[{"subnet":"10.23.0.0/24"}]],"dataDir":"@DATADIR@"}},
	 {"type":"bandwidth","capabilities":{"bandwidth":true}}]}`)
}

const containerdBurst = 4294967295

func withBandwidth(ingress, egress, burst uint64) func(*libcni.RuntimeConf) {
	bw := map[string]any{}
	if ingress != 0 {
		bw["ingressRate"], bw["ingressBurst"] = ingress, burst
	}
	if egress != 0 {
		bw["egressRate"], bw["egressBurst"] = egress, burst
	}
	return nstest.WithCaps(map[string]any{"bandwidth": bw})
}

// hostVeth is the host-side veth in an ADD result (the interface without a sandbox
// that is not the bridge or an IFB).
func hostVeth(t *testing.T, h *nstest.H, r *current.Result) string {
	t.Helper()
	for _, i := range r.Interfaces {
		if i.Sandbox == "" && strings.HasPrefix(i.Name, "veth") {
			return i.Name
		}
	}
	t.Fatalf("no host veth in result %+v", r.Interfaces)
	return ""
}

// ifbOf is the IFB bandwidth appended to the result, or "".
func ifbOf(r *current.Result) string {
	for _, i := range r.Interfaces {
		if i.Sandbox == "" && (strings.HasPrefix(i.Name, "pwb") || strings.HasPrefix(i.Name, "bwp")) {
			return i.Name
		}
	}
	return ""
}

func TestBandwidthLifecycle(t *testing.T) {
	h := nstest.New(t)
	list := bandwidthConf(h)
	warmUp(t, h, list)
	before := h.Snapshot()

	pod := h.NewPod()
	rt := h.RT(pod, "eth0", withBandwidth(10_000_000, 20_000_000, containerdBurst))
	res := h.MustAdd(list, rt)
	veth, ifb := hostVeth(t, h, res), ifbOf(res)
	if ifb == "" || len(ifb) != 15 {
		t.Fatalf("ADD result lacks the IFB: %+v", res.Interfaces)
	}
	q := h.Run(h.HostNS, "tc", "qdisc", "show", "dev", veth)
	for _, w := range []string{"qdisc tbf 1: root", "rate 10Mbit", "burst 62500b", "qdisc clsact ffff:"} {
		if !strings.Contains(q, w) {
			t.Errorf("host veth qdiscs lack %q:\n%s", w, q)
		}
	}
	if f := h.Run(h.HostNS, "tc", "filter", "show", "dev", veth, "ingress"); !strings.Contains(f, "pref 65000 u32") || !strings.Contains(f, "Egress Redirect to device "+ifb) {
		t.Errorf("no redirect to %s:\n%s", ifb, f)
	}
	l := h.Run(h.HostNS, "ip", "-d", "link", "show", ifb)
	for _, w := range []string{"mtu 1500", "ifb", ",UP", "alias podwire:" + list.Name + "/" + rt.ContainerID + "/eth0 dev=" + veth} {
		if !strings.Contains(l, w) {
			t.Errorf("IFB lacks %q:\n%s", w, l)
		}
	}
	if q := h.Run(h.HostNS, "tc", "qdisc", "show", "dev", ifb); !strings.Contains(q, "rate 20Mbit") || !strings.Contains(q, "burst 125000b") {
		t.Errorf("IFB qdisc:\n%s", q)
	}
	t.Logf("ADD: %s root TBF 10 Mbit/s, redirect to %s with TBF 20 Mbit/s", veth, ifb)

	if err := h.Check(list, rt); err != nil {
		t.Fatalf("CHECK after ADD: %v", err)
	}
	// CHECK notices a changed qdisc, and names it.
	h.Run(h.HostNS, "tc", "qdisc", "change", "dev", ifb, "root", "handle", "1:", "tbf", "rate", "30mbit", "burst", "125000", "limit", "250000", "peakrate", "60mbit", "mtu", "62500")
	if err := h.Check(list, rt); err == nil || !strings.Contains(err.Error(), ifb) || !strings.Contains(err.Error(), "rate 30000000bit") {
		t.Errorf("CHECK after changing the IFB's TBF: %v", err)
	}
	// ...and a redirect taken away.
	h.Run(h.HostNS, "tc", "filter", "del", "dev", veth, "ingress", "pref", "65000")
	if err := h.Check(list, rt); err == nil || !strings.Contains(err.Error(), "no filter redirecting") {
		t.Errorf("CHECK without the redirect: %v", err)
	}
	t.Log("CHECK catches a changed TBF and a missing redirect")

	h.MustDel(list, rt)
	if out, err := nstest.RunIn(h.HostNS, "ip", "link", "show", ifb); err == nil {
		t.Errorf("IFB left after DEL:\n%s", out)
	}
	h.MustDel(list, rt)
	h.DeletePod(pod)
	h.MustDel(list, rt)
	t.Log("DEL again, and with the netns gone, succeed")
	if err := h.Status(list); err != nil {
		t.Errorf("STATUS: %v", err)
	}
	requireClean(t, h, before)
}

// TestBandwidthCoexistDel: a filter another tc user put on the host veth's ingress
// next to podwire's redirect is still there after podwire's DEL (with its clsact).
func TestBandwidthCoexistDel(t *testing.T) {
	h := nstest.New(t)
	// Only bandwidth's DEL runs here: the veth must outlive it to be inspected, so the
	// list holds bridge for ADD and a bandwidth-only list is used for DEL.
	list := bandwidthConf(h)
	warmUp(t, h, list)
	before := h.Snapshot()
	pod := h.NewPod()
	rt := h.RT(pod, "eth0", withBandwidth(0, 10_000_000, 0))
	res := h.MustAdd(list, rt)
	veth, ifb := hostVeth(t, h, res), ifbOf(res)
	h.Run(h.HostNS, "tc", "filter", "add", "dev", veth, "ingress", "pref", "1", "protocol", "ip", "u32", "match", "ip", "dst", "10.9.9.9/32", "flowid", "1:1")
	bwOnly := h.Conflist(`{"cniVersion":"1.1.0","name":"@PREFIX@net","plugins":[{"type":"bandwidth","capabilities":{"bandwidth":true}}]}`)
	h.MustDel(bwOnly, rt)
	f := h.Run(h.HostNS, "tc", "filter", "show", "dev", veth, "ingress")
	if !strings.Contains(f, "pref 1 u32") || strings.Contains(f, "pref 65000") {
		t.Errorf("after bandwidth's DEL, ingress filters are:\n%s", f)
	}
	if q := h.Run(h.HostNS, "tc", "qdisc", "show", "dev", veth); !strings.Contains(q, "clsact") {
		t.Errorf("their filter's clsact went away:\n%s", q)
	}
	if out, err := nstest.RunIn(h.HostNS, "ip", "link", "show", ifb); err == nil {
		t.Errorf("IFB left after DEL:\n%s", out)
	}
	h.MustDel(list, rt)
	requireClean(t, h, before)
}

// TestBandwidthNoRequest: without annotations the chain works and bandwidth leaves
// no trace: no IFB, no qdisc beyond the veth's default.
func TestBandwidthNoRequest(t *testing.T) {
	h := nstest.New(t)
	list := bandwidthConf(h)
	warmUp(t, h, list)
	before := h.Snapshot()
	pod := h.NewPod()
	rt := h.RT(pod, "eth0")
	res := h.MustAdd(list, rt)
	veth := hostVeth(t, h, res)
	if ifbOf(res) != "" {
		t.Errorf("IFB in result without a request: %+v", res.Interfaces)
	}
	if q := h.Run(h.HostNS, "tc", "qdisc", "show", "dev", veth); strings.Contains(q, "tbf") || strings.Contains(q, "clsact") {
		t.Errorf("qdiscs without a request:\n%s", q)
	}
	if err := h.Check(list, rt); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	h.MustDel(list, rt)
	requireClean(t, h, before)
}

// TestBandwidthTwoInterfaces: two interfaces of one pod get two IFBs (the reference
// plugin gives both the same name), and DEL of one leaves the other intact.
func TestBandwidthTwoInterfaces(t *testing.T) {
	h := nstest.New(t)
	list := bandwidthConf(h)
	warmUp(t, h, list)
	before := h.Snapshot()
	pod := h.NewPod()
	rt0 := h.RT(pod, "eth0", withBandwidth(0, 10_000_000, 0))
	rt1 := h.RT(pod, "net1", withBandwidth(0, 20_000_000, 0))
	r0, r1 := h.MustAdd(list, rt0), h.MustAdd(list, rt1)
	if a, b := ifbOf(r0), ifbOf(r1); a == "" || a == b {
		t.Fatalf("IFBs %q and %q", a, b)
	}
	h.MustDel(list, rt0)
	if err := h.Check(list, rt1); err != nil {
		t.Errorf("CHECK of net1 after DEL of eth0: %v", err)
	}
	h.MustDel(list, rt1)
	requireClean(t, h, before)
}

// TestBandwidthGC: GC deletes exactly the IFBs of attachments missing from
// cni.dev/valid-attachments, and takes their redirects off veths still there.
func TestBandwidthGC(t *testing.T) {
	h := nstest.New(t)
	list := bandwidthConf(h)
	warmUp(t, h, list)
	before := h.Snapshot()
	var rts []*libcni.RuntimeConf
	var ifbs []string
	for range 3 {
		p := h.NewPod()
		rt := h.RT(p, "eth0", withBandwidth(10_000_000, 10_000_000, 0))
		ifbs = append(ifbs, ifbOf(h.MustAdd(list, rt)))
		rts = append(rts, rt)
	}
	if err := h.GC(list, []types.GCAttachment{{ContainerID: rts[1].ContainerID, IfName: "eth0"}}); err != nil {
		t.Fatalf("GC: %v", err)
	}
	links := h.Run(h.HostNS, "ip", "-o", "link", "show", "type", "ifb")
	for i, ifb := range ifbs {
		if got, want := strings.Contains(links, ifb+":"), i == 1; got != want {
			t.Errorf("after GC, IFB %s (pod %d) present=%v, want %v:\n%s", ifb, i, got, want, links)
		}
	}
	if err := h.Check(list, rts[1]); err != nil {
		t.Errorf("CHECK of the listed attachment after GC: %v", err)
	}
	// The unlisted pods' veths carry nothing of ours any more (bridge's own GC is not
	// bandwidth's business; the runtime DELs them).
	for _, i := range []int{0, 2} {
		if err := h.Check(list, rts[i]); err == nil {
			t.Errorf("CHECK of collected attachment %d passed", i)
		}
	}
	for _, rt := range rts {
		h.MustDel(list, rt)
	}
	requireClean(t, h, before)
}

// TestBandwidthBadConfig: invalid values fail ADD with code 7 before bandwidth creates
// anything; the runtime's DEL then cleans up the rest of the chain.
func TestBandwidthBadConfig(t *testing.T) {
	h := nstest.New(t)
	list := bandwidthConf(h)
	warmUp(t, h, list)
	before := h.Snapshot()
	for _, bw := range []map[string]any{
		{"ingressRate": -1},
		{"egressRate": 2_000_000_000_000},
		{"egressRate": "10M"},
		{"egressRate": 1_000_000, "egressBurst": 1.5},
		{"ingressBurst": 1000},
	} {
		t.Run(fmt.Sprint(bw), func(t *testing.T) {
			pod := h.NewPod()
			rt := h.RT(pod, "eth0", nstest.WithCaps(map[string]any{"bandwidth": bw}))
			_, err := h.Add(list, rt)
			var e *types.Error
			if !errors.As(err, &e) || e.Code != 7 {
				t.Fatalf("ADD: %v, want a code-7 error", err)
			}
			t.Logf("ADD: %v", err)
			if out := h.Run(h.HostNS, "tc", "qdisc", "show"); strings.Contains(out, "tbf") || strings.Contains(out, "clsact") {
				t.Errorf("a rejected ADD created qdiscs:\n%s", out)
			}
			if out := h.Run(h.HostNS, "ip", "-o", "link", "show", "type", "ifb"); strings.TrimSpace(out) != "" {
				t.Errorf("a rejected ADD created an IFB:\n%s", out)
			}
			h.MustDel(list, rt)
		})
	}
	requireClean(t, h, before)
}

// TestBandwidthShaping is the acceptance measurement: iperf3 between a shaped pod and
// an unshaped pod on the same bridge, both directions, at 10 and 100 Mbit/s, with
// containerd's burst (2^32-1 bits) and with burst 0. Every 1-second interval (the
// first included) must be within ±10% of the rate and the average within ±5%; at
// 10 Mbit/s pings to the saturated pod must stay below 30 ms.
func TestBandwidthShaping(t *testing.T) {
	h := nstest.New(t)
	list := bandwidthConf(h)
	warmUp(t, h, list)
	before := h.Snapshot()
	peer := h.NewPod()
	peerRT := h.RT(peer, "eth0")
	peerIP := addrOf(t, h.MustAdd(list, peerRT), false)
	for _, c := range []struct {
		rate, burst uint64
	}{{10_000_000, containerdBurst}, {10_000_000, 0}, {100_000_000, containerdBurst}, {100_000_000, 0}} {
		t.Run(fmt.Sprintf("%dMbit-burst%d", c.rate/1_000_000, c.burst), func(t *testing.T) {
			pod := h.NewPod()
			rt := h.RT(pod, "eth0", withBandwidth(c.rate, c.rate, c.burst))
			podIP := addrOf(t, h.MustAdd(list, rt), false)
			defer h.MustDel(list, rt)
			want := float64(c.rate)
			var in, out throughput
			rtts, sent := pingDuring(t, peer, podIP, 10, func() { in = iperf(t, h, pod, peer, peerIP, true, 4) })
			t.Logf("into the pod:   %s; ping under load %v ms", in, rtts)
			requireRate(t, "into the pod", in, want)
			rtts2, sent2 := pingDuring(t, peer, podIP, 10, func() { out = iperf(t, h, pod, peer, peerIP, false, 4) })
			t.Logf("out of the pod: %s; ping under load %v ms", out, rtts2)
			requireRate(t, "out of the pod", out, want)
			if c.rate == 10_000_000 {
				requirePing(t, "into the pod", rtts, sent, 30)
				requirePing(t, "out of the pod", rtts2, sent2, 30)
			}
		})
	}
	h.MustDel(list, peerRT)
	requireClean(t, h, before)
}

// requireClean waits for the bridge to notice it has no ports left, then requires the
// node state to be exactly as before.
func requireClean(t *testing.T, h *nstest.H, before nodestate.Snapshot) {
	t.Helper()
	settleBridge(t, h, h.Name("br"))
	h.RequireUnchanged(before)
}

// referenceBandwidth returns the reference bandwidth plugin.
func referenceBandwidth(t *testing.T) string {
	return filepath.Join(referenceDir(t, "bandwidth"), "bandwidth")
}

// mixedSetup is a warmed-up bandwidth network, a libcni client whose CNI_PATH finds
// the reference bandwidth plugin first (podwire's bridge and host-local after it), the
// node snapshot, and a pod's runtime config asking 10 Mbit/s both ways.
func mixedSetup(t *testing.T) (*nstest.H, *libcni.CNIConfig, *libcni.NetworkConfigList, nodestate.Snapshot, *libcni.RuntimeConf) {
	h := nstest.New(t)
	ref := t.TempDir()
	if err := os.Symlink(referenceBandwidth(t), filepath.Join(ref, "bandwidth")); err != nil {
		t.Fatal(err)
	}
	refCNI := libcni.NewCNIConfigWithCacheDir([]string{ref, h.BinDir}, t.TempDir(), nil)
	list := bandwidthConf(h)
	warmUp(t, h, list)
	before := h.Snapshot()
	rt := h.RT(h.NewPod(), "eth0", withBandwidth(10_000_000, 10_000_000, containerdBurst))
	return h, refCNI, list, before, rt
}

// TestBandwidthDowngradeToReference: a pod shaped by podwire, deleted after the node
// switched back to the reference bandwidth plugin, leaves nothing behind: its IFB has
// the name the reference's DEL deletes.
func TestBandwidthDowngradeToReference(t *testing.T) {
	h, refCNI, list, before, rt := mixedSetup(t)
	ifb := ifbOf(h.MustAdd(list, rt))
	if !strings.HasPrefix(ifb, "bwp") {
		t.Fatalf("the pod's IFB is %q, not the reference's name", ifb)
	}
	if err := h.DelWith(refCNI, list, rt); err != nil {
		t.Fatalf("DEL with the reference bandwidth: %v", err)
	}
	if out := h.Run(h.HostNS, "ip", "-o", "link", "show", "type", "ifb"); strings.TrimSpace(out) != "" {
		t.Errorf("IFB left after the reference's DEL:\n%s", out)
	}
	requireClean(t, h, before)
}

// TestBandwidthUpgradeFromReference: a pod shaped by the reference plugin (IFB bwp…,
// ingress qdisc, u32 redirect at pref 1, root TBF) is cleaned up completely by
// podwire's DEL after an upgrade.
func TestBandwidthUpgradeFromReference(t *testing.T) {
	h, refCNI, list, before, rt := mixedSetup(t)
	var res types.Result
	if err := h.InHost(func() error {
		var err error
		res, err = refCNI.AddNetworkList(context.Background(), list, rt)
		return err
	}); err != nil {
		t.Fatalf("ADD with the reference bandwidth: %v", err)
	}
	r, err := current.NewResultFromResult(res)
	if err != nil {
		t.Fatal(err)
	}
	veth := hostVeth(t, h, r)
	if out := h.Run(h.HostNS, "ip", "-o", "link", "show", "type", "ifb"); !strings.Contains(out, "bwp") {
		t.Fatalf("the reference created no bwp IFB:\n%s", out)
	}
	bwOnly := h.Conflist(`{"cniVersion":"1.1.0","name":"@PREFIX@net","plugins":[{"type":"bandwidth","capabilities":{"bandwidth":true}}]}`)
	h.MustDel(bwOnly, rt)
	if out := h.Run(h.HostNS, "ip", "-o", "link", "show", "type", "ifb"); strings.TrimSpace(out) != "" {
		t.Errorf("IFB left after podwire's DEL:\n%s", out)
	}
	if q := h.Run(h.HostNS, "tc", "qdisc", "show", "dev", veth); strings.Contains(q, "tbf") || strings.Contains(q, "ingress") {
		t.Errorf("qdiscs left on %s after podwire's DEL:\n%s", veth, q)
	}
	h.MustDel(list, rt)
	requireClean(t, h, before)
}
