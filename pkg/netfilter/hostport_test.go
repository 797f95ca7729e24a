package netfilter

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/podwire/podwire/pkg/cniplumb"
)

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }

func hpPlan(o Owner) HostPortPlan {
	return HostPortPlan{
		Owner: o, SNAT: true, Mark: 0x2000,
		Ports: []HostPort{
			{Proto: TCP, HostPort: 8080, Pod: pfx("10.88.0.5/16"), ContainerPort: 80},
			{Proto: UDP, HostPort: 5353, HostIP: addr("192.0.2.1"), Pod: pfx("10.88.0.5/16"), ContainerPort: 53},
			{Proto: TCP, HostPort: 8080, Pod: pfx("fd88::5/64"), ContainerPort: 80},
		},
	}
}

// The per-container chain must be named exactly as the reference names it
// (utils.MustFormatChainNameWithPrefix(network, containerID, "DN-")), or neither
// binary's DEL finds the other's chain. Expected values from
// `printf %s net1aaaa | sha512sum`; the integration test proves it against the
// reference binary.
func TestHostPortChainMatchesReference(t *testing.T) {
	for _, c := range [][3]string{
		{"net1", "aaaa", "CNI-DN-0b7211f9d65432f9f8e11"},
		{"podnet", "abc", "CNI-DN-0830037e596fec4874866"},
	} {
		if got := HostPortChain(c[0], c[1]); got != c[2] {
			t.Errorf("HostPortChain(%q, %q) = %s, reference %s", c[0], c[1], got, c[2])
		}
	}
}

func TestHostPortRules(t *testing.T) {
	p, err := hpPlan(ownerA).Rules()
	if err != nil {
		t.Fatal(err)
	}
	want := `nat/prerouting ipv4 saddr == 10.88.0.0/16 daddr type local tcp dport 8080 setmark 0x2000
nat/prerouting ipv4 daddr type local tcp dport 8080 dnat to 10.88.0.5:80
nat/prerouting ipv4 saddr == 10.88.0.0/16 daddr == 192.0.2.1/32 daddr type local udp dport 5353 setmark 0x2000
nat/prerouting ipv4 daddr == 192.0.2.1/32 daddr type local udp dport 5353 dnat to 10.88.0.5:53
nat/output ipv4 saddr == 10.88.0.0/16 daddr type local tcp dport 8080 setmark 0x2000
nat/output ipv4 saddr == 127.0.0.1/32 daddr type local tcp dport 8080 setmark 0x2000
nat/output ipv4 daddr type local tcp dport 8080 dnat to 10.88.0.5:80
nat/output ipv4 saddr == 10.88.0.0/16 daddr == 192.0.2.1/32 daddr type local udp dport 5353 setmark 0x2000
nat/output ipv4 saddr == 127.0.0.1/32 daddr == 192.0.2.1/32 daddr type local udp dport 5353 setmark 0x2000
nat/output ipv4 daddr == 192.0.2.1/32 daddr type local udp dport 5353 dnat to 10.88.0.5:53
nat/postrouting ipv4 daddr == 10.88.0.5/32 mark & 0x2000 == 0x2000 masquerade
nat/prerouting ipv6 saddr == fd88::/64 daddr type local tcp dport 8080 setmark 0x2000
nat/prerouting ipv6 daddr type local tcp dport 8080 dnat to [fd88::5]:80
nat/output ipv6 saddr == fd88::/64 daddr type local tcp dport 8080 setmark 0x2000
nat/output ipv6 daddr type local tcp dport 8080 dnat to [fd88::5]:80
nat/postrouting ipv6 daddr == fd88::5/128 mark & 0x2000 == 0x2000 masquerade
`
	if d := cmp.Diff(want, p.String()); d != "" {
		t.Errorf("rules (-want +got):\n%s", d)
	}
	for _, r := range p.Rules {
		if _, err := nftExprs(p.Feature, r); err != nil {
			t.Errorf("nftExprs(%s): %v", r, err)
		}
	}

	// snat off: DNAT only; masqAll: marks from anywhere, no localhost rule needed.
	q := hpPlan(ownerA)
	q.SNAT = false
	q.Ports = q.Ports[:1]
	r, _ := q.Rules()
	if got := r.String(); got != "nat/prerouting ipv4 daddr type local tcp dport 8080 dnat to 10.88.0.5:80\nnat/output ipv4 daddr type local tcp dport 8080 dnat to 10.88.0.5:80\n" {
		t.Errorf("snat=false rules:\n%s", got)
	}
	q.SNAT, q.MasqAll = true, true
	r, _ = q.Rules()
	if got := r.String(); strings.Contains(got, "saddr") || strings.Count(got, "setmark") != 2 || !strings.Contains(got, "masquerade") {
		t.Errorf("masqAll rules:\n%s", got)
	}
	q.MasqAll, q.SetMarkChain = false, "KUBE-MARK-MASQ"
	if _, err := q.Rules(); err == nil || !strings.Contains(err.Error(), "iptables") {
		t.Errorf("external mark chain for nftables: %v", err)
	}
}

