package netfilter

import (
	"errors"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// Every rule shape the iptables backends write, in the text `iptables -S` prints:
// parsing keeps the text, and encoding then decoding gives it back.
func TestXTSpecRoundTrip(t *testing.T) {
	cases := map[Family][]string{
		IPv4: {
			`-m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT`,
			`-m comment --comment "CNI portfwd requiring masquerade" -j CNI-HOSTPORT-MASQ`,
			`-m mark --mark 0x2000/0x2000 -j MASQUERADE`,
			`-m mark --mark 0x4000 -j RETURN`,
			`-p tcp -m multiport --dports 8080,8443 -m comment --comment "pw:1:abc" -j CNI-DN-1`,
			`-s 10.88.0.0/16 ! -d 10.88.0.5/32 ! -i eth0 -p udp -m multiport --dports 53 -m comment --comment "pw: \"q\" \\ x\'" -j CNI-DN-1`,
			`-i veth+ -p tcp -m comment --comment "dnat name: \"net1\" id: \"c1\"" -m multiport --dports 9090 -j CNI-DN-1`,
			`-s 10.88.0.0/16 -p tcp -m tcp --dport 8080 -m comment --comment "pw:1:abc" -j MARK --set-xmark 0x2000/0x2000`,
			`-p tcp -m tcp --dport 8080 -m comment --comment "pw:1:abc" -j DNAT --to-destination 10.88.0.5:80`,
			`-p udp -m udp --dport 53 -m comment --comment pw-x -j KUBE-MARK-MASQ`,
			`-d 10.80.0.0/12 -j DNAT --to-destination 10.88.0.6`,
			`-s 10.80.0.0/12 ! -d 10.88.0.0/16 -m comment --comment "podwire masq" -j ACCEPT`,
			`! -s 10.88.0.5/32 -j MASQUERADE`,
			`-s 10.0.0.0/9 -j DROP`,
		},
		IPv6: {
			`-s fd00:88::/64 -d fd00:88::1/128 -p tcp -m tcp --dport 80 -j DNAT --to-destination [fd00:88::5]:8080`,
			`-s fd00::/60 -p udp -m multiport --dports 53,54 -j MASQUERADE`,
			`-d fd00::/8 -j DNAT --to-destination fd00::9`,
			`-m mark --mark 0x2000/0x2000 -j MASQUERADE`,
		},
	}
	for fam, specs := range cases {
		for _, text := range specs {
			s, err := parseXTSpec(fam, xtTokens(text))
			if err != nil {
				t.Errorf("%s %q: %v", fam, text, err)
				continue
			}
			if got := s.text(); got != text {
				t.Errorf("%s: parsed and printed\n  %s\nwant\n  %s", fam, got, text)
			}
			enc, err := encodeXTSpec(fam, s)
			if err != nil {
				t.Errorf("%s %q: encode: %v", fam, text, err)
				continue
			}
			back, ok := decodeXTSpec(fam, enc.exprs)
			if !ok {
				t.Errorf("%s %q: its own encoding does not decode", fam, text)
				continue
			}
			if got := back.text(); got != text {
				t.Errorf("%s: encoded and decoded\n  %s\nwant\n  %s", fam, got, text)
			}
			if s.proto != "" && enc.compatProto != uint32(xtProtoNums[s.proto]) {
				t.Errorf("%s %q: compat protocol %d", fam, text, enc.compatProto)
			}
		}
	}
}

// What the codec does not know runs the binaries: errXTUnsupported, never a guess.
func TestXTSpecUnsupported(t *testing.T) {
	for _, text := range []string{
		`-p sctp -m sctp --dport 80 -j ACCEPT`,
		`! -p tcp -j ACCEPT`,
		`-p icmp -j ACCEPT`,
		`-p tcp -m tcp ! --dport 80 -j ACCEPT`,
		`-p tcp -m tcp --sport 80 -j ACCEPT`,
		`-p tcp -m multiport --dports 1:5 -j ACCEPT`,
		`-p tcp -m multiport --dports 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16 -j ACCEPT`,
		`-m multiport --dports 80 -j ACCEPT`,
		`-m conntrack --ctstate NEW -j ACCEPT`,
		`-o eth0 -j ACCEPT`,
		`-j LOG --log-prefix x`,
		`-j DNAT --to-destination 10.0.0.1-10.0.0.2`,
		`-j DNAT --to-destination fd00::1`,
		`-j MASQUERADE --to-ports 1000`,
		`-s fd00::/64 -j ACCEPT`,
		`-j ACCEPT !`,
		`-m addrtype --src-type LOCAL -j ACCEPT`,
	} {
		_, err := parseXTSpec(IPv4, xtTokens(text))
		if !errors.Is(err, errXTUnsupported) {
			t.Errorf("%q: %v, want errXTUnsupported", text, err)
		}
	}
}

func TestXTSaveString(t *testing.T) {
	for in, want := range map[string]string{
		"pw-x_1":    "pw-x_1",
		"":          `""`,
		"a b":       `"a b"`,
		`a"b\c'd`:   `"a\"b\\c\'d"`,
		"pw:1:abc":  `"pw:1:abc"`,
		"dnat name": `"dnat name"`,
	} {
		if got := xtSaveString(in); got != want {
			t.Errorf("xtSaveString(%q) = %s, want %s", in, got, want)
		}
		if in != "" {
			if back := xtTokens(xtSaveString(in)); len(back) != 1 || back[0] != in {
				t.Errorf("%q does not tokenize back: %q", in, back)
			}
		}
	}
}

// A rule with an expression the codec does not know is opaque: never equal to a
// specification, but its comment and jump are still read.
func TestXTOpaque(t *testing.T) {
	s, _ := parseXTSpec(IPv4, xtTokens(`-m comment --comment "dnat name: \"n\" id: \"c\"" -j CNI-DN-1`))
	enc, _ := encodeXTSpec(IPv4, s)
	r := nfRule{handle: 42, exprs: append([]nfExpr{{name: "lookup", data: exprData(func(a attrs) { a.str(1, "set") })}}, enc.exprs...)}
	if _, ok := decodeXTSpec(IPv4, r.exprs); ok {
		t.Fatal("a rule with a lookup decoded")
	}
	got := opaqueText(IPv4, r)
	want := `-m podwire-undecoded --handle 42 -m comment --comment "dnat name: \"n\" id: \"c\"" -j CNI-DN-1`
	if got != want {
		t.Errorf("opaque text\n  %s\nwant\n  %s", got, want)
	}
	if n, c, ok := refOwner(got); !ok || n != "n" || c != "c" {
		t.Errorf("refOwner(%q) = %q %q %v", got, n, c, ok)
	}
	if jumpTarget(got) != "CNI-DN-1" {
		t.Errorf("jumpTarget(%q) = %q", got, jumpTarget(got))
	}
}

func TestParseXTScript(t *testing.T) {
	table, ops, err := parseXTScript(IPv4, strings.Join([]string{
		"*nat", ":CNI-DN-1 - [0:0]", "-D CNI-HOSTPORT-DNAT -m podwire-undecoded --handle 7 -j CNI-DN-1",
		"-D PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT", "-I POSTROUTING 1 -j ACCEPT",
		"-A CNI-DN-1 -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.0.0.1:80", "-F CNI-DN-2", "-X CNI-DN-2", "COMMIT", ""}, "\n"))
	if err != nil || table != "nat" || len(ops) != 7 {
		t.Fatalf("parse: %q %d %v", table, len(ops), err)
	}
	if ops[1].op != "-D" || strings.Join(ops[1].del, " ") != "-m podwire-undecoded --handle 7 -j CNI-DN-1" {
		t.Errorf("opaque -D: %+v", ops[1])
	}
	if ops[3].op != "-I" || ops[3].spec.target.name != "ACCEPT" {
		t.Errorf("-I: %+v", ops[3])
	}
	for _, bad := range []string{
		"*nat\n-A X -j ACCEPT\n",                       // no COMMIT
		"*nat\nCOMMIT\n*filter\nCOMMIT\n",              // two tables
		"*mangle\n-A X -j ACCEPT\nCOMMIT\n",            // another table
		"*nat\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n",     // a policy
		"*nat\n-X POSTROUTING\nCOMMIT\n",               // parsed, refused when planned
		"*nat\n-R X 1 -j ACCEPT\nCOMMIT\n",             // replace
		"*nat\n-A X -p sctp -j ACCEPT\nCOMMIT\n",       // a rule the codec does not know
		"-A X -j ACCEPT\nCOMMIT\n",                     // outside a table
		"*nat\n-A X -j ACCEPT\nCOMMIT\n-A Y\nCOMMIT\n", // after COMMIT
	} {
		_, ops, err := parseXTScript(IPv4, bad)
		if err == nil && !(len(ops) == 1 && ops[0].op == "-X") {
			t.Errorf("%q parsed", bad)
		} else if err != nil && !errors.Is(err, errXTUnsupported) {
			t.Errorf("%q: %v, want errXTUnsupported", bad, err)
		}
	}
}

func TestDecodeAttrs(t *testing.T) {
	a := newAttrs()
	a.str(unix.NFTA_CHAIN_NAME, "x")             // 3, padded
	a.raw(unix.NFTA_CHAIN_TYPE, nil)             // present but empty
	a.u32(30, 7)                                 // beyond the array
	a.nest(unix.NFTA_CHAIN_HOOK, func(n attrs) { // nested flag set on the wire
		n.u32(unix.NFTA_HOOK_HOOKNUM, 2)
	})
	got, err := decodeAttrs(a.bytes())
	if err != nil {
		t.Fatal(err)
	}
	if cstr(got.get(unix.NFTA_CHAIN_NAME)) != "x" || !got.has(unix.NFTA_CHAIN_TYPE) || got.has(unix.NFTA_CHAIN_POLICY) {
		t.Errorf("name %q, type present %v, policy present %v", got.get(unix.NFTA_CHAIN_NAME), got.has(unix.NFTA_CHAIN_TYPE), got.has(unix.NFTA_CHAIN_POLICY))
	}
	if v := got.get(30); len(v) != 4 || v[3] != 7 {
		t.Errorf("type 30: %x", v)
	}
	h, ok := got.lookup(unix.NFTA_CHAIN_HOOK)
	if !ok {
		t.Fatal("nested attribute not found under its type")
	}
	hook, err := decodeAttrs(h)
	if err != nil || len(hook.get(unix.NFTA_HOOK_HOOKNUM)) != 4 {
		t.Errorf("nested: %v %x", err, hook.get(unix.NFTA_HOOK_HOOKNUM))
	}
	for _, bad := range [][]byte{{1}, {3, 0, 1, 0}, {9, 0, 1, 0, 0}} {
		if _, err := decodeAttrs(bad); err == nil {
			t.Errorf("decodeAttrs(%x) accepted a malformed attribute", bad)
		}
		if _, err := decodeList(bad); err == nil {
			t.Errorf("decodeList(%x) accepted a malformed attribute", bad)
		}
	}
}
