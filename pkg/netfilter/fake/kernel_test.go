// SPDX-License-Identifier: Apache-2.0

package fake

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
)

// The kernel's rules the layouts rely on, as the fake models them.

func TestRestore(t *testing.T) {
	ctx := context.Background()
	k := New()
	setup := `*nat
:A - [0:0]
:B - [0:0]
-A A -s 10.0.0.1/32 -m comment --comment "x \"y\" \\" -j ACCEPT
-A POSTROUTING -j A
-I POSTROUTING 1 -m comment --comment first -j B
COMMIT
`
	if err := k.Restore(ctx, IPv4, setup); err != nil {
		t.Fatal(err)
	}
	want := `ipv4 nat -N A
ipv4 nat -A A -s 10.0.0.1/32 -m comment --comment "x \"y\" \\" -j ACCEPT
ipv4 nat -N B
ipv4 nat -A POSTROUTING -m comment --comment "first" -j B
ipv4 nat -A POSTROUTING -j A
`
	if d := cmp.Diff(want, k.Dump()); d != "" {
		t.Fatalf("(-want +got):\n%s", d)
	}
	lines, ok, err := k.List(ctx, IPv4, "nat", "A")
	if err != nil || !ok || len(lines) != 1 || lines[0] != `-A A -s 10.0.0.1/32 -m comment --comment "x \"y\" \\" -j ACCEPT` {
		t.Errorf("List = %q, %v, %v", lines, ok, err)
	}
	if _, ok, err := k.List(ctx, IPv4, "nat", "C"); ok || err != nil {
		t.Errorf("List of a missing chain: %v, %v", ok, err)
	}
	if _, ok, _ := k.List(ctx, IPv6, "nat", "A"); ok {
		t.Error("the families share chains")
	}
	if ok, _ := k.Has(ctx, IPv4, "nat", "POSTROUTING", []string{"-j", "A"}); !ok {
		t.Error("Has misses a rule")
	}
	if ok, _ := k.Has(ctx, IPv4, "nat", "POSTROUTING", []string{"-j", "B"}); ok {
		t.Error("Has finds a rule that is not there")
	}

	// Each of these fails, and with it the whole script: nothing changes.
	for _, bad := range []string{
		"-D POSTROUTING -j C", // deleting what is absent
		"-A POSTROUTING -j C", // jumping to a missing chain
		"-X A",                // deleting a chain that is referenced and not empty
		"-F A\n-X A",          // still referenced
		"-X POSTROUTING",      // a built-in chain
		"-A C -j ACCEPT",      // a missing chain
		"-F C",                // a missing chain
		"-Z A",                // an unknown command
	} {
		script := "*nat\n:D - [0:0]\n-A D -j ACCEPT\n" + bad + "\nCOMMIT\n"
		if err := k.Restore(ctx, IPv4, script); err == nil {
			t.Errorf("restore of %q succeeded", bad)
		}
		if d := cmp.Diff(want, k.Dump()); d != "" {
			t.Errorf("failed restore of %q changed the state (-want +got):\n%s", bad, d)
		}
	}

	// Declaring a user chain flushes it (iptables-restore --noflush does), a built-in
	// one is left alone; -D, -F and -X undo the setup.
	if err := k.Restore(ctx, IPv4, "*nat\n:A - [0:0]\n:POSTROUTING ACCEPT [0:0]\n-D POSTROUTING -m comment --comment first -j B\n-D POSTROUTING -j A\n-X A\n-F B\n-X B\nCOMMIT\n"); err != nil {
		t.Fatal(err)
	}
	if d := k.Dump(); d != "" {
		t.Errorf("left:\n%s", d)
	}
}

