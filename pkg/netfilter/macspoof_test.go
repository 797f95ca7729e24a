// SPDX-License-Identifier: Apache-2.0

package netfilter_test

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/netfilter"
	"github.com/podwire/podwire/pkg/netfilter/fake"
)

var (
	spoofA = netfilter.MacSpoofPlan{Owner: cniplumb.Owner{Network: "podnet", ContainerID: "abc", IfName: "eth0"},
		HostIf: "veth1111", MAC: net.HardwareAddr{0x02, 0x42, 0, 0, 0, 5}}
	spoofB = netfilter.MacSpoofPlan{Owner: cniplumb.Owner{Network: "podnet", ContainerID: "def", IfName: "eth0"},
		HostIf: "veth2222", MAC: net.HardwareAddr{0x02, 0x42, 0, 0, 0, 6}}
)

// The reference's table for spoofA, as nft lists it (the fake prints hook numbers).
const spoofGoldenA = `nft table bridge nat
nft   chain PREROUTING (type filter hook 0 priority -300)
nft     iifname "veth1111" jump cni-br-iface-abc-eth0 # macspoofchk-abc-eth0
nft   chain cni-br-iface-abc-eth0
nft     jump cni-br-iface-abc-eth0-mac # macspoofchk-abc-eth0
nft   chain cni-br-iface-abc-eth0-mac
nft     ether saddr 02:42:00:00:00:05 return # macspoofchk-abc-eth0
nft     drop # macspoofchk-abc-eth0
`

func TestMacSpoofLayout(t *testing.T) {
	ctx := context.Background()
	k := fake.New()
	b := netfilter.NewMacSpoofOn(k)
	if err := b.Apply(ctx, spoofA); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(spoofGoldenA, k.Dump()); d != "" {
		t.Errorf("layout (-want +got):\n%s", d)
	}
	// A repeated Apply replaces, adds nothing.
	if err := b.Apply(ctx, spoofA); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(spoofGoldenA, k.Dump()); d != "" {
		t.Errorf("after a repeated Apply (-want +got):\n%s", d)
	}
	if err := b.Check(ctx, spoofA); err != nil {
		t.Errorf("Check: %v", err)
	}
	if err := b.Check(ctx, spoofB); !netfilter.IsNotFound(err) {
		t.Errorf("Check of an attachment without rules = %v, want IsNotFound", err)
	}
	changed := spoofA
	changed.MAC = net.HardwareAddr{0x02, 0x42, 0, 0, 0, 9}
	if err := b.Check(ctx, changed); err == nil || netfilter.IsNotFound(err) || !strings.Contains(err.Error(), "02:42:00:00:00:09") {
		t.Errorf("Check with another MAC = %v, want a mismatch naming the missing rule", err)
	}
	if err := b.Apply(ctx, spoofB); err != nil {
		t.Fatal(err)
	}
	if err := b.Remove(ctx, spoofB.Owner); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(spoofGoldenA, k.Dump()); d != "" {
		t.Errorf("after removing B (-want +got):\n%s", d)
	}
	if err := b.Remove(ctx, spoofA.Owner); err != nil {
		t.Fatal(err)
	}
	if got := k.Dump(); got != "" {
		t.Errorf("the last Remove left:\n%s", got)
	}
	if err := b.Remove(ctx, spoofA.Owner); err != nil {
		t.Errorf("Remove of nothing: %v", err)
	}
	if err := b.Apply(ctx, netfilter.MacSpoofPlan{Owner: spoofA.Owner, HostIf: "veth1", MAC: net.HardwareAddr{1, 2}}); err == nil {
		t.Error("Apply of a plan with a 2-byte MAC succeeded")
	}
}

