// SPDX-License-Identifier: Apache-2.0

package netfilter

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/podwire/podwire/pkg/cniplumb"
)

// Kernel names, comments and tags: what either binary must derive identically to find
// the other's rules, and the quoting that keeps names from changing a rule.

var (
	ownerA = Owner{Network: "net1", ContainerID: "aaaa", IfName: "eth0"}
	ownerB = Owner{Network: "net1", ContainerID: "bbbb", IfName: "eth0"}
	ownerC = Owner{Network: "net2", ContainerID: "aaaa", IfName: "eth0"}
)

// The per-container chain is named exactly as the reference names it
// (utils.MustFormatChainNameWithPrefix(network, containerID, "DN-")), or neither
// binary's DEL finds the other's chain: `printf %s net1aaaa | sha512sum`.
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
	if len(c) != nftMaxComment || !strings.HasPrefix(c, masqInstance(long)+", net: nnn") || strings.Contains(c, `"`) {
		t.Errorf("long comment %q: want cut at %d bytes, quotes stripped", c, nftMaxComment)
	}
}

// The reference's ADD fails where network and container ID do not fit an iptables
// comment; podwire cuts them, the network last, so the comment still parses.
func TestMasqCommentCut(t *testing.T) {
	for _, tc := range []struct {
		name    string
		o       Owner
		net, id int // lengths parseMasqComment must read back
	}{
		{"fits", Owner{Network: "expnet", ContainerID: strings.Repeat("c", 64)}, 6, 64},
		{"exactly 255", Owner{Network: "expnet", ContainerID: strings.Repeat("c", 234)}, 6, 234},
		{"long container ID", Owner{Network: "expnet", ContainerID: strings.Repeat("c", 1000)}, 6, 234},
		{"long network", Owner{Network: strings.Repeat("n", 300), ContainerID: strings.Repeat("c", 64)}, 176, 64},
		{"both long", Owner{Network: strings.Repeat("n", 300), ContainerID: strings.Repeat("c", 1000)}, 120, 120},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := masqComment(tc.o)
			if len(c) > maxXTComment {
				t.Errorf("comment of %d bytes", len(c))
			}
			n, id, ok := parseMasqComment(c)
			if !ok || len(n) != tc.net || len(id) != tc.id || !strings.HasPrefix(tc.o.Network, n) || !strings.HasPrefix(tc.o.ContainerID, id) {
				t.Errorf("parseMasqComment(masqComment) = %d, %d bytes, %v; want %d, %d", len(n), len(id), ok, tc.net, tc.id)
			}
		})
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
	// The reference portmap's jump comment is the same with "dnat " in front.
	if n, c, ok := refOwner(`dnat name: "my-net" id: "abc123"`); !ok || n != "my-net" || c != "abc123" {
		t.Errorf("refOwner = %q %q %v", n, c, ok)
	}
	if _, _, ok := refOwner(`name: "my-net" id: "abc123"`); ok {
		t.Error("refOwner took a masquerade comment for a portmap one")
	}
}

func TestTagText(t *testing.T) {
	r := Rule{Hook: NATPostrouting, Family: IPv4, Match: Match{Dst: mustPrefix("10.88.0.5/32"), Mark: 0x2000}, Action: Action{Kind: Masquerade}}
	// The exact text is kernel state: a change makes CHECK fail for every rule older
	// binaries installed. sha256("net1")[:8], sha256("net1/aaaa/eth0")[:16],
	// sha256(rule text)[:8].
	if got := tagFor(ownerA, r).String(); got != "pw:6c270ef2:e59d82cafbaeb5ef:61b16d94 net1/aaaa/eth0" {
		t.Errorf("tag = %q", got)
	}
	if got := r.String(); got != "nat/postrouting ipv4 daddr == 10.88.0.5/32 mark & 0x2000 == 0x2000 masquerade" {
		t.Errorf("rule text (hashed into the fingerprint) = %q", got)
	}
}

