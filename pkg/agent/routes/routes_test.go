// SPDX-License-Identifier: Apache-2.0

package routes

import (
	"math/rand"
	"net/netip"
	"strings"
	"testing"
)

var (
	p  = netip.MustParsePrefix
	ip = netip.MustParseAddr
)

func cluster() []Node {
	return []Node{
		{Name: "a", InternalIPs: []netip.Addr{ip("192.168.50.1"), ip("fd50::1")}, PodCIDRs: []netip.Prefix{p("10.244.0.0/24"), p("fd00:244::/64")}},
		{Name: "b", InternalIPs: []netip.Addr{ip("192.168.50.2"), ip("fd50::2")}, PodCIDRs: []netip.Prefix{p("10.244.1.0/24"), p("fd00:244:0:1::/64")}},
		{Name: "c", InternalIPs: []netip.Addr{ip("192.168.50.3")}, PodCIDRs: []netip.Prefix{p("10.244.2.0/24"), p("fd00:244:0:2::/64")}},
		{Name: "far", InternalIPs: []netip.Addr{ip("172.16.0.9")}, PodCIDRs: []netip.Prefix{p("10.244.9.0/24")}},
		{Name: "nocidr", InternalIPs: []netip.Addr{ip("192.168.50.7")}},
	}
}

var conn = []Connected{{Prefix: p("192.168.50.0/24"), LinkIndex: 2}, {Prefix: p("fd50::/64"), LinkIndex: 2}}

func TestPlan(t *testing.T) {
	got, skipped := Plan("a", conn, cluster())
	var lines []string
	for _, r := range got {
		lines = append(lines, r.String())
	}
	want := strings.Join([]string{
		"10.244.1.0/24 via 192.168.50.2 dev #2 (b)",
		"10.244.2.0/24 via 192.168.50.3 dev #2 (c)",
		"fd00:244:0:1::/64 via fd50::2 dev #2 (b)",
	}, "\n")
	if s := strings.Join(lines, "\n"); s != want {
		t.Errorf("Plan:\n%s\nwant:\n%s", s, want)
	}
	// c has no IPv6 InternalIP, far is on another segment.
	if len(skipped) != 2 || !strings.Contains(skipped[0]+skipped[1], "node far") || !strings.Contains(skipped[0]+skipped[1], "node c") {
		t.Errorf("skipped: %q", skipped)
	}
}

func TestPlanConflicts(t *testing.T) {
	nodes := cluster()
	nodes = append(nodes, Node{Name: "b2", InternalIPs: []netip.Addr{ip("192.168.50.22")}, PodCIDRs: []netip.Prefix{p("10.244.1.0/24")}},
		Node{Name: "mine", InternalIPs: []netip.Addr{ip("192.168.50.23")}, PodCIDRs: []netip.Prefix{p("10.244.0.128/25")}})
	got, skipped := Plan("a", conn, nodes)
	for _, r := range got {
		if r.Node == "b2" || r.Node == "mine" {
			t.Errorf("conflicting route planned: %s", r)
		}
	}
	if len(skipped) != 4 {
		t.Errorf("skipped: %q", skipped)
	}
}

func TestSyncConverges(t *testing.T) {
	f := &Fake{Conn: conn}
	f.AddForeign(Route{Dst: p("10.99.0.0/16"), Gw: ip("192.168.50.254"), LinkIndex: 2})
	all := cluster()
	rng := rand.New(rand.NewSource(1))
	// Random subsets of the cluster in random order: every state converges to its plan,
	// and the foreign route survives all of them.
	for i := 0; i < 200; i++ {
		var nodes []Node
		for _, n := range all {
			if rng.Intn(2) == 0 {
				if rng.Intn(4) == 0 && len(n.InternalIPs) > 0 { // a Node that changed its IP
					n.InternalIPs = []netip.Addr{ip("192.168.50.99")}
				}
				nodes = append(nodes, n)
			}
		}
		want, _ := Plan("a", conn, nodes)
		if _, err := Sync(f, want); err != nil {
			t.Fatal(err)
		}
		have, _ := f.List()
		if len(have) != len(want) {
			t.Fatalf("round %d: have %v, want %v", i, have, want)
		}
		for _, w := range want {
			found := false
			for _, h := range have {
				found = found || w.same(h)
			}
			if !found {
				t.Fatalf("round %d: %s missing from %v", i, w, have)
			}
		}
		ch, err := Sync(f, want)
		if err != nil || len(ch.Added)+len(ch.Removed) != 0 {
			t.Fatalf("round %d: a second Sync changed %+v (%v)", i, ch, err)
		}
	}
	if _, err := RemoveAll(f); err != nil {
		t.Fatal(err)
	}
	if got := f.Dump(); got != "10.99.0.0/16 via 192.168.50.254 dev #2 proto static" {
		t.Errorf("after RemoveAll:\n%s", got)
	}
}

func TestSyncKeepsGoing(t *testing.T) {
	f := &Fake{Conn: conn}
	want, _ := Plan("a", conn, cluster())
	f.Fail = errString("EPERM")
	ch, err := Sync(f, want)
	if err == nil || len(ch.Added) != len(want)-1 {
		t.Errorf("Sync with one failure: %+v, %v", ch, err)
	}
}

type errString string

func (e errString) Error() string { return string(e) }
