package netfilter

import (
	"context"
	"errors"
	"math/rand"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/podwire/podwire/pkg/cniplumb"
)

var (
	ownerA = Owner{Network: "net1", ContainerID: "aaaa", IfName: "eth0"}
	ownerB = Owner{Network: "net1", ContainerID: "bbbb", IfName: "eth0"}
	ownerC = Owner{Network: "net2", ContainerID: "aaaa", IfName: "eth0"}
)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func TestPlanMasquerade(t *testing.T) {
	p := PlanMasquerade(ownerA, []netip.Prefix{pfx("10.1.2.3/24"), pfx("fd00::5/64")})
	want := `nat/postrouting ipv4 saddr == 10.1.2.3/32 daddr == 10.1.2.0/24 return
nat/postrouting ipv4 saddr == 10.1.2.3/32 daddr == 224.0.0.0/4 return
nat/postrouting ipv4 saddr == 10.1.2.3/32 masquerade
nat/postrouting ipv6 saddr == fd00::5/128 daddr == fd00::/64 return
nat/postrouting ipv6 saddr == fd00::5/128 daddr == ff00::/8 return
nat/postrouting ipv6 saddr == fd00::5/128 masquerade
`
	if d := cmp.Diff(want, p.String()); d != "" {
		t.Errorf("plan (-want +got):\n%s", d)
	}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	if p.Families() != All {
		t.Errorf("families = %v, want both", p.Families())
	}
}

func TestTagRoundTrip(t *testing.T) {
	r := PlanMasquerade(ownerA, []netip.Prefix{pfx("10.1.2.3/24")}).Rules[0]
	tag := tagFor(ownerA, r)
	s := tag.String()
	if !strings.HasPrefix(s, "pw:") || !strings.HasSuffix(s, " net1/aaaa/eth0") {
		t.Errorf("tag text %q", s)
	}
	got, ok := ParseTag(`"` + s + `"`)
	if !ok || got != tag {
		t.Fatalf("ParseTag(%q) = %+v, %v; want %+v", s, got, ok, tag)
	}
	if !got.Is(ownerA) || got.Is(ownerB) || !got.InNetwork("net1") || got.InNetwork("net2") {
		t.Errorf("ownership predicates wrong for %+v", got)
	}
	long := Owner{Network: strings.Repeat("n", 90), ContainerID: strings.Repeat("c", 64), IfName: "eth0"}
	lt := tagFor(long, r)
	if len(lt.String()) > maxTag {
		t.Errorf("tag of a long owner is %d bytes", len(lt.String()))
	}
	back, ok := ParseTag(lt.String())
	if !ok || !back.Is(long) || back.Owner != (Owner{}) || !back.InNetwork(long.Network) {
		t.Errorf("long-owner tag %q parsed as %+v", lt, back)
	}
	for _, bad := range []string{"", "KUBE-MARK", "pw:zz", "pw:12345678:0123456789abcdef", `name: "x" id: "y"`} {
		if _, ok := ParseTag(bad); ok {
			t.Errorf("ParseTag(%q) accepted a foreign comment", bad)
		}
	}
}

func TestStale(t *testing.T) {
	r := Rule{Hook: NATPostrouting, Family: IPv4, Action: Action{Kind: Masquerade}}
	tags := []Tag{tagFor(ownerA, r), tagFor(ownerA, r), tagFor(ownerB, r), tagFor(ownerC, r)}
	got := Stale(tags, "net1", cniplumb.Owners{ownerB: true, ownerC: true})
	if len(got) != 1 || !got[0].Is(ownerA) {
		t.Errorf("Stale = %+v, want only ownerA", got)
	}
	if got := Stale(tags, "net2", cniplumb.Owners{}); len(got) != 1 || !got[0].Is(ownerC) {
		t.Errorf("Stale(net2) = %+v, want only ownerC (other networks are not ours to collect)", got)
	}
}