func TestHostPortConditions(t *testing.T) {
	p := hpPlan(ownerA)
	p.Ports = p.Ports[:2]
	p.Conditions = map[Family]Match{IPv4: {Src: pfx("10.0.0.0/8"), NotSrc: true, InIface: "eth0"}}
	r, err := p.Rules()
	if err != nil {
		t.Fatal(err)
	}
	if got := r.String(); !strings.Contains(got, "nat/prerouting ipv4 iif eth0 saddr != 10.0.0.0/8 daddr type local tcp dport 8080 dnat to 10.88.0.5:80") {
		t.Errorf("conditions not on the DNAT:\n%s", got)
	}
	// A destination condition combines with hostIP: implied, or impossible.
	p.Conditions = map[Family]Match{IPv4: {Dst: pfx("192.0.2.0/24")}}
	if r, err = p.Rules(); err != nil || !strings.Contains(r.String(), "daddr == 192.0.2.1/32 daddr type local udp dport 5353 dnat") {
		t.Errorf("implied destination: %v\n%s", err, r)
	}
	p.Conditions = map[Family]Match{IPv4: {Dst: pfx("192.0.2.0/24"), NotDst: true}}
	if _, err := p.Rules(); err == nil || !strings.Contains(err.Error(), "could never match") {
		t.Errorf("excluded hostIP: %v", err)
	}
	p.Conditions = map[Family]Match{IPv4: {Proto: TCP}}
	if err := p.Validate(); err == nil {
		t.Error("a protocol condition was accepted")
	}
	p.Conditions = map[Family]Match{IPv4: {Src: pfx("fd00::/8")}}
	if err := p.Validate(); err == nil {
		t.Error("an IPv6 prefix in IPv4 conditions was accepted")
	}
}

func TestHostPortRenderIPTables(t *testing.T) {
	p := hpPlan(ownerA)
	p.Conditions = map[Family]Match{IPv4: {Dst: pfx("192.0.2.0/24")}}
	r, err := renderHostPortIPTables(IPv4, p)
	if err != nil {
		t.Fatal(err)
	}
	chain := HostPortChain("net1", "aaaa")
	if r.chain != chain || len(r.jumps) != 2 || len(r.rules) != 6 {
		t.Fatalf("rendered %+v", r)
	}
	strip := func(s string) string { // the tag text is tested elsewhere
		i := strings.Index(s, `-m comment --comment "pw:`)
		j := strings.Index(s[i+1:], `" `)
		return s[:i] + "TAG" + s[i+1+j+1:]
	}
	var got []string
	for _, l := range append(append([]string{}, r.jumps...), r.rules...) {
		got = append(got, strip(l))
	}
	want := []string{
		"-d 192.0.2.0/24 -p tcp -m multiport --dports 8080 TAG -j " + chain,
		"-d 192.0.2.0/24 -p udp -m multiport --dports 5353 TAG -j " + chain,
		"-s 10.88.0.0/16 -p tcp -m tcp --dport 8080 TAG -j MARK --set-xmark 0x2000/0x2000",
		"-s 127.0.0.1/32 -p tcp -m tcp --dport 8080 TAG -j MARK --set-xmark 0x2000/0x2000",
		"-p tcp -m tcp --dport 8080 TAG -j DNAT --to-destination 10.88.0.5:80",
		"-s 10.88.0.0/16 -d 192.0.2.1/32 -p udp -m udp --dport 5353 TAG -j MARK --set-xmark 0x2000/0x2000",
		"-s 127.0.0.1/32 -d 192.0.2.1/32 -p udp -m udp --dport 5353 TAG -j MARK --set-xmark 0x2000/0x2000",
		"-d 192.0.2.1/32 -p udp -m udp --dport 5353 TAG -j DNAT --to-destination 10.88.0.5:53",
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("iptables rendering (-want +got):\n%s", d)
	}

	// 20 ports in one protocol need two multiport jumps; the external mark chain is a jump.
	q := HostPortPlan{Owner: ownerA, SNAT: true, SetMarkChain: "KUBE-MARK-MASQ"}
	for i := 0; i < 20; i++ {
		q.Ports = append(q.Ports, HostPort{Proto: TCP, HostPort: uint16(9000 + i), Pod: pfx("10.88.0.5/16"), ContainerPort: 80})
	}
	r, err = renderHostPortIPTables(IPv4, q)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.jumps) != 2 || !strings.Contains(r.jumps[0], "--dports 9000,9001,9002,9003,9004,9005,9006,9007,9008,9009,9010,9011,9012,9013,9014 ") ||
		!strings.Contains(r.jumps[1], "--dports 9015,9016,9017,9018,9019 ") {
		t.Errorf("multiport split: %q", r.jumps)
	}
	if !strings.HasSuffix(r.rules[0], "-j KUBE-MARK-MASQ") {
		t.Errorf("external mark chain: %s", r.rules[0])
	}
	q.SetMarkChain = "-j ACCEPT"
	if _, err := renderHostPortIPTables(IPv4, q); err == nil {
		t.Error("an injected chain name was accepted")
	}
}

