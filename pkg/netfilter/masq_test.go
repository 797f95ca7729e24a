package netfilter

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"

	"github.com/podwire/podwire/pkg/cniplumb"
)

// Names and comments as the reference bridge v1.10.0 wrote them for network "expnet"
// (read from `iptables -S` and `nft list ruleset` after its ADD).
func TestMasqNamesMatchReference(t *testing.T) {
	if got := MasqChain(Owner{Network: "expnet", ContainerID: "ctr1", IfName: "eth0"}); got != "CNI-cc94bae7a43faa95404efc2e" {
		t.Errorf("MasqChain = %s", got)
	}
	o := Owner{Network: "expnet", ContainerID: "ctr2", IfName: "eth0"}
	if got := masqNFTComment(o); got != "b5a1a0612e405423-a09553539d4cc24c, net: expnet, if: eth0, id: ctr2" {
		t.Errorf("nft comment = %s", got)
	}
	if got := masqComment(o); got != `name: "expnet" id: "ctr2"` {
		t.Errorf("iptables comment = %s", got)
	}
	// The chain ignores the interface; the nftables identity does not.
	o2 := o
	o2.IfName = "net1"
	if MasqChain(o) != MasqChain(o2) || masqInstance(o) == masqInstance(o2) {
		t.Error("chain must not and instance must depend on the interface name")
	}
	long := Owner{Network: strings.Repeat("n", 60), ContainerID: strings.Repeat("c", 64), IfName: `e"0`}
	c := masqNFTComment(long)
	if len(c) != masqNFTCommentMax || !strings.HasPrefix(c, masqInstance(long)+", net: nnn") || strings.Contains(c, `"`) {
		t.Errorf("long comment %q: want cut at %d bytes, quotes stripped", c, masqNFTCommentMax)
	}
}

func TestParseMasqComment(t *testing.T) {
	for _, tc := range []struct {
		in      string
		net, id string
		ok      bool
	}{
		{`name: "expnet" id: "ctr1"`, "expnet", "ctr1", true},
		{`name: "a.b-c" id: "0123abc"`, "a.b-c", "0123abc", true},
		{`name: "expnet" id: "ctr1" extra`, "", "", false},
		{`pw:1234 x`, "", "", false},
		{`name: expnet id: ctr1`, "", "", false},
		{`name: "expnet"`, "", "", false},
	} {
		n, id, ok := parseMasqComment(tc.in)
		if n != tc.net || id != tc.id || ok != tc.ok {
			t.Errorf("parseMasqComment(%q) = %q %q %v", tc.in, n, id, ok)
		}
	}
}

func TestXTTokens(t *testing.T) {
	got := xtTokens(`-A POSTROUTING -s 10.77.0.2/32 -m comment --comment "name: \"expnet\" id: \"ctr1\"" -j CNI-cc94bae7a43faa95404efc2e`)
	want := []string{"-A", "POSTROUTING", "-s", "10.77.0.2/32", "-m", "comment", "--comment", `name: "expnet" id: "ctr1"`, "-j", "CNI-cc94bae7a43faa95404efc2e"}
	if d := cmp.Diff(want, got); d != "" {
		t.Error(d)
	}
	if q := xtQuote(`a"b\c`); q != `"a\"b\\c"` || xtTokens(q)[0] != `a"b\c` {
		t.Errorf("xtQuote round trip: %s -> %q", q, xtTokens(q))
	}
}

var (
	ownerE1 = Owner{Network: "expnet", ContainerID: "ctr1", IfName: "eth0"}
	chainE1 = "CNI-cc94bae7a43faa95404efc2e"
)