func TestPick(t *testing.T) {
	for _, tc := range []struct {
		want    Kind
		probe   Probe
		got     Kind
		errCode uint
	}{
		{Auto, Probe{IPTables: true, NFTables: true}, KindNFTables, 0},
		{Auto, Probe{IPTables: true}, KindIPTables, 0},
		{Auto, Probe{NFTables: true}, KindNFTables, 0},
		{Auto, Probe{}, "", 50},
		{KindIPTables, Probe{IPTables: true, NFTables: true}, KindIPTables, 0},
		{KindIPTables, Probe{NFTables: true}, "", 50},
		{KindNFTables, Probe{IPTables: true}, "", 50},
		{KindNFTables, Probe{NFTables: true}, KindNFTables, 0},
	} {
		k, err := Pick(tc.want, tc.probe)
		if k != tc.got || cniplumb.Code(err) != tc.errCode {
			t.Errorf("Pick(%q, %+v) = %q, %v; want %q, code %d", tc.want, tc.probe, k, err, tc.got, tc.errCode)
		}
	}
	if _, err := ParseKind("ipMasqBackend", "ebtables"); cniplumb.Code(err) != 7 || !strings.Contains(err.Error(), "ebtables") {
		t.Errorf("ParseKind(ebtables) = %v, want a code-7 error naming it", err)
	}
}

func TestValidate(t *testing.T) {
	h := NATPostrouting
	for _, tc := range []struct {
		name string
		r    Rule
		want string
	}{
		{"foreign hook", Rule{Hook: NATPrerouting, Family: IPv4, Action: Action{Kind: Return}}, "not one of feature"},
		{"family mismatch", Rule{Hook: h, Family: IPv6, Match: Match{Src: pfx("10.0.0.1/32")}, Action: Action{Kind: Return}}, "is not ipv6"},
		{"port without proto", Rule{Hook: h, Family: IPv4, Match: Match{DstPort: 80}, Action: Action{Kind: Return}}, "needs a protocol"},
		{"bad proto", Rule{Hook: h, Family: IPv4, Match: Match{Proto: "icmp"}, Action: Action{Kind: Return}}, "unknown protocol"},
		{"no action", Rule{Hook: h, Family: IPv4}, "no action"},
		{"dnat without addr", Rule{Hook: h, Family: IPv4, Action: Action{Kind: DNAT}}, "DNAT needs"},
		{"address without family", Rule{Hook: h, Match: Match{Src: pfx("10.0.0.1/32")}, Action: Action{Kind: Return}}, "needs a family"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Plan{Feature: MasqFeature, Owner: ownerA, Rules: []Rule{tc.r}}.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate = %v, want error containing %q", err, tc.want)
			}
		})
	}
}

func TestRuleArgs(t *testing.T) {
	tag := Tag{NetworkHash: "00000000", ID: "0123456789abcdef", Fingerprint: "11111111"}
	for _, tc := range []struct {
		r    Rule
		want string
	}{
		{PlanMasquerade(ownerA, []netip.Prefix{pfx("10.1.2.3/24")}).Rules[0],
			`-s 10.1.2.3/32 -d 10.1.2.0/24 -m comment --comment "pw:00000000:0123456789abcdef:11111111" -j RETURN`},
		{PlanMasquerade(ownerA, []netip.Prefix{pfx("fd00::3/64")}).Rules[2],
			`-s fd00::3/128 -m comment --comment "pw:00000000:0123456789abcdef:11111111" -j MASQUERADE`},
		{Rule{Hook: NATPrerouting, Family: IPv4, Match: Match{Dst: pfx("192.0.2.1/32"), Proto: TCP, DstPort: 8080, DstLocal: true},
			Action: Action{Kind: DNAT, Addr: netip.MustParseAddr("10.0.0.2"), Port: 80}},
			`-d 192.0.2.1/32 -p tcp -m tcp --dport 8080 -m addrtype --dst-type LOCAL -m comment --comment "pw:00000000:0123456789abcdef:11111111" -j DNAT --to-destination 10.0.0.2:80`},
		{Rule{Hook: NATPrerouting, Family: IPv6, Match: Match{Proto: UDP, DstPort: 53, Mark: 0x2000},
			Action: Action{Kind: DNAT, Addr: netip.MustParseAddr("fd00::2"), Port: 5353}},
			`-p udp -m udp --dport 53 -m mark --mark 0x2000/0x2000 -m comment --comment "pw:00000000:0123456789abcdef:11111111" -j DNAT --to-destination [fd00::2]:5353`},
		{Rule{Hook: NATPrerouting, Family: IPv4, Match: Match{Src: pfx("10.0.0.0/8"), NotSrc: true}, Action: Action{Kind: SetMark, Mark: 0x4000}},
			`! -s 10.0.0.0/8 -m comment --comment "pw:00000000:0123456789abcdef:11111111" -j MARK --set-xmark 0x4000/0x4000`},
	} {
		got, err := ruleArgs(tc.r, tag)
		if err != nil {
			t.Fatal(err)
		}
		if got != tc.want {
			t.Errorf("ruleArgs(%s)\n got %s\nwant %s", tc.r, got, tc.want)
		}
	}
}

