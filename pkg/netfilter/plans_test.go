// SPDX-License-Identifier: Apache-2.0

package netfilter

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// Plans: validation, the neutral rules they become, and their renderings.

func mustPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func mustAddr(s string) netip.Addr     { return netip.MustParseAddr(s) }

func hpPlan(o Owner) HostPortPlan {
	return HostPortPlan{
		Owner: o, SNAT: true, Mark: 0x2000,
		Ports: []HostPort{
			{Proto: TCP, HostPort: 8080, Pod: mustPrefix("10.88.0.5/16"), ContainerPort: 80},
			{Proto: UDP, HostPort: 5353, HostIP: mustAddr("192.0.2.1"), Pod: mustPrefix("10.88.0.5/16"), ContainerPort: 53},
			{Proto: TCP, HostPort: 8080, Pod: mustPrefix("fd88::5/64"), ContainerPort: 80},
		},
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
	if hpPlan(ownerA).Families() != All {
		t.Errorf("families = %v", hpPlan(ownerA).Families())
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
	p.Conditions = map[Family]Match{IPv4: {Src: mustPrefix("10.0.0.0/8"), NotSrc: true, InIface: "eth0"}}
	r, err := p.Rules()
	if err != nil {
		t.Fatal(err)
	}
	// Conditions go on the DNAT only: a mark only matters to connections it sent on.
	if got := r.String(); !strings.Contains(got, "nat/prerouting ipv4 iif eth0 saddr != 10.0.0.0/8 daddr type local tcp dport 8080 dnat to 10.88.0.5:80") ||
		strings.Count(got, "iif eth0") != 4 {
		t.Errorf("conditions not on the DNATs alone:\n%s", got)
	}
	// A destination condition combines with hostIP: implied, or impossible.
	p.Conditions = map[Family]Match{IPv4: {Dst: mustPrefix("192.0.2.0/24")}}
	if r, err = p.Rules(); err != nil || !strings.Contains(r.String(), "daddr == 192.0.2.1/32 daddr type local udp dport 5353 dnat") {
		t.Errorf("implied destination: %v\n%s", err, r)
	}
	p.Conditions = map[Family]Match{IPv4: {Dst: mustPrefix("192.0.2.0/24"), NotDst: true}}
	if _, err := p.Rules(); err == nil || !strings.Contains(err.Error(), "could never match") {
		t.Errorf("excluded hostIP: %v", err)
	}
}

func TestHostPortPlanValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(p *HostPortPlan)
		want string
	}{
		{"host port 0", func(p *HostPortPlan) { p.Ports[0].HostPort = 0 }, "ports must be 1-65535"},
		{"container port 0", func(p *HostPortPlan) { p.Ports[0].ContainerPort = 0 }, "ports must be 1-65535"},
		{"protocol", func(p *HostPortPlan) { p.Ports[0].Proto = "icmp" }, "unknown protocol"},
		{"no pod address", func(p *HostPortPlan) { p.Ports[0].Pod = netip.Prefix{} }, "no pod address"},
		{"host address of the other family", func(p *HostPortPlan) { p.Ports[2].HostIP = mustAddr("192.0.2.1") }, "family"},
		{"mark of two bits", func(p *HostPortPlan) { p.Mark = 0x3000 }, "not a single bit"},
		{"no mark", func(p *HostPortPlan) { p.Mark = 0 }, "not a single bit"},
		{"mark chain that is no name", func(p *HostPortPlan) { p.SetMarkChain = "-j ACCEPT" }, "not a usable iptables chain name"},
		{"protocol condition", func(p *HostPortPlan) { p.Conditions = map[Family]Match{IPv4: {Proto: TCP}} }, "may only match"},
		{"condition of the other family", func(p *HostPortPlan) { p.Conditions = map[Family]Match{IPv4: {Src: mustPrefix("fd00::/8")}} }, "is not an ipv4 prefix"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := hpPlan(ownerA)
			tc.edit(&p)
			if err := p.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate = %v, want an error containing %q", err, tc.want)
			}
		})
	}
	ok := hpPlan(ownerA)
	ok.Ports[0].HostIP = netip.IPv4Unspecified() // 0.0.0.0: every local address
	ok.SNAT, ok.Mark = false, 0                  // no marking, no mark needed
	if err := ok.Validate(); err != nil {
		t.Errorf("valid plan: %v", err)
	}
}