func TestTagRoundTrip(t *testing.T) {
	r := Rule{Hook: NATPostrouting, Family: IPv4, Action: Action{Kind: Masquerade}}
	tag := tagFor(ownerA, r)
	s := tag.String()
	if !strings.HasPrefix(s, "pw:") || !strings.HasSuffix(s, " net1/aaaa/eth0") {
		t.Errorf("tag text %q", s)
	}
	got, ok := ParseTag(`"` + s + `"`)
	if !ok || got != tag {
		t.Fatalf("ParseTag(%q) = %+v, %v; want %+v", s, got, ok, tag)
	}
	if got.ID != IDOf(ownerA) || got.ID == IDOf(ownerB) || got.NetworkHash != hash8("net1") || got.NetworkHash == hash8("net2") {
		t.Errorf("ownership predicates wrong for %+v", got)
	}
	long := Owner{Network: strings.Repeat("n", 90), ContainerID: strings.Repeat("c", 64), IfName: "eth0"}
	lt := tagFor(long, r)
	if len(lt.String()) > maxTag {
		t.Errorf("tag of a long owner is %d bytes", len(lt.String()))
	}
	back, ok := ParseTag(lt.String())
	if !ok || back.ID != IDOf(long) || back.Owner != (Owner{}) || back.NetworkHash != hash8(long.Network) {
		t.Errorf("long-owner tag %q parsed as %+v", lt, back)
	}
	// A key that does not hash to the ID (a forged or cut one) is not believed.
	forged, ok := ParseTag(strings.Replace(s, "net1/aaaa/eth0", "net1/bbbb/eth0", 1))
	if !ok || forged.Owner != (Owner{}) || forged.ID != IDOf(ownerA) {
		t.Errorf("forged key parsed as %+v", forged)
	}
	for _, bad := range []string{"", "KUBE-MARK", "pw:zz", "pw:12345678:0123456789abcdef", `name: "x" id: "y"`} {
		if _, ok := ParseTag(bad); ok {
			t.Errorf("ParseTag(%q) accepted a foreign comment", bad)
		}
	}
}

func TestStale(t *testing.T) {
	r := Rule{Hook: NATPostrouting, Family: IPv4, Action: Action{Kind: Masquerade}}
	var objs []Object
	for _, tag := range []Tag{tagFor(ownerA, r), tagFor(ownerB, r), tagFor(ownerC, r)} {
		objs = append(objs, Object{Key: string(tag.ID), layout: byTag, net: tag.NetworkHash})
	}
	// The reference's cni_hostport names no network: never GC's to pick.
	objs = append(objs, Object{Key: ownerA.ContainerID, layout: byRefHPNFT})
	stale := func(network string, keep cniplumb.Owners) (out []OwnerID) {
		for _, o := range Stale(objs, network, keep, func(string) bool { return true }) {
			out = append(out, OwnerID(o.Key))
		}
		return out
	}
	if got := stale("net1", cniplumb.Owners{ownerB: true, ownerC: true}); !slices.Equal(got, []OwnerID{IDOf(ownerA)}) {
		t.Errorf("stale = %v, want only ownerA", got)
	}
	if got := stale("net2", cniplumb.Owners{}); !slices.Equal(got, []OwnerID{IDOf(ownerC)}) {
		t.Errorf("stale(net2) = %v, want only ownerC (other networks are not ours to collect)", got)
	}
	// Another interface of a kept container is another attachment.
	a1 := ownerA
	a1.IfName = "net1"
	if got := stale("net1", cniplumb.Owners{a1: true, ownerB: true}); !slices.Equal(got, []OwnerID{IDOf(ownerA)}) {
		t.Errorf("stale keeping another interface = %v, want ownerA", got)
	}
}