// listingOf renders what `iptables -S` would print for a chain holding plans' rules.
func listingOf(t *testing.T, chain string, plans ...Plan) string {
	t.Helper()
	out := "-N " + chain + "\n"
	for _, p := range plans {
		for _, r := range p.Rules {
			a, err := ruleArgs(r, tagFor(p.Owner, r))
			if err != nil {
				t.Fatal(err)
			}
			out += "-A " + chain + " " + a + "\n"
		}
	}
	return out
}

func TestPlanIPTables(t *testing.T) {
	pa := PlanMasquerade(ownerA, []netip.Prefix{pfx("10.1.2.3/24")})
	pb := PlanMasquerade(ownerB, []netip.Prefix{pfx("10.1.2.4/24")})
	const chain = "PW-MASQ-POSTROUTING"
	h := NATPostrouting
	tagLine := func(p Plan, i int) string {
		a, _ := ruleArgs(p.Rules[i], tagFor(p.Owner, p.Rules[i]))
		return chain + " " + a
	}
	empty := map[Hook]chainListing{h: {}}
	onlyA := map[Hook]chainListing{h: parseListing(listingOf(t, chain, pa))}
	both := map[Hook]chainListing{h: parseListing(listingOf(t, chain, pa, pb))}

	for _, tc := range []struct {
		name  string
		id    OwnerID
		p     *Plan
		state map[Hook]chainListing
		fam   Family
		keep  bool
		want  []string
	}{
		{name: "first rule creates chain and jump", id: IDOf(ownerA), p: &pa, state: empty, fam: IPv4, want: []string{
			"*nat", ":" + chain + " - [0:0]", `-A POSTROUTING -m comment --comment "podwire masq" -j ` + chain,
			"-A " + tagLine(pa, 0), "-A " + tagLine(pa, 1), "-A " + tagLine(pa, 2), "COMMIT"}},
		{name: "second owner appends", id: IDOf(ownerB), p: &pb, state: onlyA, fam: IPv4, want: []string{
			"*nat", "-A " + tagLine(pb, 0), "-A " + tagLine(pb, 1), "-A " + tagLine(pb, 2), "COMMIT"}},
		{name: "re-apply replaces", id: IDOf(ownerA), p: &pa, state: onlyA, fam: IPv4, want: []string{
			"*nat", "-D " + tagLine(pa, 0), "-D " + tagLine(pa, 1), "-D " + tagLine(pa, 2),
			"-A " + tagLine(pa, 0), "-A " + tagLine(pa, 1), "-A " + tagLine(pa, 2), "COMMIT"}},
		{name: "remove one of two", id: IDOf(ownerA), state: both, fam: IPv4, want: []string{
			"*nat", "-D " + tagLine(pa, 0), "-D " + tagLine(pa, 1), "-D " + tagLine(pa, 2), "COMMIT"}},
		{name: "remove last drops chain", id: IDOf(ownerA), state: onlyA, fam: IPv4, want: []string{
			"*nat", `-D POSTROUTING -m comment --comment "podwire masq" -j ` + chain, "-F " + chain, "-X " + chain, "COMMIT"}},
		{name: "remove last keeping chains", id: IDOf(ownerA), state: onlyA, fam: IPv4, keep: true, want: []string{
			"*nat", "-D " + tagLine(pa, 0), "-D " + tagLine(pa, 1), "-D " + tagLine(pa, 2), "COMMIT"}},
		{name: "remove absent is a no-op", id: IDOf(ownerB), state: empty, fam: IPv4},
		{name: "remove absent owner from existing chain is a no-op", id: IDOf(ownerB), state: onlyA, fam: IPv4},
		{name: "ipv6 apply of ipv4 plan is a no-op", id: IDOf(ownerA), p: &pa, state: empty, fam: IPv6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := planIPTables(tc.fam, MasqFeature, tc.id, tc.p, tc.state, tc.keep)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			if !s.empty() {
				got = strings.Split(strings.TrimSpace(s.String()), "\n")
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("script (-want +got):\n%s", d)
			}
		})
	}
}

