package integration

import (
	"context"
	"net"
	"net/netip"
	"os/exec"
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

// observe returns what the node shows for the masquerade feature, read with the
// operators' tools.
func observe(t *testing.T, n ns.NetNS, kind netfilter.Kind) string {
	t.Helper()
	var out []byte
	var err error
	if kind == netfilter.KindIPTables {
		out, err = exec.Command("nsenter", "--net="+n.Path(), "sh", "-c",
			"iptables -w -t nat -S PW-MASQ-POSTROUTING 2>/dev/null; ip6tables -w -t nat -S PW-MASQ-POSTROUTING 2>/dev/null; true").CombinedOutput()
	} else {
		out, err = exec.Command("nsenter", "--net="+n.Path(), "sh", "-c", "nft list table inet podwire_masq 2>/dev/null; true").CombinedOutput()
	}
	if err != nil {
		t.Fatalf("observing rules: %v\n%s", err, out)
	}
	return string(out)
}

func TestNetfilterBackends(t *testing.T) {
	for _, kind := range []netfilter.Kind{netfilter.KindIPTables, netfilter.KindNFTables} {
		t.Run(string(kind), func(t *testing.T) {
			n := freshNS(t)
			before, err := nodestate.Take(n.Path())
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			var b netfilter.Backend = netfilter.NewNFTables()
			if kind == netfilter.KindIPTables {
				b = netfilter.NewIPTables()
			}
			a := cniplumb.Owner{Network: "nfnet", ContainerID: "ctr-a", IfName: "eth0"}
			bo := cniplumb.Owner{Network: "nfnet", ContainerID: "ctr-b", IfName: "eth0"}
			other := cniplumb.Owner{Network: "othernet", ContainerID: "ctr-a", IfName: "eth0"}
			pa := netfilter.PlanMasquerade(a, []netip.Prefix{netip.MustParsePrefix("10.9.0.2/24")})
			pb := netfilter.PlanMasquerade(bo, []netip.Prefix{netip.MustParsePrefix("10.9.0.3/24"), netip.MustParsePrefix("fd09::3/64")})
			po := netfilter.PlanMasquerade(other, []netip.Prefix{netip.MustParsePrefix("10.8.0.2/24")})

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
				tags, err := b.Tags(ctx, netfilter.MasqFeature)
				if err != nil {
					return err
				}
				owners := map[cniplumb.Owner]int{}
				for _, tg := range tags {
					owners[tg.Owner]++
				}
				if owners[a] != 3 || owners[bo] != 6 || owners[other] != 3 {
					t.Errorf("Tags per owner = %v", owners)
				}
				stale := netfilter.Stale(tags, "nfnet", cniplumb.Owners{bo: true})
				if len(stale) != 1 || !stale[0].Is(a) {
					t.Errorf("stale in nfnet keeping b = %+v, want only a", stale)
				}
				for _, st := range stale {
					if err := b.Remove(ctx, netfilter.MasqFeature, st.ID, netfilter.All); err != nil {
						return err
					}
				}
				if err := b.Check(ctx, pa); !netfilter.IsNotFound(err) {
					t.Errorf("Check after Remove = %v, want IsNotFound", err)
				}
				// Remove is idempotent.
				if err := b.Remove(ctx, netfilter.MasqFeature, netfilter.IDOf(a), netfilter.All); err != nil {
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
					if err := b.Remove(ctx, netfilter.MasqFeature, netfilter.IDOf(o), netfilter.All); err != nil {
						return err
					}
				}
				return b.Remove(ctx, netfilter.MasqFeature, netfilter.IDOf(bo), netfilter.All)
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

func TestNetfilterIPTablesSkipsIPv6(t *testing.T) {
	n := freshNS(t)
	ctx := context.Background()
	b := netfilter.NewIPTables()
	o := cniplumb.Owner{Network: "nfnet", ContainerID: "v4only", IfName: "eth0"}
	inNS(t, n, func() error {
		return b.Apply(ctx, netfilter.PlanMasquerade(o, []netip.Prefix{netip.MustParsePrefix("10.9.0.2/24")}))
	})
	out, _ := exec.Command("nsenter", "--net="+n.Path(), "ip6tables-save").CombinedOutput()
	if strings.Contains(string(out), "PW-MASQ") {
		t.Errorf("an IPv4-only plan touched ip6tables:\n%s", out)
	}
	inNS(t, n, func() error { return b.Remove(ctx, netfilter.MasqFeature, netfilter.IDOf(o), netfilter.V4) })
}

func TestNetfilterMacSpoof(t *testing.T) {
	n := freshNS(t)
	before, err := nodestate.Take(n.Path())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	b := netfilter.NewNFTables()
	o := cniplumb.Owner{Network: "nfnet", ContainerID: "spoof", IfName: "eth0"}
	p := netfilter.PlanMacSpoof(o, "vethspoof", net.HardwareAddr{0x02, 0x42, 0, 0, 0, 7})
	inNS(t, n, func() error {
		if err := b.Apply(ctx, p); err != nil {
			return err
		}
		return b.Check(ctx, p)
	})
	out, _ := exec.Command("nsenter", "--net="+n.Path(), "nft", "list", "table", "bridge", "podwire_macspoof").CombinedOutput()
	for _, want := range []string{`iifname "vethspoof"`, "ether saddr != 02:42:00:00:00:07", "drop", "nfnet/spoof/eth0"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("%q missing from:\n%s", want, out)
		}
	}
	inNS(t, n, func() error { return b.Remove(ctx, netfilter.MacSpoofFeature, netfilter.IDOf(o), netfilter.All) })
	after, err := nodestate.Take(n.Path())
	if err != nil {
		t.Fatal(err)
	}
	if d := nodestate.Diff(before, after); d != "" {
		t.Errorf("Remove left state behind:\n%s", d)
	}
}