func TestHostPortRenderIPTables(t *testing.T) {
	p := hpPlan(ownerA)
	p.Conditions = map[Family]Match{IPv4: {Dst: mustPrefix("192.0.2.0/24"), InIface: "eth0"}}
	r, err := renderHostPortIPTables(IPv4, p)
	if err != nil {
		t.Fatal(err)
	}
	chain := HostPortChain("net1", "aaaa")
	strip := func(s string) string { // the tag text is tested elsewhere
		i := strings.Index(s, `-m comment --comment "pw:`)
		j := strings.Index(s[i+1:], `" `)
		return s[:i] + "TAG" + s[i+1+j+1:]
	}
	var got []string
	for _, l := range append(append([]string{}, r.jumps...), r.rules...) {
		got = append(got, strip(l))
	}
	// The conditions go on the jumps (as the reference's conditionsV4), the DNATs
	// carry the host address.
	want := []string{
		"-d 192.0.2.0/24 -i eth0 -p tcp -m multiport --dports 8080 TAG -j " + chain,
		"-d 192.0.2.0/24 -i eth0 -p udp -m multiport --dports 5353 TAG -j " + chain,
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

	// 20 ports of one protocol need two multiport jumps; a repeated port is listed
	// once; the external mark chain is a jump, with no masquerade of podwire's.
	q := HostPortPlan{Owner: ownerA, SNAT: true, SetMarkChain: "KUBE-MARK-MASQ"}
	for i := range 20 {
		q.Ports = append(q.Ports, HostPort{Proto: TCP, HostPort: uint16(9000 + i), Pod: mustPrefix("10.88.0.5/16"), ContainerPort: 80})
	}
	q.Ports = append(q.Ports, q.Ports[0])
	if r, err = renderHostPortIPTables(IPv4, q); err != nil {
		t.Fatal(err)
	}
	if len(r.jumps) != 2 || !strings.HasPrefix(r.jumps[0], "-p tcp -m multiport --dports 9000,9001,9002,9003,9004,9005,9006,9007,9008,9009,9010,9011,9012,9013,9014 ") ||
		!strings.HasPrefix(r.jumps[1], "-p tcp -m multiport --dports 9015,9016,9017,9018,9019 ") {
		t.Errorf("multiport split: %q", r.jumps)
	}
	if !strings.HasSuffix(r.rules[0], "-j KUBE-MARK-MASQ") || q.masquerades() {
		t.Errorf("external mark chain: %s", r.rules[0])
	}
	if r, err = renderHostPortIPTables(IPv6, q); err != nil || len(r.jumps)+len(r.rules) != 0 {
		t.Errorf("IPv6 of an IPv4 plan: %+v, %v", r, err)
	}
}

func TestMasqPlanValidate(t *testing.T) {
	ok := MasqPlan{Owner: ownerA, Addrs: []netip.Prefix{mustPrefix("10.77.0.2/24"), mustPrefix("fd77::2/64")}}
	if err := ok.Validate(); err != nil {
		t.Error(err)
	}
	if ok.Families() != All {
		t.Errorf("families %v", ok.Families())
	}
	if got := ok.String(); got != "masquerade net1/aaaa/eth0 from 10.77.0.2 except to 10.77.0.0/24 and 224.0.0.0/4\n"+
		"masquerade net1/aaaa/eth0 from fd77::2 except to fd77::/64 and ff00::/8\n" {
		t.Errorf("String:\n%s", got)
	}
	// Names beyond the comment limit are cut, not refused (TestMasqCommentCut).
	long := ok
	long.Owner.ContainerID = strings.Repeat("c", 1000)
	if err := long.Validate(); err != nil {
		t.Errorf("long container ID: %v", err)
	}
	for name, bad := range map[string]MasqPlan{
		"no network":       {Owner: Owner{ContainerID: "c"}, Addrs: ok.Addrs},
		"no container":     {Owner: Owner{Network: "n"}, Addrs: ok.Addrs},
		"invalid address":  {Owner: ownerA, Addrs: []netip.Prefix{{}}},
		"IPv4-mapped IPv6": {Owner: ownerA, Addrs: []netip.Prefix{mustPrefix("::ffff:10.0.0.1/120")}},
	} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

var testFeature = Feature{Name: "test", Hooks: []Hook{NATPostrouting, NATPrerouting}}

func TestPlanValidate(t *testing.T) {
	h := NATPostrouting
	for _, tc := range []struct {
		name string
		r    Rule
		want string
	}{
		{"foreign hook", Rule{Hook: NATOutput, Family: IPv4, Action: Action{Kind: Return}}, "not one of feature"},
		{"family mismatch", Rule{Hook: h, Family: IPv6, Match: Match{Src: mustPrefix("10.0.0.1/32")}, Action: Action{Kind: Return}}, "is not ipv6"},
		{"port without proto", Rule{Hook: h, Family: IPv4, Match: Match{DstPort: 80}, Action: Action{Kind: Return}}, "needs a protocol"},
		{"bad proto", Rule{Hook: h, Family: IPv4, Match: Match{Proto: "icmp"}, Action: Action{Kind: Return}}, "unknown protocol"},
		{"no action", Rule{Hook: h, Family: IPv4}, "no action"},
		{"dnat without addr", Rule{Hook: h, Family: IPv4, Action: Action{Kind: DNAT}}, "DNAT needs"},
		{"address without family", Rule{Hook: h, Match: Match{Src: mustPrefix("10.0.0.1/32")}, Action: Action{Kind: Return}}, "needs a family"},
		{"long interface", Rule{Hook: h, Family: IPv4, Match: Match{InIface: strings.Repeat("i", 16)}, Action: Action{Kind: Return}}, "longer than 15"},
		{"jump to no name", Rule{Hook: h, Family: IPv4, Action: Action{Kind: Jump, Chain: "X\nCOMMIT"}}, "not a usable iptables chain name"},
		{"NAT in a filter hook", Rule{Hook: filterInput, Family: IPv4, Action: Action{Kind: Masquerade}}, "nat hook"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := testFeature
			f.Hooks = append(f.Hooks, filterInput)
			if tc.name == "foreign hook" {
				f = testFeature
			}
			err := Plan{Feature: f, Owner: ownerA, Rules: []Rule{tc.r}}.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate = %v, want error containing %q", err, tc.want)
			}
		})
	}
	if err := (Plan{Owner: ownerA}).Validate(); err == nil {
		t.Error("a plan without feature was accepted")
	}
	for _, bad := range []string{"", "-j", "A B", "X\nCOMMIT", strings.Repeat("K", 29), "!x"} {
		if validChainName(bad) {
			t.Errorf("chain name %q accepted", bad)
		}
	}
	if !validChainName("KUBE-MARK-MASQ") || !validChainName(strings.Repeat("K", 28)) {
		t.Error("valid chain names refused")
	}
}