// referenceSetup does what the reference's SpoofChecker.Setup does, in its two
// transactions.
func referenceSetup(t *testing.T, k *fake.Kernel, p netfilter.MacSpoofPlan) {
	t.Helper()
	id := p.Owner.ContainerID + "-" + p.Owner.IfName
	tb := &nftables.Table{Name: "nat", Family: nftables.TableFamilyBridge}
	accept := nftables.ChainPolicyAccept
	base := &nftables.Chain{Name: "PREROUTING", Table: tb, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRef(-300), Policy: &accept}
	iface := &nftables.Chain{Name: "cni-br-iface-" + id, Table: tb}
	mac := &nftables.Chain{Name: "cni-br-iface-" + id + "-mac", Table: tb}
	k.AddTable(tb)
	k.AddChain(base)
	k.AddChain(iface)
	k.AddChain(mac)
	if err := k.Flush(); err != nil {
		t.Fatal(err)
	}
	ud := userdata.AppendString(nil, userdata.TypeComment, "macspoofchk-"+id)
	name := make([]byte, 16)
	copy(name, p.HostIf)
	k.FlushChain(iface)
	k.FlushChain(mac)
	k.AddRule(&nftables.Rule{Table: tb, Chain: base, UserData: ud, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1}, &expr.Cmp{Register: 1, Data: name},
		&expr.Verdict{Kind: expr.VerdictJump, Chain: iface.Name}}})
	k.AddRule(&nftables.Rule{Table: tb, Chain: iface, UserData: ud, Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: mac.Name}}})
	k.AddRule(&nftables.Rule{Table: tb, Chain: mac, UserData: ud, Exprs: []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseLLHeader, Offset: 6, Len: 6}, &expr.Cmp{Register: 1, Data: p.MAC},
		&expr.Verdict{Kind: expr.VerdictReturn}}})
	k.AddRule(&nftables.Rule{Table: tb, Chain: mac, UserData: ud, Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictDrop}}})
	if err := k.Flush(); err != nil {
		t.Fatal(err)
	}
}

// TestMacSpoofReference: what the reference's Setup makes is what podwire's Apply
// makes; podwire's Check accepts it and its Remove leaves nothing. Chains the
// reference's teardown left without their PREROUTING rule go with the attachment's
// Remove too, and ebtables-nft's chains in the same table are kept.
func TestMacSpoofReference(t *testing.T) {
	ctx := context.Background()
	k := fake.New()
	referenceSetup(t, k, spoofA)
	if d := cmp.Diff(spoofGoldenA, k.Dump()); d != "" {
		t.Errorf("the reference's Setup differs from podwire's layout (-want +got):\n%s", d)
	}
	b := netfilter.NewMacSpoofOn(k)
	if err := b.Check(ctx, spoofA); err != nil {
		t.Errorf("Check of the reference's rules: %v", err)
	}
	if err := b.Remove(ctx, spoofA.Owner); err != nil {
		t.Fatal(err)
	}
	if got := k.Dump(); got != "" {
		t.Errorf("Remove of the reference's rules left:\n%s", got)
	}

	// Orphaned chains, next to ebtables-nft's OUTPUT chain.
	referenceSetup(t, k, spoofA)
	tb := &nftables.Table{Name: "nat", Family: nftables.TableFamilyBridge}
	out := &nftables.Chain{Name: "OUTPUT", Table: tb, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityRef(100)}
	k.AddChain(out)
	pre, _ := k.ListChain(tb, "PREROUTING")
	rules, _ := k.GetRules(tb, pre)
	if err := k.DelRule(rules[0]); err != nil {
		t.Fatal(err)
	}
	if err := k.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := b.Remove(ctx, spoofA.Owner); err != nil {
		t.Fatal(err)
	}
	want := "nft table bridge nat\nnft   chain OUTPUT (type filter hook 3 priority 100)\nnft   chain PREROUTING (type filter hook 0 priority -300)\n"
	if d := cmp.Diff(want, k.Dump()); d != "" {
		t.Errorf("after removing orphaned chains (-want +got):\n%s", d)
	}
}

