// SPDX-License-Identifier: Apache-2.0

package main

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/tc"
)

var owner = cniplumb.Owner{Network: "k8s-pod-network", ContainerID: "0123456789abcdef", IfName: "eth0"}

func TestPlanShaping(t *testing.T) {
	req := Request{Ingress: Direction{10_000_000, 4294967295}, Egress: Direction{100_000_000, 0}}
	ifb := referenceIFBName(owner.Network, owner.ContainerID)
	p, err := planShaping(owner, req, "veth1234", ifb, 1500)
	if err != nil {
		t.Fatal(err)
	}
	want := strings.ReplaceAll(`dev veth1234 root 1: tbf rate 10000000bit burst 62500B limit 25000B peakrate 20000000bit maxpacket 6250B
ifb IFB mtu 1500 alias "podwire:k8s-pod-network/0123456789abcdef/eth0 dev=veth1234"
dev IFB root 1: tbf rate 100000000bit burst 250000B limit 250000B peakrate 200000000bit maxpacket 62500B
dev veth1234 ingress pref 65000 u32 match all action mirred egress redirect dev IFB
`, "IFB", ifb)
	if d := cmp.Diff(want, p.String()); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}

	p, _ = planShaping(owner, Request{Egress: Direction{1_000_000, 0}}, "veth1234", ifb, 9000)
	if p.Ingress != nil || p.Egress == nil || p.MTU != 9000 || p.Egress.MaxPacket != 9018 {
		t.Errorf("egress-only plan at MTU 9000: %s", p)
	}
}

func TestIFBNames(t *testing.T) {
	a, _ := ifbName(owner)
	o2 := owner
	o2.IfName = "net1"
	b, _ := ifbName(o2)
	if len(a) != 15 || !strings.HasPrefix(a, "pwb") || a == b {
		t.Errorf("ifbName: %q and %q for two interfaces of one pod", a, b)
	}
	// The reference plugin's name: "bwp" + hex SHA-512 of network+containerID, cut to
	// 15 bytes (utils.MustFormatHashWithPrefix in the reference); value from Python's
	// hashlib.
	if got, want := referenceIFBName("net", "c1"), "bwp623e1c388032"; got != want {
		t.Errorf("referenceIFBName = %q, reference computes %q", got, want)
	}
}

func TestAlias(t *testing.T) {
	if got := tc.AliasFor(owner, "veth1"); got != "podwire:k8s-pod-network/0123456789abcdef/eth0 dev=veth1" || !tc.OfNetwork(got, owner.Network) || tc.OfNetwork(got, "k8s-pod") || tc.DevOf(got) != "veth1" {
		t.Errorf("alias %q", got)
	}
	long := cniplumb.Owner{Network: strings.Repeat("n", 300), ContainerID: strings.Repeat("c", 64), IfName: "eth0"}
	a := tc.AliasFor(long, "veth1")
	if len(a) > 255 || !strings.HasPrefix(a, "podwire#") || !tc.OfNetwork(a, long.Network) || tc.OfNetwork(a, strings.Repeat("n", 299)) || tc.DevOf(a) != "veth1" {
		t.Errorf("alias for a long network name: %q", a)
	}
	huge := cniplumb.Owner{Network: "n", ContainerID: strings.Repeat("c", 1000), IfName: "eth0"}
	if a := tc.AliasFor(huge, "veth1"); len(a) != 255 || !tc.OfNetwork(a, "n") || tc.DevOf(a) != "" {
		t.Errorf("alias for a huge container ID: %q", a)
	}
}

func TestPlanGC(t *testing.T) {
	o := func(net, id, ifname string) cniplumb.Owner {
		return cniplumb.Owner{Network: net, ContainerID: id, IfName: ifname}
	}
	refNamed := func(ow cniplumb.Owner) tc.IFB {
		return tc.IFB{Name: referenceIFBName(ow.Network, ow.ContainerID), Alias: tc.AliasFor(ow, "veth-"+ow.ContainerID)}
	}
	ownNamed := func(ow cniplumb.Owner) tc.IFB {
		n, _ := ifbName(ow)
		return tc.IFB{Name: n, Alias: tc.AliasFor(ow, "veth-"+ow.ContainerID+"-"+ow.IfName)}
	}
	live, dead, other := o("net", "live", "eth0"), o("net", "dead", "eth0"), o("other", "dead", "eth0")
	live1, dead1 := o("net", "live", "net1"), o("net", "dead", "net1")
	ifbs := []tc.IFB{
		refNamed(live), refNamed(dead), refNamed(other), ownNamed(live1), ownNamed(dead1),
		{Name: "ifb0"}, // the kernel's own
		{Name: "pwb000000000000", Alias: "someone"},       // our prefix, not our alias
		{Name: "bwp123456789012", Alias: ""},              // the reference's
		{Name: "pwb111111111111", Alias: "podwire:net/x"}, // ours, network net, unlisted
	}
	got := tc.PlanGC(ifbs, "net", cniplumb.Owners{live: true, live1: true})
	want := []tc.Removal{
		{Dev: "veth-dead", IFBs: []string{refNamed(dead).Name}, OnlyIfRedirected: true},
		{Dev: "veth-dead-net1", IFBs: []string{ownNamed(dead1).Name}, OnlyIfRedirected: true},
		{IFBs: []string{"pwb111111111111"}, OnlyIfRedirected: true},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
	// pwb111111111111 names no complete attachment, so it stays garbage whatever is listed.
	if got := tc.PlanGC(ifbs, "net", cniplumb.Owners{live: true, live1: true, dead: true, dead1: true}); len(got) != 1 {
		t.Errorf("with every attachment valid, GC picks %v", got)
	}
}