func TestRuleArgs(t *testing.T) {
	const c = "pw:00000000:0123456789abcdef:11111111"
	for _, tc := range []struct {
		r    Rule
		want string
	}{
		{Rule{Hook: NATPostrouting, Family: IPv4, Match: Match{Src: mustPrefix("10.1.2.3/32"), Dst: mustPrefix("10.1.2.9/24")}, Action: Action{Kind: Accept}},
			`-s 10.1.2.3/32 -d 10.1.2.0/24 -m comment --comment "` + c + `" -j ACCEPT`},
		{Rule{Hook: NATPostrouting, Family: IPv6, Match: Match{Src: mustPrefix("fd00::3/128")}, Action: Action{Kind: Masquerade}},
			`-s fd00::3/128 -m comment --comment "` + c + `" -j MASQUERADE`},
		{Rule{Hook: NATPrerouting, Family: IPv4, Match: Match{Dst: mustPrefix("192.0.2.1/32"), Proto: TCP, DstPort: 8080, DstLocal: true},
			Action: Action{Kind: DNAT, Addr: mustAddr("10.0.0.2"), Port: 80}},
			`-d 192.0.2.1/32 -p tcp -m tcp --dport 8080 -m addrtype --dst-type LOCAL -m comment --comment "` + c + `" -j DNAT --to-destination 10.0.0.2:80`},
		{Rule{Hook: NATPrerouting, Family: IPv6, Match: Match{Proto: UDP, DstPort: 53, Mark: 0x2000},
			Action: Action{Kind: DNAT, Addr: mustAddr("fd00::2"), Port: 5353}},
			`-p udp -m udp --dport 53 -m mark --mark 0x2000/0x2000 -m comment --comment "` + c + `" -j DNAT --to-destination [fd00::2]:5353`},
		{Rule{Hook: NATPrerouting, Family: IPv4, Match: Match{Src: mustPrefix("10.0.0.0/8"), NotSrc: true, InIface: "eth0"}, Action: Action{Kind: SetMark, Mark: 0x4000}},
			`! -s 10.0.0.0/8 -i eth0 -m comment --comment "` + c + `" -j MARK --set-xmark 0x4000/0x4000`},
		{Rule{Hook: NATPrerouting, Family: IPv4, Match: Match{Proto: TCP, DstPort: 80}, Action: Action{Kind: Jump, Chain: "KUBE-MARK-MASQ"}},
			`-p tcp -m tcp --dport 80 -m comment --comment "` + c + `" -j KUBE-MARK-MASQ`},
	} {
		got, err := ruleArgs(tc.r, c)
		if err != nil {
			t.Fatal(err)
		}
		if got != tc.want {
			t.Errorf("ruleArgs(%s)\n got %s\nwant %s", tc.r, got, tc.want)
		}
	}
	if _, err := ruleArgs(Rule{Hook: filterInput, Action: Action{Kind: Drop}}, ""); err == nil {
		t.Error("a rule without family rendered for iptables")
	}
}