func TestXTTokens(t *testing.T) {
	got := SplitRuleArgs(`-A POSTROUTING -s 10.77.0.2/32 -m comment --comment "name: \"expnet\" id: \"ctr1\"" -j CNI-cc94bae7a43faa95404efc2e`)
	want := []string{"-A", "POSTROUTING", "-s", "10.77.0.2/32", "-m", "comment", "--comment", `name: "expnet" id: "ctr1"`, "-j", "CNI-cc94bae7a43faa95404efc2e"}
	if d := cmp.Diff(want, got); d != "" {
		t.Error(d)
	}
	for _, s := range []string{``, `plain`, `a"b\c`, `ends in \`, `"`, `\"`, `" -j ACCEPT -m comment --comment "`, "pw:1 net/id/e\"th0\\"} {
		q := xtQuote(s)
		if a := SplitRuleArgs("--comment " + q + " -j X"); len(a) != 4 || a[1] != s || a[3] != "X" {
			t.Errorf("xtQuote(%q) = %s splits into %q", s, q, a)
		}
	}
	if q := xtQuote(`a"b\c`); q != `"a\"b\\c"` {
		t.Errorf("xtQuote = %s, want iptables -S's quoting", q)
	}
	// FormatRuleArgs prints what SplitRuleArgs reads back.
	args := []string{"-s", "10.0.0.0/8", "-m", "comment", "--comment", `x "y" \`, "-j", "ACCEPT"}
	line := FormatRuleArgs(args)
	if line != `-s 10.0.0.0/8 -m comment --comment "x \"y\" \\" -j ACCEPT` {
		t.Errorf("FormatRuleArgs = %s", line)
	}
	if d := cmp.Diff(args, SplitRuleArgs(line)); d != "" {
		t.Errorf("round trip (-want +got):\n%s", d)
	}
	if got := FormatRuleArgs([]string{"-m", "comment", "--comment", "plain"}); got != `-m comment --comment "plain"` {
		t.Errorf("comments are always quoted, as iptables -S does: %s", got)
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
}

func TestParseKind(t *testing.T) {
	for _, s := range []string{"", "iptables", "nftables"} {
		if k, err := ParseKind("ipMasqBackend", s); err != nil || string(k) != s {
			t.Errorf("ParseKind(%q) = %q, %v", s, k, err)
		}
	}
	for _, s := range []string{"ebtables", "IPTables", " nftables"} {
		if _, err := ParseKind("ipMasqBackend", s); cniplumb.Code(err) != 7 || !strings.Contains(err.Error(), "ipMasqBackend") {
			t.Errorf("ParseKind(%q) = %v, want a code-7 error naming the key", s, err)
		}
	}
	if Auto.Named() || !KindIPTables.Named() || !KindNFTables.Named() {
		t.Error("Named")
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
		"nftables v1.0.0":                       false,
		"nftables v0.9.8 (E.D.S.)":              false,
		"":                                      false,
	} {
		if nftVersionOK(in) != ok {
			t.Errorf("nftVersionOK(%q) = %v", in, !ok)
		}
	}
}

func TestFlavourOf(t *testing.T) {
	for path, want := range map[string]string{
		"/usr/sbin/xtables-nft-multi":    flavourNFT,
		"/usr/sbin/iptables-nft":         flavourNFT,
		"/usr/sbin/xtables-legacy-multi": flavourLegacy,
		"/sbin/iptables-legacy":          flavourLegacy,
		"/usr/sbin/iptables":             "unknown", // a real file of unknown flavour: list it
		"/usr/sbin/xtables-multi":        "unknown",
		"":                               "unknown", // not resolved
	} {
		if got := flavourOf(path); got != want {
			t.Errorf("flavourOf(%q) = %s, want %s", path, got, want)
		}
	}
}

func TestErrorKinds(t *testing.T) {
	err := busy("the xtables lock", errors.New("held"))
	if !IsBusy(err) || cniplumb.Code(err) != 11 || IsNotFound(err) {
		t.Errorf("busy error: IsBusy=%v code=%d", IsBusy(err), cniplumb.Code(err))
	}
	nf := notFound("rule %s", "x")
	if !IsNotFound(nf) || IsBusy(nf) || nf.Error() != "rule x" {
		t.Errorf("notFound error: %v", nf)
	}
	if wrapped := errors.Join(errors.New("other"), nf); !IsNotFound(wrapped) {
		t.Error("IsNotFound does not see through wrapping")
	}
	if !isLockBusy(&lockBusyError{"Another app is currently holding the xtables lock."}) || isLockBusy(errors.New("xtables lock")) {
		t.Error("isLockBusy")
	}
}
