// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"context"
	"net"
	"net/netip"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"

	"github.com/podwire/podwire/integration/nodestate"
	"github.com/podwire/podwire/integration/nstest"
	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/netfilter"
)

// freshNS gives the test a network namespace of its own, removed at cleanup.
func freshNS(t *testing.T) ns.NetNS {
	t.Helper()
	nstest.RequireRoot(t)
	n, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = n.Close()
		_ = testutils.UnmountNS(n)
	})
	return n
}

func inNS(t *testing.T, n ns.NetNS, f func() error) {
	t.Helper()
	if err := n.Do(func(ns.NetNS) error { return f() }); err != nil {
		t.Fatal(err)
	}
}

// genericFeature exercises the generic owner-tagged layer (macspoofchk and portmap's
// nftables rules use it) with masquerade-like rules: chain PW-GENTEST-POSTROUTING,
// table inet podwire_gentest. bridge's ipMasq itself uses the reference's layout
// (TestNetfilterMasqBackends).
var genericFeature = netfilter.Feature{Name: "gentest", Hooks: []netfilter.Hook{netfilter.NATPostrouting}}

// genericPlan is three rules per address: return for the subnet, return for
// multicast, masquerade the rest.
func genericPlan(o cniplumb.Owner, addrs []netip.Prefix) netfilter.Plan {
	p := netfilter.Plan{Feature: genericFeature, Owner: o}
	for _, a := range addrs {
		fam := netfilter.FamilyOf(a.Addr())
		mc := netip.MustParsePrefix("224.0.0.0/4")
		if fam == netfilter.IPv6 {
			mc = netip.MustParsePrefix("ff00::/8")
		}
		src := netip.PrefixFrom(a.Addr(), a.Addr().BitLen())
		hook := netfilter.NATPostrouting
		p.Rules = append(p.Rules,
			netfilter.Rule{Hook: hook, Family: fam, Match: netfilter.Match{Src: src, Dst: a.Masked()}, Action: netfilter.Action{Kind: netfilter.Return}},
			netfilter.Rule{Hook: hook, Family: fam, Match: netfilter.Match{Src: src, Dst: mc}, Action: netfilter.Action{Kind: netfilter.Return}},
			netfilter.Rule{Hook: hook, Family: fam, Match: netfilter.Match{Src: src}, Action: netfilter.Action{Kind: netfilter.Masquerade}},
		)
	}
	return p
}

// observe returns what the node shows for the generic test feature, read with the
// operators' tools.
func observe(t *testing.T, n ns.NetNS, kind netfilter.Kind) string {
	t.Helper()
	var out []byte
	var err error
	if kind == netfilter.KindIPTables {
		out, err = exec.Command("nsenter", "--net="+n.Path(), "sh", "-c",
			"iptables -w -t nat -S PW-GENTEST-POSTROUTING 2>/dev/null; ip6tables -w -t nat -S PW-GENTEST-POSTROUTING 2>/dev/null; true").CombinedOutput()
	} else {
		out, err = exec.Command("nsenter", "--net="+n.Path(), "sh", "-c", "nft list table inet podwire_gentest 2>/dev/null; true").CombinedOutput()
	}
	if err != nil {
		t.Fatalf("observing rules: %v\n%s", err, out)
	}
	return string(out)
}