// refListing is what `iptables -t nat -S` showed after the reference's ADD of ctr1 at
// 10.77.0.2/24 (POSTROUTING and the chain), plus a kube-proxy jump.
const refPostrouting = `-P POSTROUTING ACCEPT
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A POSTROUTING -s 10.77.0.2/32 -m comment --comment "name: \"expnet\" id: \"ctr1\"" -j CNI-cc94bae7a43faa95404efc2e
`
const refChain = `-N CNI-cc94bae7a43faa95404efc2e
-A CNI-cc94bae7a43faa95404efc2e -d 10.77.0.0/24 -m comment --comment "name: \"expnet\" id: \"ctr1\"" -j ACCEPT
-A CNI-cc94bae7a43faa95404efc2e ! -d 224.0.0.0/4 -m comment --comment "name: \"expnet\" id: \"ctr1\"" -j MASQUERADE
`

func TestMasqXTRenderMatchesReferenceListing(t *testing.T) {
	p := MasqPlan{Owner: ownerE1, Addrs: []netip.Prefix{pfx("10.77.0.2/24")}}
	// What we would write is exactly what the reference wrote, so CHECK and
	// AppendUnique see the reference's rules as ours and the other way round.
	if err := checkMasqXT(p, IPv4, parseXTRules(refChain), true, parseXTRules(refPostrouting)); err != nil {
		t.Fatalf("check against the reference's listing: %v", err)
	}
	if lines := planMasqXTAdd(p, IPv4, parseXTRules(refChain), true, parseXTRules(refPostrouting)); lines != nil {
		t.Errorf("ADD over the reference's rules changes %q", lines)
	}
	got := strings.Join(planMasqXTAdd(p, IPv4, nil, false, nil), "\n")
	want := ":CNI-cc94bae7a43faa95404efc2e - [0:0]\n" +
		strings.TrimSpace(strings.SplitN(refChain, "\n", 2)[1]) + "\n" +
		strings.TrimSpace(strings.SplitN(refPostrouting, "\n", 3)[2])
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("fresh ADD (-want +got):\n%s", d)
	}
}

func TestPlanMasqXTAdd(t *testing.T) {
	c := `"name: \"expnet\" id: \"ctr1\""`
	two := MasqPlan{Owner: ownerE1, Addrs: []netip.Prefix{pfx("10.77.0.2/24"), pfx("10.78.0.2/24"), pfx("fd77::2/64")}}
	t.Run("fresh, two subnets, v4 only", func(t *testing.T) {
		got := strings.Join(planMasqXTAdd(two, IPv4, nil, false, nil), "\n")
		want := strings.Join([]string{
			":" + chainE1 + " - [0:0]",
			"-A " + chainE1 + " -d 10.77.0.0/24 -m comment --comment " + c + " -j ACCEPT",
			"-A " + chainE1 + " -d 10.78.0.0/24 -m comment --comment " + c + " -j ACCEPT",
			"-A " + chainE1 + " ! -d 224.0.0.0/4 -m comment --comment " + c + " -j MASQUERADE",
			"-A POSTROUTING -s 10.77.0.2/32 -m comment --comment " + c + " -j " + chainE1,
			"-A POSTROUTING -s 10.78.0.2/32 -m comment --comment " + c + " -j " + chainE1,
		}, "\n")
		if d := cmp.Diff(want, got); d != "" {
			t.Error(d)
		}
	})
	t.Run("ipv6", func(t *testing.T) {
		got := planMasqXTAdd(two, IPv6, nil, false, nil)
		if len(got) != 4 || !strings.Contains(got[2], "! -d ff00::/8") || !strings.Contains(got[3], "-s fd77::2/128") {
			t.Errorf("%q", got)
		}
	})
	t.Run("existing chain: missing subnet goes in front, missing jump appended", func(t *testing.T) {
		got := strings.Join(planMasqXTAdd(two, IPv4, parseXTRules(refChain), true, parseXTRules(refPostrouting)), "\n")
		want := strings.Join([]string{
			"-I " + chainE1 + " 1 -d 10.78.0.0/24 -m comment --comment " + c + " -j ACCEPT",
			"-A POSTROUTING -s 10.78.0.2/32 -m comment --comment " + c + " -j " + chainE1,
		}, "\n")
		if d := cmp.Diff(want, got); d != "" {
			t.Error(d)
		}
	})
	t.Run("no address of the family", func(t *testing.T) {
		p := MasqPlan{Owner: ownerE1, Addrs: []netip.Prefix{pfx("fd77::2/64")}}
		if got := planMasqXTAdd(p, IPv4, nil, false, nil); got != nil {
			t.Errorf("%q", got)
		}
	})
}