func TestParseListingForeignRules(t *testing.T) {
	l := parseListing(`-N PW-MASQ-POSTROUTING
-A PW-MASQ-POSTROUTING -s 10.0.0.9/32 -j MASQUERADE
-A PW-MASQ-POSTROUTING -s 10.0.0.8/32 -m comment --comment KUBE -j MASQUERADE
`)
	if !l.exists || len(l.rules) != 2 || l.rules[0].ours || l.rules[1].ours {
		t.Fatalf("listing = %+v", l)
	}
	// A foreign rule keeps the chain alive when our last rule goes.
	s, err := planIPTables(IPv4, MasqFeature, IDOf(ownerA), nil, map[Hook]chainListing{NATPostrouting: l}, false)
	if err != nil || !s.empty() {
		t.Errorf("removing an absent owner next to foreign rules: %v %q", err, s)
	}
}

func TestSplitArgs(t *testing.T) {
	got := xtTokens(`POSTROUTING -m comment --comment "podwire masq" -j X`)
	want := []string{"POSTROUTING", "-m", "comment", "--comment", "podwire masq", "-j", "X"}
	if d := cmp.Diff(want, got); d != "" {
		t.Error(d)
	}
}

func TestNFTExprs(t *testing.T) {
	for _, p := range []Plan{
		PlanMasquerade(ownerA, []netip.Prefix{pfx("10.1.2.3/24"), pfx("fd00::5/64")}),
		PlanMacSpoof(ownerA, "veth1234", net.HardwareAddr{2, 0, 0, 0, 0, 1}),
		{Feature: Feature{Name: "hp", Hooks: []Hook{NATPrerouting}}, Owner: ownerA, Rules: []Rule{
			{Hook: NATPrerouting, Family: IPv4, Match: Match{Proto: TCP, DstPort: 80, DstLocal: true, Mark: 1},
				Action: Action{Kind: DNAT, Addr: netip.MustParseAddr("10.0.0.2"), Port: 8080}},
			{Hook: NATPrerouting, Family: IPv6, Action: Action{Kind: SetMark, Mark: 0x2000}},
		}},
	} {
		for _, r := range p.Rules {
			e, err := nftExprs(p.Feature, r)
			if err != nil || len(e) == 0 {
				t.Errorf("nftExprs(%s) = %d exprs, %v", r, len(e), err)
			}
		}
	}
	bad := Rule{Hook: BridgePrerouting, Family: IPv4, Match: Match{Src: pfx("10.0.0.1/32")}, Action: Action{Kind: Drop}}
	if _, err := nftExprs(MacSpoofFeature, bad); err == nil {
		t.Error("an address match in a bridge-family feature was accepted")
	}
	tag := tagFor(ownerA, bad)
	if got, ok := decodeTag(encodeTag(tag)); !ok || got != tag {
		t.Errorf("userdata round trip: %+v %v", got, ok)
	}
}