func TestFailNext(t *testing.T) {
	ctx := context.Background()
	k := New()
	boom := errors.New("boom")
	for _, op := range []struct {
		name string
		call func() error
	}{
		{"restore", func() error { return k.Restore(ctx, IPv4, "*nat\n:A - [0:0]\nCOMMIT\n") }},
		{"list", func() error { _, _, err := k.List(ctx, IPv4, "nat", "A"); return err }},
		{"flush", func() error {
			k.AddTable(&nftables.Table{Name: "t", Family: nftables.TableFamilyINet})
			return k.Flush()
		}},
	} {
		k.FailNext(op.name, boom)
		if err := op.call(); !errors.Is(err, boom) {
			t.Errorf("%s: %v, want the injected error", op.name, err)
		}
		if d := k.Dump(); d != "" {
			t.Errorf("a failed %s changed the state:\n%s", op.name, d)
		}
		if err := op.call(); err != nil {
			t.Errorf("%s fails twice: %v", op.name, err)
		}
		k = New()
	}
	k.NoIPv6Tables = true
	if !k.Installed(IPv4) || k.Installed(IPv6) {
		t.Error("NoIPv6Tables")
	}
}

func TestNFTBatch(t *testing.T) {
	k := New()
	tab := &nftables.Table{Name: "t", Family: nftables.TableFamilyINet}
	hook, prio := nftables.ChainHookPostrouting, nftables.ChainPriorityNATSource
	base := &nftables.Chain{Name: "post", Table: tab, Type: nftables.ChainTypeNAT, Hooknum: hook, Priority: prio}
	ud := userdata.AppendString(nil, userdata.TypeComment, "c1")
	k.AddTable(tab)
	k.AddChain(base)
	k.AddChain(&nftables.Chain{Name: "reg", Table: tab})
	k.AddRule(&nftables.Rule{Table: tab, Chain: base, Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictGoto, Chain: "reg"}}})
	k.AddRule(&nftables.Rule{Table: tab, Chain: base, Exprs: []expr.Any{&expr.Masq{}}, UserData: ud})
	if err := k.Flush(); err != nil {
		t.Fatal(err)
	}
	want := `nft table inet t
nft   chain post (type nat hook 4 priority 100)
nft     goto reg
nft     masquerade # c1
nft   chain reg
`
	if d := cmp.Diff(want, k.Dump()); d != "" {
		t.Fatalf("(-want +got):\n%s", d)
	}
	rules, err := k.GetRules(tab, base)
	if err != nil || len(rules) != 2 || rules[0].Handle == 0 || rules[0].Handle == rules[1].Handle {
		t.Fatalf("GetRules = %v, %v", rules, err)
	}
	if tl, err := k.ListTableOfFamily("t", nftables.TableFamilyINet); err != nil || tl.Use != 2 {
		t.Errorf("ListTableOfFamily = %+v, %v", tl, err)
	}
	if _, err := k.ListChain(tab, "nope"); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("ListChain of a missing chain: %v, want ENOENT", err)
	}
	if _, err := k.GetRules(&nftables.Table{Name: "nope", Family: nftables.TableFamilyINet}, base); err == nil {
		t.Error("GetRules of a missing table succeeded")
	}

	// A batch with one failing message applies nothing.
	if err := k.DelRule(rules[0]); err != nil {
		t.Fatal(err)
	}
	k.AddRule(&nftables.Rule{Table: tab, Chain: &nftables.Chain{Name: "nope", Table: tab}, Exprs: []expr.Any{&expr.Masq{}}})
	if err := k.Flush(); err == nil {
		t.Error("a batch adding to a missing chain succeeded")
	}
	if err := k.DelRule(&nftables.Rule{Table: tab, Chain: base}); err == nil {
		t.Error("DelRule without handle accepted")
	}
	if err := k.DelRule(rules[0]); err != nil {
		t.Fatal(err)
	}
	if err := k.DelRule(rules[0]); err != nil {
		t.Fatal(err)
	}
	if err := k.Flush(); err == nil {
		t.Error("deleting one rule twice in a batch succeeded")
	}
	if d := cmp.Diff(want, k.Dump()); d != "" {
		t.Errorf("failed batches changed the state (-want +got):\n%s", d)
	}
	k.FlushChain(base)
	k.DelTable(tab)
	if err := k.Flush(); err != nil {
		t.Fatal(err)
	}
	if d := k.Dump(); d != "" {
		t.Errorf("left:\n%s", d)
	}
	k.DelTable(tab)
	if err := k.Flush(); err == nil {
		t.Error("deleting a missing table succeeded")
	}
}