func TestPlanMasqXTDel(t *testing.T) {
	sibling := refPostrouting + `-A POSTROUTING -s 10.88.0.9/32 -m comment --comment "name: \"expnet\" id: \"ctr1\"" -j CNI-cc94bae7a43faa95404efc2e` + "\n"
	oldForm := `-A POSTROUTING -s 10.77.0.0/24 -m comment --comment "name: \"expnet\" id: \"ctr1\"" -j CNI-cc94bae7a43faa95404efc2e` + "\n"
	delJump := `-D POSTROUTING -s 10.77.0.2/32 -m comment --comment "name: \"expnet\" id: \"ctr1\"" -j ` + chainE1
	for _, tc := range []struct {
		name   string
		addrs  []netip.Prefix
		post   string
		exists bool
		want   []string
	}{
		{"reference pod, addresses known", []netip.Prefix{pfx("10.77.0.2/24")}, refPostrouting, false,
			[]string{delJump, "-F " + chainE1, "-X " + chainE1}},
		{"no prevResult: every jump", nil, sibling, false,
			[]string{delJump, strings.Replace(strings.TrimSpace(strings.Split(sibling, "\n")[3]), "-A", "-D", 1), "-F " + chainE1, "-X " + chainE1}},
		{"another interface still jumps: chain stays", []netip.Prefix{pfx("10.77.0.2/24")}, sibling, false,
			[]string{delJump}},
		{"old subnet-form jump", []netip.Prefix{pfx("10.77.0.2/24")}, oldForm, false,
			[]string{strings.Replace(strings.TrimSpace(oldForm), "-A", "-D", 1), "-F " + chainE1, "-X " + chainE1}},
		{"orphan chain without jumps", []netip.Prefix{pfx("10.77.0.2/24")}, "", true,
			[]string{"-F " + chainE1, "-X " + chainE1}},
		{"nothing there", nil, "-A POSTROUTING -j KUBE-POSTROUTING\n", false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := planMasqXTDel(ownerE1, tc.addrs, parseXTRules(tc.post), tc.exists)
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Error(d)
			}
		})
	}
}

func TestPlanMasqXTGC(t *testing.T) {
	mk := func(n, id, ip string) string {
		o := Owner{Network: n, ContainerID: id}
		return "-A POSTROUTING -s " + ip + "/32 -m comment --comment " + xtQuote(masqComment(o)) + " -j " + MasqChain(o) + "\n"
	}
	post := mk("expnet", "live", "10.77.0.2") + mk("expnet", "gone", "10.77.0.3") + mk("expnet", "gone", "10.77.0.4") +
		mk("other", "gone2", "10.66.0.3") +
		// A jump whose comment names the network but not its chain: not ours to judge.
		`-A POSTROUTING -s 10.77.0.9/32 -m comment --comment "name: \"expnet\" id: \"forged\"" -j CNI-000000000000000000000000` + "\n" +
		"-A POSTROUTING -j KUBE-POSTROUTING\n"
	keep := cniplumb.Owners{{Network: "expnet", ContainerID: "live", IfName: "net9"}: true}
	lines, stale := planMasqXTGC("expnet", keep, parseXTRules(post))
	if d := cmp.Diff([]string{"gone"}, stale); d != "" {
		t.Error(d)
	}
	ch := MasqChain(Owner{Network: "expnet", ContainerID: "gone"})
	if len(lines) != 4 || !strings.Contains(lines[0], "10.77.0.3") || !strings.Contains(lines[1], "10.77.0.4") ||
		lines[2] != "-F "+ch || lines[3] != "-X "+ch {
		t.Errorf("lines %q", lines)
	}
	if lines, _ := planMasqXTGC("expnet", cniplumb.Owners{{Network: "expnet", ContainerID: "gone", IfName: "eth0"}: true, {Network: "expnet", ContainerID: "live", IfName: "eth0"}: true}, parseXTRules(post)); lines != nil {
		t.Errorf("all kept, yet %q", lines)
	}
}