// TestFakeStates runs random Apply/Remove/Check/Tags sequences against the Fake and
// requires that removing every owner always returns it to empty, and that a failing
// call changes nothing.
func TestFakeStates(t *testing.T) {
	ctx := context.Background()
	owners := []Owner{ownerA, ownerB, ownerC}
	plans := map[Owner]Plan{
		ownerA: PlanMasquerade(ownerA, []netip.Prefix{pfx("10.1.2.3/24")}),
		ownerB: PlanMasquerade(ownerB, []netip.Prefix{pfx("10.1.2.4/24"), pfx("fd00::4/64")}),
		ownerC: PlanMasquerade(ownerC, []netip.Prefix{pfx("fd01::4/64")}),
	}
	rng := rand.New(rand.NewSource(1))
	for round := 0; round < 200; round++ {
		f := NewFake()
		applied := map[Owner]bool{}
		for step := 0; step < 10; step++ {
			o := owners[rng.Intn(len(owners))]
			switch rng.Intn(4) {
			case 0:
				if err := f.Apply(ctx, plans[o]); err != nil {
					t.Fatal(err)
				}
				applied[o] = true
			case 1:
				if err := f.Remove(ctx, MasqFeature, IDOf(o), All); err != nil {
					t.Fatal(err)
				}
				applied[o] = false
			case 2:
				err := f.Check(ctx, plans[o])
				if applied[o] != (err == nil) {
					t.Fatalf("Check(%s) = %v with applied=%v", o, err, applied[o])
				}
				if !applied[o] && !IsNotFound(err) {
					t.Fatalf("Check of an absent owner: %v is not IsNotFound", err)
				}
			case 3:
				before := f.Dump()
				f.FailNext("apply", errors.New("boom"))
				if err := f.Apply(ctx, plans[o]); err == nil {
					t.Fatal("FailNext did not fail")
				}
				if f.Dump() != before {
					t.Fatal("a failed Apply changed state")
				}
			}
		}
		tags, _ := f.Tags(ctx, MasqFeature)
		for _, st := range Stale(tags, "net1", nil) {
			_ = f.Remove(ctx, MasqFeature, st.ID, All)
		}
		for _, st := range Stale(tags, "net2", nil) {
			_ = f.Remove(ctx, MasqFeature, st.ID, All)
		}
		if d := f.Dump(); d != "" {
			t.Fatalf("round %d: GC of everything left:\n%s", round, d)
		}
	}
}

func TestFakeRemoveFamilies(t *testing.T) {
	ctx := context.Background()
	f := NewFake()
	if err := f.Apply(ctx, PlanMasquerade(ownerB, []netip.Prefix{pfx("10.1.2.4/24"), pfx("fd00::4/64")})); err != nil {
		t.Fatal(err)
	}
	if err := f.Remove(ctx, MasqFeature, IDOf(ownerB), V4); err != nil {
		t.Fatal(err)
	}
	if d := f.Dump(); strings.Contains(d, "ipv4") || !strings.Contains(d, "ipv6") {
		t.Errorf("removing v4 only left:\n%s", d)
	}
}

func TestIPTablesErrorKinds(t *testing.T) {
	if !isLockBusy(4, "Another app is currently holding the xtables lock. Stopped waiting after 5s.") {
		t.Error("lock message not recognized")
	}
	if isLockBusy(1, "Another app is currently holding the xtables lock") || isLockBusy(4, "Bad rule") {
		t.Error("lock recognized from the wrong exit status or message")
	}
	for _, msg := range []string{
		"iptables: No chain/target/match by that name.",
		"iptables v1.8.9 (nf_tables): chain `PW-MASQ-POSTROUTING' in table `nat' is incompatible, use 'nft' tool.",
	} {
		if !isMissingChain(msg) {
			t.Errorf("missing chain not recognized in %q", msg)
		}
	}
	if isMissingChain("iptables-restore: line 2 failed: Bad rule (does a matching rule exist in that chain?).") {
		t.Error("a failed restore was taken for a missing chain")
	}
	err := busy("the xtables lock", errors.New("held"))
	if !IsBusy(err) || cniplumb.Code(err) != 11 || IsNotFound(err) {
		t.Errorf("busy error: IsBusy=%v code=%d", IsBusy(err), cniplumb.Code(err))
	}
	nf := notFound("rule %s", "x")
	if !IsNotFound(nf) || IsBusy(nf) || nf.Error() != "rule x" {
		t.Errorf("notFound error: %v", nf)
	}
}

func TestChainName(t *testing.T) {
	if n, err := ChainName(MasqFeature, NATPostrouting); err != nil || n != "PW-MASQ-POSTROUTING" {
		t.Errorf("ChainName = %q, %v", n, err)
	}
	if _, err := ChainName(Feature{Name: "averyveryverylongfeature"}, NATPostrouting); err == nil {
		t.Error("a chain name over 28 bytes was accepted")
	}
}