// TestMacSpoofGC: GC removes the attachments not kept whose host veth ours claims, and
// leaves another network's (a veth on another bridge) alone.
func TestMacSpoofGC(t *testing.T) {
	ctx := context.Background()
	k := fake.New()
	b := netfilter.NewMacSpoofOn(k)
	other := netfilter.MacSpoofPlan{Owner: cniplumb.Owner{Network: "othernet", ContainerID: "abc", IfName: "net1"},
		HostIf: "veth3333", MAC: net.HardwareAddr{0x02, 0x42, 0, 0, 0, 7}}
	for _, p := range []netfilter.MacSpoofPlan{spoofA, spoofB, other} {
		if err := b.Apply(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	keep := cniplumb.Owners{spoofA.Owner: true}
	ours := func(hostIf string) bool { return hostIf != other.HostIf }
	if err := b.GC(ctx, keep, ours); err != nil {
		t.Fatal(err)
	}
	got := k.Dump()
	if strings.Contains(got, "def-eth0") || !strings.Contains(got, "abc-eth0") || !strings.Contains(got, "abc-net1") {
		t.Errorf("GC keeping A, with othernet's veth not ours, left:\n%s", got)
	}
	if err := b.Check(ctx, spoofA); err != nil {
		t.Errorf("Check of the kept attachment: %v", err)
	}
}

// TestFakeDelChain: the fake refuses, as the kernel does, deleting a chain another
// chain still jumps to, and adding a jump to a missing chain.
func TestFakeDelChain(t *testing.T) {
	ctx := context.Background()
	k := fake.New()
	if err := netfilter.NewMacSpoofOn(k).Apply(ctx, spoofA); err != nil {
		t.Fatal(err)
	}
	tb := &nftables.Table{Name: "nat", Family: nftables.TableFamilyBridge}
	k.DelChain(&nftables.Chain{Name: "cni-br-iface-abc-eth0-mac", Table: tb})
	if err := k.Flush(); err == nil {
		t.Error("deleting a chain that is jumped to succeeded")
	}
	k.AddRule(&nftables.Rule{Table: tb, Chain: &nftables.Chain{Name: "PREROUTING", Table: tb},
		Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: "nowhere"}}})
	if err := k.Flush(); err == nil {
		t.Error("a jump to a missing chain was accepted")
	}
	if d := cmp.Diff(spoofGoldenA, k.Dump()); d != "" {
		t.Errorf("failed batches changed the state (-want +got):\n%s", d)
	}
}

// TestMacSpoofLongContainerID: the longest container ID whose comment
// "macspoofchk-<cid>-<ifname>" fits 128 bytes installs, checks and goes; one byte more
// is refused with the limit for that interface, before anything changes.
func TestMacSpoofLongContainerID(t *testing.T) {
	ctx := context.Background()
	k := fake.New()
	b := netfilter.NewMacSpoofOn(k)
	for _, ifname := range []string{"eth0", "abcdefghijklmno"} {
		max := 128 - len("macspoofchk--"+ifname)
		p := spoofA
		p.Owner.IfName = ifname
		p.Owner.ContainerID = strings.Repeat("c", max)
		if err := b.Apply(ctx, p); err != nil {
			t.Fatalf("Apply with a %d-byte container ID and %s: %v", max, ifname, err)
		}
		if err := b.Check(ctx, p); err != nil {
			t.Errorf("Check: %v", err)
		}
		if err := b.Remove(ctx, p.Owner); err != nil {
			t.Fatal(err)
		}
		p.Owner.ContainerID += "c"
		want := "at most " + strconv.Itoa(max) + " bytes, not " + strconv.Itoa(max+1)
		if err := b.Apply(ctx, p); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Apply with a %d-byte container ID = %v, want an error saying %q", max+1, err, want)
		}
		if got := k.Dump(); got != "" {
			t.Errorf("left behind:\n%s", got)
		}
	}
}