func TestCheckMasqXT(t *testing.T) {
	p := MasqPlan{Owner: ownerE1, Addrs: []netip.Prefix{pfx("10.77.0.2/24")}}
	if err := checkMasqXT(p, IPv4, nil, false, nil); !IsNotFound(err) {
		t.Errorf("absent chain: %v", err)
	}
	if err := checkMasqXT(p, IPv4, parseXTRules(refChain), true, nil); err == nil || IsNotFound(err) || !strings.Contains(err.Error(), "jump") {
		t.Errorf("missing jump: %v", err)
	}
	if err := checkMasqXT(p, IPv4, parseXTRules(refChain)[:1], true, parseXTRules(refPostrouting)); err == nil || !strings.Contains(err.Error(), "MASQUERADE") {
		t.Errorf("missing masquerade: %v", err)
	}
}

func withComment(r *nftables.Rule, c string) *nftables.Rule {
	r.UserData = userdata.AppendString(nil, userdata.TypeComment, c)
	return r
}

func TestMasqNFTRulesReadBack(t *testing.T) {
	tab := masqNFTTable()
	checks, post := masqNFTChains(tab)
	p := MasqPlan{Owner: ownerE1, Addrs: []netip.Prefix{pfx("10.77.0.2/24"), pfx("10.1.16.7/20"), pfx("fd77::2/64"), pfx("fd00:1::9/60")}}
	rs := masqNFTRules(tab, checks, p)
	var got []string
	for _, r := range rs {
		got = append(got, describeMasqNFT(r))
		if ruleComment(r) != masqNFTComment(ownerE1) {
			t.Errorf("comment %q", ruleComment(r))
		}
	}
	if d := cmp.Diff(masqNFTWant(p), got); d != "" {
		t.Error(d)
	}
	// nft's bytecode for "ip daddr != 10.77.0.0/24": three bytes, no mask.
	if pl := rs[0].Exprs[4].(*expr.Payload); pl.Len != 3 || pl.Offset != 16 {
		t.Errorf("byte-aligned prefix loads %d bytes at %d", pl.Len, pl.Offset)
	}
	if _, ok := rs[1].Exprs[5].(*expr.Bitwise); !ok {
		t.Errorf("a /20 needs a mask: %#v", rs[1].Exprs)
	}
	if err := checkMasqNFT(p, rs, hasGoto(masqNFTPostRules(tab, post))); err != nil {
		t.Errorf("check: %v", err)
	}
	if err := checkMasqNFT(p, rs[1:], true); err == nil || IsNotFound(err) {
		t.Errorf("check with a rule missing: %v", err)
	}
	if err := checkMasqNFT(p, rs, false); err == nil {
		t.Error("check without the goto passed")
	}
	if err := checkMasqNFT(p, nil, true); !IsNotFound(err) {
		t.Errorf("check of nothing: %v", err)
	}
}