// listingFor renders what `iptables -S` prints for CNI-HOSTPORT-DNAT and the
// per-container chain after p alone was installed.
func listingFor(t *testing.T, fam Family, plans ...HostPortPlan) (top chainListing, dn map[string]chainListing) {
	t.Helper()
	topText := "-N " + HostPortDNATChain + "\n"
	dnText := map[string]string{}
	for _, p := range plans {
		r, err := renderHostPortIPTables(fam, p)
		if err != nil {
			t.Fatal(err)
		}
		for _, j := range r.jumps {
			topText += "-A " + HostPortDNATChain + " " + j + "\n"
		}
		if dnText[r.chain] == "" {
			dnText[r.chain] = "-N " + r.chain + "\n"
		}
		for _, l := range r.rules {
			dnText[r.chain] += "-A " + r.chain + " " + l + "\n"
		}
	}
	dn = map[string]chainListing{}
	for c, txt := range dnText {
		dn[c] = parseListing(txt)
	}
	return parseListing(topText), dn
}

func scriptLines(t *testing.T, fam Family, st hpState, ch hpChange) []string {
	t.Helper()
	s, err := planHostPortIPTables(fam, st, ch)
	if err != nil {
		t.Fatal(err)
	}
	if s.empty() {
		return nil
	}
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(s.String()), "\n") {
		if i := strings.Index(l, `-m comment --comment "pw:`); i >= 0 {
			j := strings.Index(l[i+1:], `" `)
			l = l[:i] + "TAG" + l[i+1+j+1:]
		}
		out = append(out, l)
	}
	return out
}

