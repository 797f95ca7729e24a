// SPDX-License-Identifier: Apache-2.0

package masq

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/podwire/podwire/pkg/netfilter"
	"github.com/podwire/podwire/pkg/netfilter/fake"
)

var p = netip.MustParsePrefix

func TestPlan(t *testing.T) {
	plan, uncovered := Plan([]netip.Prefix{p("10.244.1.0/24"), p("fd00:244:0:1::/64")},
		[]netip.Prefix{p("10.244.0.0/16"), p("10.96.0.0/12")})
	want := `nat/postrouting ipv4 saddr == 10.244.1.0/24 daddr == 10.244.0.0/16 return
nat/postrouting ipv4 saddr == 10.244.1.0/24 daddr == 10.96.0.0/12 return
nat/postrouting ipv4 saddr == 10.244.1.0/24 masquerade
nat/postrouting ipv6 saddr == fd00:244:0:1::/64 daddr == fd00:244:0:1::/64 return
nat/postrouting ipv6 saddr == fd00:244:0:1::/64 masquerade
`
	if plan.String() != want {
		t.Errorf("plan:\n%s\nwant:\n%s", plan, want)
	}
	if len(uncovered) != 1 || uncovered[0] != p("fd00:244:0:1::/64") {
		t.Errorf("uncovered: %v", uncovered)
	}
	if err := plan.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestSyncOnFakeKernel(t *testing.T) {
	ctx := context.Background()
	k := fake.New()
	b := netfilter.NewNFTablesOn(k)
	plan, _ := Plan([]netip.Prefix{p("10.244.1.0/24")}, []netip.Prefix{p("10.244.0.0/16")})
	if err := Sync(ctx, b, plan); err != nil {
		t.Fatal(err)
	}
	dump := k.Dump()
	if !strings.Contains(dump, "podwire_agent") || !strings.Contains(dump, "masquerade") {
		t.Fatalf("after Sync:\n%s", dump)
	}
	if err := Sync(ctx, b, plan); err != nil || k.Dump() != dump {
		t.Errorf("a second Sync changed the kernel (%v):\n%s", err, k.Dump())
	}
	// The Node's pod CIDR changes: the old rules go.
	plan2, _ := Plan([]netip.Prefix{p("10.244.7.0/24")}, []netip.Prefix{p("10.244.0.0/16")})
	if err := Sync(ctx, b, plan2); err != nil {
		t.Fatal(err)
	}
	if d := k.Dump(); strings.Contains(d, "10.244.1.0") || !strings.Contains(d, "10.244.7.0") {
		t.Errorf("after the CIDR change:\n%s", d)
	}
	if err := Remove(ctx, b); err != nil {
		t.Fatal(err)
	}
	if d := k.Dump(); strings.Contains(d, "podwire_agent") {
		t.Errorf("after Remove:\n%s", d)
	}
}