// filterInput is a hook of the filter type, for rules that must not be NAT.
var filterInput = Hook{Name: "input", Type: "filter", Priority: 0}

func TestNFTExprs(t *testing.T) {
	bad := Rule{Hook: filterInput, Family: IPv4, Match: Match{Src: mustPrefix("10.0.0.1/32")}, Action: Action{Kind: Drop}}
	jump := Rule{Hook: NATPrerouting, Family: IPv4, Action: Action{Kind: Jump, Chain: "KUBE-MARK-MASQ"}}
	if _, err := nftExprs(jump); err == nil {
		t.Error("nftables accepted a jump into an iptables chain")
	}
	tag := tagFor(ownerA, bad)
	if got, ok := ParseTag(ruleComment(&nftables.Rule{UserData: encodeTag(tag)})); !ok || got != tag {
		t.Errorf("userdata round trip: %+v %v", got, ok)
	}
}

// The reference's nftables masquerade rules come from nft, which loads just the
// prefix's bytes for a byte-aligned prefix and masks the whole address otherwise;
// podwire writes the same bytecode, so CHECK compares equal rules as equal.
func TestMasqNFTBytecode(t *testing.T) {
	e := masqNFTRuleExprs(mustPrefix("10.77.0.2/24"))
	if pl, ok := e[4].(*expr.Payload); !ok || pl.Len != 3 || pl.Offset != 16 {
		t.Errorf("ip daddr != 10.77.0.0/24 loads %#v", e[4])
	}
	e = masqNFTRuleExprs(mustPrefix("10.1.16.7/20"))
	if _, ok := e[5].(*expr.Bitwise); !ok {
		t.Errorf("a /20 needs a mask: %#v", e)
	}
	e = masqNFTRuleExprs(mustPrefix("fd77::2/64"))
	if pl, ok := e[4].(*expr.Payload); !ok || pl.Len != 8 || pl.Offset != 24 {
		t.Errorf("ip6 daddr != fd77::/64 loads %#v", e[4])
	}
}