// TestNetfilterBackends drives the nftables backend of podwire's own tables (portmap's
// nftables layout, macspoofchk) directly on the kernel.
func TestNetfilterBackends(t *testing.T) {
	for _, kind := range []netfilter.Kind{netfilter.KindNFTables} {
		t.Run(string(kind), func(t *testing.T) {
			n := freshNS(t)
			before, err := nodestate.Take(n.Path())
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			b := netfilter.NewNFTables()
			a := cniplumb.Owner{Network: "nfnet", ContainerID: "ctr-a", IfName: "eth0"}
			bo := cniplumb.Owner{Network: "nfnet", ContainerID: "ctr-b", IfName: "eth0"}
			other := cniplumb.Owner{Network: "othernet", ContainerID: "ctr-a", IfName: "eth0"}
			pa := genericPlan(a, []netip.Prefix{netip.MustParsePrefix("10.9.0.2/24")})
			pb := genericPlan(bo, []netip.Prefix{netip.MustParsePrefix("10.9.0.3/24"), netip.MustParsePrefix("fd09::3/64")})
			po := genericPlan(other, []netip.Prefix{netip.MustParsePrefix("10.8.0.2/24")})

			inNS(t, n, func() error {
				for _, p := range []netfilter.Plan{pa, pb, po, pa} { // pa twice: Apply replaces
					if err := b.Apply(ctx, p); err != nil {
						return err
					}
				}
				return nil
			})
			seen := observe(t, n, kind)
			for _, want := range []string{"10.9.0.2", "10.9.0.3", "fd09::3", "10.8.0.2", "nfnet/ctr-a/eth0", "nfnet/ctr-b/eth0"} {
				if !strings.Contains(seen, want) {
					t.Errorf("%s not visible in the ruleset:\n%s", want, seen)
				}
			}
			if got := strings.Count(seen, "10.9.0.2"); got != 3 {
				t.Errorf("owner a has %d rules after applying twice, want 3:\n%s", got, seen)
			}
			inNS(t, n, func() error {
				for _, p := range []netfilter.Plan{pa, pb, po} {
					if err := b.Check(ctx, p); err != nil {
						t.Errorf("Check %s: %v", p.Owner, err)
					}
				}
				// GC of nfnet keeping b removes a only; othernet is not touched.
				if err := b.GC(ctx, genericFeature, "nfnet", cniplumb.Owners{bo: true}); err != nil {
					return err
				}
				if err := b.Check(ctx, po); err != nil {
					t.Errorf("GC of nfnet touched othernet: %v", err)
				}
				if err := b.Check(ctx, pa); !netfilter.IsNotFound(err) {
					t.Errorf("Check after Remove = %v, want IsNotFound", err)
				}
				// Remove is idempotent.
				if err := b.Remove(ctx, genericFeature, a); err != nil {
					t.Errorf("second Remove: %v", err)
				}
				if err := b.Check(ctx, pb); err != nil {
					t.Errorf("Check of b after removing a: %v", err)
				}
				return nil
			})
			if seen := observe(t, n, kind); strings.Contains(seen, "10.9.0.2") || !strings.Contains(seen, "10.9.0.3") {
				t.Errorf("after removing a:\n%s", seen)
			}
			inNS(t, n, func() error {
				for _, o := range []cniplumb.Owner{bo, other} {
					if err := b.Remove(ctx, genericFeature, o); err != nil {
						return err
					}
				}
				return b.Remove(ctx, genericFeature, bo)
			})
			after, err := nodestate.Take(n.Path())
			if err != nil {
				t.Fatal(err)
			}
			if d := nodestate.Diff(before, after); d != "" {
				t.Errorf("removing every owner left state behind:\n%s", d)
			}
		})
	}
}

// nftDebugHandleRe matches a rule's header in `nft --debug=netlink` output, which ends
// in the rule's handle (and the handle it was added after).
var nftDebugHandleRe = regexp.MustCompile(`(?m)^(bridge nat \S+)( \d+)+$`)

// TestNetfilterMacSpoof: the macspoofchk backend writes, byte for byte, what nft makes
// of the reference's rules (so `nft list` shows the same and the reference's teardown
// finds them), checks them, and removes them with the table.
func TestNetfilterMacSpoof(t *testing.T) {
	o := cniplumb.Owner{Network: "nfnet", ContainerID: "spoof", IfName: "eth0"}
	p := netfilter.MacSpoofPlan{Owner: o, HostIf: "vethspoof", MAC: net.HardwareAddr{0x02, 0x42, 0, 0, 0, 7}}
	list := func(n ns.NetNS) string {
		out, err := exec.Command("nsenter", "--net="+n.Path(), "nft", "--debug=netlink", "list", "table", "bridge", "nat").CombinedOutput()
		if err != nil {
			t.Fatalf("nft list: %v\n%s", err, out)
		}
		return nftDebugHandleRe.ReplaceAllString(nftHandleRe.ReplaceAllString(string(out), ""), "$1")
	}
	ref := freshNS(t)
	script := `add table bridge nat
add chain bridge nat PREROUTING { type filter hook prerouting priority -300; policy accept; }
add chain bridge nat cni-br-iface-spoof-eth0
add chain bridge nat cni-br-iface-spoof-eth0-mac
add rule bridge nat PREROUTING iifname "vethspoof" jump cni-br-iface-spoof-eth0 comment "macspoofchk-spoof-eth0"
add rule bridge nat cni-br-iface-spoof-eth0 jump cni-br-iface-spoof-eth0-mac comment "macspoofchk-spoof-eth0"
add rule bridge nat cni-br-iface-spoof-eth0-mac ether saddr 02:42:00:00:00:07 return comment "macspoofchk-spoof-eth0"
add rule bridge nat cni-br-iface-spoof-eth0-mac drop comment "macspoofchk-spoof-eth0"
`
	cmd := exec.Command("nsenter", "--net="+ref.Path(), "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft -f: %v\n%s", err, out)
	}
	n := freshNS(t)
	before, err := nodestate.Take(n.Path())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	b := netfilter.NewMacSpoof()
	inNS(t, n, func() error {
		if err := b.Apply(ctx, p); err != nil {
			return err
		}
		return b.Check(ctx, p)
	})
	if got, want := list(n), list(ref); got != want {
		t.Errorf("podwire's macspoofchk bytecode differs from nft's for the reference's rules:\nnft:\n%s\npodwire:\n%s", want, got)
	}
	inNS(t, n, func() error { return b.Remove(ctx, o) })
	after, err := nodestate.Take(n.Path())
	if err != nil {
		t.Fatal(err)
	}
	if d := nodestate.Diff(before, after); d != "" {
		t.Errorf("Remove left state behind:\n%s", d)
	}
}