func TestMasqNFTSelectAndStale(t *testing.T) {
	tab := masqNFTTable()
	checks, _ := masqNFTChains(tab)
	a := Owner{Network: "expnet", ContainerID: "a", IfName: "eth0"}
	aNet1 := Owner{Network: "expnet", ContainerID: "a", IfName: "net1"}
	b := Owner{Network: "expnet", ContainerID: strings.Repeat("b", 200), IfName: "eth0"} // comment cut at 128
	other := Owner{Network: "othernet", ContainerID: "a", IfName: "eth0"}
	var rules []*nftables.Rule
	for _, o := range []Owner{a, aNet1, b, other} {
		rules = append(rules, masqNFTRules(tab, checks, MasqPlan{Owner: o, Addrs: []netip.Prefix{pfx("10.77.0.2/24"), pfx("fd77::2/64")}})...)
	}
	rules = append(rules, withComment(&nftables.Rule{}, "someone else's"), &nftables.Rule{})
	if got := selectMasqNFT(rules, a); len(got) != 2 || got[0] != rules[0] || got[1] != rules[1] {
		t.Errorf("select a: %d rules", len(got))
	}
	stale := staleMasqNFT(rules, "expnet", cniplumb.Owners{aNet1: true})
	var owners []string
	for _, r := range stale {
		owners = append(owners, ruleComment(r)[:masqInstanceLen])
	}
	want := []string{masqInstance(a), masqInstance(a), masqInstance(b), masqInstance(b)}
	if d := cmp.Diff(want, owners); d != "" {
		t.Errorf("stale (-want +got):\n%s", d)
	}
}

func TestPickMasq(t *testing.T) {
	both := MasqProbe{Probe: Probe{IPTables: true, NFTables: true}, RefNFT: true}
	for _, tc := range []struct {
		name string
		want Kind
		p    MasqProbe
		got  Kind
		code uint
	}{
		{"auto, reference can use nft: nftables", Auto, both, KindNFTables, 0},
		{"auto, nft too old or missing: the reference's iptables", Auto, MasqProbe{Probe: Probe{IPTables: true, NFTables: true}}, KindIPTables, 0},
		{"auto, only iptables", Auto, MasqProbe{Probe: Probe{IPTables: true}}, KindIPTables, 0},
		{"auto, only the kernel's nf_tables", Auto, MasqProbe{Probe: Probe{NFTables: true}}, KindNFTables, 0},
		{"auto, nothing", Auto, MasqProbe{}, "", 50},
		{"configured iptables", KindIPTables, both, KindIPTables, 0},
		{"configured nftables without nft binary", KindNFTables, MasqProbe{Probe: Probe{NFTables: true}}, KindNFTables, 0},
		{"configured iptables missing", KindIPTables, MasqProbe{Probe: Probe{NFTables: true}}, "", 50},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k, err := PickMasq(tc.want, tc.p)
			if k != tc.got || cniplumb.Code(err) != tc.code {
				t.Errorf("PickMasq = %q, %v (code %d)", k, err, cniplumb.Code(err))
			}
		})
	}
}

func TestNFTVersionOK(t *testing.T) {
	for in, ok := range map[string]bool{
		"nftables v1.0.6 (Lester Gooch #5)\n":   true,
		"nftables v1.0.1 (Fearless Fosdick #3)": true,
		"nftables v1.1.0 (Commodore Bullmoose)": true,
		"nftables v1.0.0 (Fearless Fosdick)":    false,
		"nftables v0.9.8 (E.D.S.)":              false,
		"":                                      false,
	} {
		if nftVersionOK(in) != ok {
			t.Errorf("nftVersionOK(%q) = %v", in, !ok)
		}
	}
}

func TestMasqPlanValidate(t *testing.T) {
	ok := MasqPlan{Owner: ownerE1, Addrs: []netip.Prefix{pfx("10.77.0.2/24")}}
	if err := ok.Validate(); err != nil {
		t.Error(err)
	}
	long := ok
	long.Owner.Network = strings.Repeat("n", 250)
	if err := long.Validate(); err == nil || !strings.Contains(err.Error(), "255") {
		t.Errorf("long names: %v", err)
	}
	bad := ok
	bad.Addrs = []netip.Prefix{{}}
	if err := bad.Validate(); err == nil {
		t.Error("invalid address accepted")
	}
}