func TestPlanHostPortIPTables(t *testing.T) {
	p := hpPlan(ownerA)
	p.Ports = p.Ports[:1]
	chain := HostPortChain("net1", "aaaa")
	add := func(p HostPortPlan) hpChange {
		return hpChange{add: &p, removeIDs: map[OwnerID]bool{IDOf(p.Owner): true}, removeRef: map[string]bool{HostPortChain(p.Owner.Network, p.Owner.ContainerID): true}}
	}
	del := func(o Owner) hpChange {
		return hpChange{removeIDs: map[OwnerID]bool{IDOf(o): true}, removeRef: map[string]bool{HostPortChain(o.Network, o.ContainerID): true}, teardown: true}
	}
	empty := chainListing{}
	masqWithRule := parseListing("-N CNI-HOSTPORT-MASQ\n-A CNI-HOSTPORT-MASQ -m mark --mark 0x2000/0x2000 -j MASQUERADE\n")
	topA, dnA := listingFor(t, IPv4, p)
	pb := hpPlan(ownerB)
	pb.Ports = pb.Ports[:1]
	pb.Ports[0].HostPort = 9090
	topAB, dnAB := listingFor(t, IPv4, p, pb)
	// Another interface of the same container in the same network: shares the chain.
	a2 := Owner{Network: "net1", ContainerID: "aaaa", IfName: "net2"}
	pa2 := hpPlan(a2)
	pa2.Ports = pa2.Ports[:1]
	pa2.Ports[0].HostPort = 7070
	topShared, dnShared := listingFor(t, IPv4, p, pa2)
	refTop := parseListing("-N CNI-HOSTPORT-DNAT\n" +
		`-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"net1\" id: \"aaaa\"" -m multiport --dports 8080 -j ` + chain + "\n")

	jumpA := "-A CNI-HOSTPORT-DNAT -p tcp -m multiport --dports 8080 TAG -j " + chain
	rulesA := []string{
		"-A " + chain + " -s 10.88.0.0/16 -p tcp -m tcp --dport 8080 TAG -j MARK --set-xmark 0x2000/0x2000",
		"-A " + chain + " -s 127.0.0.1/32 -p tcp -m tcp --dport 8080 TAG -j MARK --set-xmark 0x2000/0x2000",
		"-A " + chain + " -p tcp -m tcp --dport 8080 TAG -j DNAT --to-destination 10.88.0.5:80",
	}
	for _, tc := range []struct {
		name string
		st   hpState
		ch   hpChange
		want []string
	}{
		{"first host port on the node", hpState{top: empty, masq: &empty}, add(p), append(append([]string{"*nat",
			":" + chain + " - [0:0]", ":CNI-HOSTPORT-DNAT - [0:0]", ":CNI-HOSTPORT-MASQ - [0:0]",
			"-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT",
			"-A OUTPUT -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT"}, rulesA...), jumpA,
			`-I POSTROUTING 1 -m comment --comment "CNI portfwd requiring masquerade" -j CNI-HOSTPORT-MASQ`,
			"-A CNI-HOSTPORT-MASQ -m mark --mark 0x2000/0x2000 -j MASQUERADE", "COMMIT")},
		{"second pod: shared chains exist", hpState{top: topA, masq: &masqWithRule}, add(pb), []string{"*nat",
			":" + HostPortChain("net1", "bbbb") + " - [0:0]",
			"-A " + HostPortChain("net1", "bbbb") + " -s 10.88.0.0/16 -p tcp -m tcp --dport 9090 TAG -j MARK --set-xmark 0x2000/0x2000",
			"-A " + HostPortChain("net1", "bbbb") + " -s 127.0.0.1/32 -p tcp -m tcp --dport 9090 TAG -j MARK --set-xmark 0x2000/0x2000",
			"-A " + HostPortChain("net1", "bbbb") + " -p tcp -m tcp --dport 9090 TAG -j DNAT --to-destination 10.88.0.5:80",
			"-A CNI-HOSTPORT-DNAT -p tcp -m multiport --dports 9090 TAG -j " + HostPortChain("net1", "bbbb"), "COMMIT"}},
		{"re-ADD replaces by flushing the chain", hpState{top: topA, masq: &masqWithRule}, add(p), append(append([]string{"*nat",
			":" + chain + " - [0:0]", "-D" + jumpA[2:]}, rulesA...), jumpA, "COMMIT")},
		{"DEL of one of two pods", hpState{top: topAB}, del(ownerA), []string{"*nat",
			":" + chain + " - [0:0]", "-D" + jumpA[2:], "-X " + chain, "COMMIT"}},
		{"DEL of the last pod removes the shared chains", hpState{top: topA, masq: &masqWithRule}, del(ownerA), []string{"*nat",
			":" + chain + " - [0:0]", ":CNI-HOSTPORT-MASQ - [0:0]", ":CNI-HOSTPORT-SETMARK - [0:0]",
			"-D" + jumpA[2:],
			"-D PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT",
			"-D OUTPUT -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT",
			`-D POSTROUTING -m comment --comment "CNI portfwd requiring masquerade" -j CNI-HOSTPORT-MASQ`,
			"-X " + chain, "-X CNI-HOSTPORT-DNAT", "-X CNI-HOSTPORT-MASQ", "-X CNI-HOSTPORT-SETMARK", "COMMIT"}},
		{"DEL of the last pod without teardown", hpState{top: topA}, hpChange{removeIDs: del(ownerA).removeIDs, removeRef: del(ownerA).removeRef}, []string{"*nat",
			":" + chain + " - [0:0]", "-D" + jumpA[2:], "-X " + chain, "COMMIT"}},
		{"DEL keeping chains (fallback)", hpState{top: topAB}, hpChange{removeIDs: del(ownerA).removeIDs, removeRef: del(ownerA).removeRef, keep: true}, []string{"*nat",
			":" + chain + " - [0:0]", "-D" + jumpA[2:], "COMMIT"}},
		{"DEL of an absent pod is a no-op", hpState{top: topA}, del(ownerB), nil},
		{"DEL with no host ports at all is a no-op", hpState{top: empty}, del(ownerA), nil},
		{"DEL clears empty shared chains (left by the reference's DEL)", hpState{top: parseListing("-N CNI-HOSTPORT-DNAT\n"), masq: &empty}, del(ownerA), []string{"*nat",
			":CNI-HOSTPORT-SETMARK - [0:0]",
			"-D PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT",
			"-D OUTPUT -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT",
			"-X CNI-HOSTPORT-DNAT", "-X CNI-HOSTPORT-SETMARK", "COMMIT"}},
		{"DEL of a chain shared with another interface", hpState{top: topShared, dn: dnShared}, del(ownerA), append(append([]string{"*nat",
			"-D" + jumpA[2:]}, "-D"+rulesA[0][2:], "-D"+rulesA[1][2:], "-D"+rulesA[2][2:]), "COMMIT")},
		{"DEL of the reference's rules for the container", hpState{top: refTop, masq: &masqWithRule}, del(ownerA), []string{"*nat",
			":" + chain + " - [0:0]", ":CNI-HOSTPORT-MASQ - [0:0]", ":CNI-HOSTPORT-SETMARK - [0:0]",
			"-D" + refTop.rules[0].line[2:],
			"-D PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT",
			"-D OUTPUT -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT",
			`-D POSTROUTING -m comment --comment "CNI portfwd requiring masquerade" -j CNI-HOSTPORT-MASQ`,
			"-X " + chain, "-X CNI-HOSTPORT-DNAT", "-X CNI-HOSTPORT-MASQ", "-X CNI-HOSTPORT-SETMARK", "COMMIT"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.st.dn == nil {
				tc.st.dn = map[string]chainListing{}
			}
			if d := cmp.Diff(tc.want, scriptLines(t, IPv4, tc.st, tc.ch)); d != "" {
				t.Errorf("script (-want +got):\n%s", d)
			}
		})
	}
	_ = dnA
	_ = dnAB

	// Planning asks for the listings it needs.
	if _, err := planHostPortIPTables(IPv4, hpState{top: empty}, add(p)); !errors.As(err, new(errNeedListing)) || err.Error() != "need a listing of CNI-HOSTPORT-MASQ" {
		t.Errorf("masq listing not asked for: %v", err)
	}
	if _, err := planHostPortIPTables(IPv4, hpState{top: topShared, dn: map[string]chainListing{}}, del(ownerA)); err == nil || err.Error() != "need a listing of "+chain {
		t.Errorf("shared chain listing not asked for: %v", err)
	}
	// Foreign rules in CNI-HOSTPORT-MASQ keep it alive.
	foreign := parseListing("-N CNI-HOSTPORT-MASQ\n-A CNI-HOSTPORT-MASQ -s 10.0.0.1/32 -j MASQUERADE\n")
	if got := strings.Join(scriptLines(t, IPv4, hpState{top: topA, masq: &foreign, dn: map[string]chainListing{}}, del(ownerA)), "\n"); strings.Contains(got, "-X CNI-HOSTPORT-MASQ") {
		t.Errorf("a MASQ chain with foreign rules was removed:\n%s", got)
	}
}