// TestNetfilterMasqBackends drives bridge's ipMasq backends (the reference's layout) directly:
// a repeated Apply adds nothing, Check sees missing rules, GC removes only stale
// attachments of its network, RemoveMasq (DEL) finds the rules whichever backend made
// them, and nothing is left at the end.
func TestNetfilterMasqBackends(t *testing.T) {
	for _, kind := range []netfilter.Kind{netfilter.KindIPTables, netfilter.KindNFTables} {
		t.Run(string(kind), func(t *testing.T) {
			n := freshNS(t)
			before, err := nodestate.Take(n.Path())
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			b, _, err := netfilter.OpenMasq(kind)
			if err != nil {
				t.Fatal(err)
			}
			a := cniplumb.Owner{Network: "nfnet", ContainerID: "ctr-a", IfName: "eth0"}
			bo := cniplumb.Owner{Network: "nfnet", ContainerID: "ctr-b", IfName: "eth0"}
			other := cniplumb.Owner{Network: "othernet", ContainerID: "ctr-a", IfName: "eth0"}
			pa := netfilter.MasqPlan{Owner: a, Addrs: []netip.Prefix{netip.MustParsePrefix("10.9.0.2/24"), netip.MustParsePrefix("fd09::2/64")}}
			pb := netfilter.MasqPlan{Owner: bo, Addrs: []netip.Prefix{netip.MustParsePrefix("10.9.0.3/24")}}
			po := netfilter.MasqPlan{Owner: other, Addrs: []netip.Prefix{netip.MustParsePrefix("10.8.0.2/24")}}
			show := func() string {
				out, _ := exec.Command("nsenter", "--net="+n.Path(), "sh", "-c",
					"iptables-save -t nat; ip6tables-save -t nat; nft list table inet cni_plugins_masquerade 2>/dev/null; true").CombinedOutput()
				return string(out)
			}
			inNS(t, n, func() error {
				for _, p := range []netfilter.MasqPlan{pa, pb, po, pa} {
					if err := b.Apply(ctx, p); err != nil {
						return err
					}
				}
				return nil
			})
			seen := show()
			if got := strings.Count(seen, "10.9.0.2"); got != 1 {
				t.Errorf("10.9.0.2 appears %d times after applying twice, want once:\n%s", got, seen)
			}
			inNS(t, n, func() error {
				for _, p := range []netfilter.MasqPlan{pa, pb, po} {
					if err := b.Check(ctx, p); err != nil {
						t.Errorf("Check %s: %v", p.Owner, err)
					}
				}
				wrong := pb
				wrong.Addrs = []netip.Prefix{netip.MustParsePrefix("10.9.0.9/24")}
				if err := b.Check(ctx, wrong); err == nil || netfilter.IsNotFound(err) {
					t.Errorf("Check with another address = %v, want a mismatch", err)
				}
				if err := b.GC(ctx, "nfnet", cniplumb.Owners{bo: true}); err != nil {
					return err
				}
				if err := b.Check(ctx, pa); !netfilter.IsNotFound(err) {
					t.Errorf("Check of a after GC = %v, want IsNotFound", err)
				}
				for _, p := range []netfilter.MasqPlan{pb, po} {
					if err := b.Check(ctx, p); err != nil {
						t.Errorf("Check %s after GC: %v", p.Owner, err)
					}
				}
				// DEL's path: both layouts, whichever backend wrote them.
				for _, o := range []cniplumb.Owner{bo, other, bo} {
					if err := netfilter.RemoveMasq(ctx, o, nil); err != nil {
						return err
					}
				}
				return nil
			})
			after, err := nodestate.Take(n.Path())
			if err != nil {
				t.Fatal(err)
			}
			if d := nodestate.Diff(before, after); d != "" {
				t.Errorf("removing every owner left state behind:\n%s", d)
			}
		})
	}
}