func TestHostPortGCAndCheck(t *testing.T) {
	p := hpPlan(ownerA)
	pb := hpPlan(ownerB)
	pb.Ports = pb.Ports[:1]
	pb.Ports[0].HostPort = 9090
	pc := hpPlan(ownerC) // another network
	pc.Ports = pc.Ports[:1]
	pc.Ports[0].HostPort = 7070
	top, dn := listingFor(t, IPv4, p, pb, pc)
	ref := `-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"net1\" id: \"cccc\"" -m multiport --dports 6060 -j ` + HostPortChain("net1", "cccc")
	refKept := `-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"net1\" id: \"bbbb\"" -m multiport --dports 6061 -j ` + HostPortChain("net1", "bbbb")
	top.rules = append(top.rules, listedRule{line: ref}, listedRule{line: refKept})

	ch := hpGCChange(top, "net1", cniplumb.Owners{ownerB: true})
	if len(ch.removeIDs) != 1 || !ch.removeIDs[IDOf(ownerA)] {
		t.Errorf("GC removes owners %v, want only a", ch.removeIDs)
	}
	if len(ch.removeRef) != 1 || !ch.removeRef[HostPortChain("net1", "cccc")] {
		t.Errorf("GC removes reference chains %v, want only net1/cccc's", ch.removeRef)
	}

	if err := hpCheck(IPv4, p, top, dn[HostPortChain("net1", "aaaa")]); err != nil {
		t.Errorf("Check of an installed plan: %v", err)
	}
	if err := hpCheck(IPv4, p, chainListing{}, chainListing{}); !IsNotFound(err) {
		t.Errorf("Check with nothing installed = %v, want IsNotFound", err)
	}
	changed := p
	changed.Ports = changed.Ports[:1]
	if err := hpCheck(IPv4, changed, top, dn[HostPortChain("net1", "aaaa")]); err == nil {
		t.Error("Check passed with an extra mapping installed")
	}
}

func TestJumpTargetAndRefOwner(t *testing.T) {
	if got := jumpTarget("-A X -p tcp -j DNAT --to-destination 1.2.3.4:5"); got != "DNAT" {
		t.Errorf("jumpTarget = %q", got)
	}
	if got := jumpTarget("-A X -p tcp"); got != "" {
		t.Errorf("jumpTarget = %q", got)
	}
	n, c, ok := refOwner(`-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"my-net\" id: \"abc123\"" -m multiport --dports 80 -j CNI-DN-x`)
	if !ok || n != "my-net" || c != "abc123" {
		t.Errorf("refOwner = %q %q %v", n, c, ok)
	}
}

func TestHostPortFakeStates(t *testing.T) {
	ctx := context.Background()
	f := NewHostPortFake()
	pa, pb := hpPlan(ownerA), hpPlan(ownerB)
	for _, p := range []HostPortPlan{pa, pb, pa} {
		if err := f.Apply(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Check(ctx, pa); err != nil {
		t.Error(err)
	}
	if err := f.GC(ctx, "net1", cniplumb.Owners{ownerB: true}); err != nil {
		t.Fatal(err)
	}
	if err := f.Check(ctx, pa); !IsNotFound(err) {
		t.Errorf("Check after GC = %v", err)
	}
	if err := f.Remove(ctx, ownerB, All); err != nil {
		t.Fatal(err)
	}
	if d := f.Dump(); d != "" {
		t.Errorf("left:\n%s", d)
	}
}

func TestJumpRule(t *testing.T) {
	r := Rule{Hook: NATPrerouting, Family: IPv4, Match: Match{Proto: TCP, DstPort: 80}, Action: Action{Kind: Jump, Chain: "KUBE-MARK-MASQ"}}
	if err := (Plan{Feature: HostPortFeature, Owner: ownerA, Rules: []Rule{r}}).Validate(); err != nil {
		t.Fatal(err)
	}
	if a, err := ruleArgs(r, Tag{NetworkHash: "00000000", ID: "0123456789abcdef", Fingerprint: "11111111"}); err != nil || !strings.HasSuffix(a, "-j KUBE-MARK-MASQ") {
		t.Errorf("ruleArgs = %q, %v", a, err)
	}
	if _, err := nftExprs(HostPortFeature, r); err == nil {
		t.Error("nftables accepted a jump into an iptables chain")
	}
	for _, bad := range []string{"", "-j", "A B", "X\nCOMMIT", strings.Repeat("K", 29)} {
		r.Action.Chain = bad
		if err := (Plan{Feature: HostPortFeature, Owner: ownerA, Rules: []Rule{r}}).Validate(); err == nil {
			t.Errorf("chain %q accepted", bad)
		}
	}
}
