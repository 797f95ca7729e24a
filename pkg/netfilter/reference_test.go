// SPDX-License-Identifier: Apache-2.0

package netfilter_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/netfilter"
	"github.com/podwire/podwire/pkg/netfilter/fake"
)

// Nodes switch between the reference plugins and podwire under live pods: each
// binary's DEL and GC must remove what the other's ADD made. The reference's rules
// are seeded into the fake as the reference writes them.

// refPortmapA is the reference portmap's ADD of hpOwnerA's TCP 8080 (IPv4), as
// restore lines in the order its chain.setup calls run.
const refPortmapA = `*nat
:CNI-HOSTPORT-SETMARK - [0:0]
:CNI-HOSTPORT-MASQ - [0:0]
:CNI-HOSTPORT-DNAT - [0:0]
:CNI-DN-0830037e596fec4874866 - [0:0]
-A CNI-HOSTPORT-SETMARK -m comment --comment "CNI portfwd masquerade mark" -j MARK --set-xmark 0x2000/0x2000
-A CNI-HOSTPORT-MASQ -m mark --mark 0x2000/0x2000 -j MASQUERADE
-I POSTROUTING 1 -m comment --comment "CNI portfwd requiring masquerade" -j CNI-HOSTPORT-MASQ
-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A OUTPUT -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A CNI-DN-0830037e596fec4874866 -s 10.88.0.0/16 -p tcp -m tcp --dport 8080 -j CNI-HOSTPORT-SETMARK
-A CNI-DN-0830037e596fec4874866 -s 127.0.0.1/32 -p tcp -m tcp --dport 8080 -j CNI-HOSTPORT-SETMARK
-A CNI-DN-0830037e596fec4874866 -p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.88.0.5:80
-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"podnet\" id: \"abc\"" -m multiport --dports 8080 -j CNI-DN-0830037e596fec4874866
COMMIT
`

func seedIPv4(t *testing.T, k *fake.Kernel, script string) string {
	t.Helper()
	if err := k.Restore(t.Context(), netfilter.IPv4, script); err != nil {
		t.Fatal(err)
	}
	return k.Dump()
}

func TestHostPortsRemoveTheReferencesPod(t *testing.T) {
	for _, tc := range []struct {
		name string
		del  func(b netfilter.HostPortBackend, k *fake.Kernel) error
	}{
		{"DEL", func(b netfilter.HostPortBackend, _ *fake.Kernel) error {
			return b.Remove(t.Context(), hpOwnerA, netfilter.All)
		}},
		// The reference keys its rules by network and container: another interface
		// name still finds them.
		{"DEL of another interface", func(b netfilter.HostPortBackend, _ *fake.Kernel) error {
			return b.Remove(t.Context(), Owner{Network: "podnet", ContainerID: "abc", IfName: "net1"}, netfilter.V4)
		}},
		{"GC", func(b netfilter.HostPortBackend, k *fake.Kernel) error {
			if err := b.GC(t.Context(), "podnet", cniplumb.Owners{{Network: "podnet", ContainerID: "abc", IfName: "x"}: true}); err != nil {
				return err
			}
			if err := b.GC(t.Context(), "othernet", nil); err != nil {
				return err
			}
			if d := k.Dump(); !strings.Contains(d, "dnat name:") {
				t.Errorf("a GC keeping the container, or of another network, removed it:\n%s", d)
			}
			return b.GC(t.Context(), "podnet", cniplumb.Owners{hpOwnerB: true})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := fake.New()
			seedIPv4(t, k, refPortmapA)
			if err := tc.del(netfilter.NewHostPortsOn(netfilter.KindIPTables, k, k), k); err != nil {
				t.Fatal(err)
			}
			requireEmpty(t, k, tc.name)
		})
	}
}

func TestHostPortsNextToTheReference(t *testing.T) {
	k := fake.New()
	ref := seedIPv4(t, k, refPortmapA)
	b := netfilter.NewHostPortsOn(netfilter.KindIPTables, k, k)
	p := hpPlanB()
	if err := b.Apply(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	if err := b.Check(t.Context(), p); err != nil {
		t.Error(err)
	}
	d := k.Dump()
	for _, shared := range []string{entryPre, entryOut, entryPost, "nat -A CNI-HOSTPORT-MASQ -m mark --mark 0x2000/0x2000 -j MASQUERADE"} {
		if n := strings.Count(d, "ipv4 "+shared+"\n"); n != 1 {
			t.Errorf("%s: %d times next to the reference's, want once", shared, n)
		}
	}
	if err := b.Remove(t.Context(), p.Owner, p.Families()); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(ref, k.Dump()); diff != "" {
		t.Errorf("removing podwire's pod changed the reference's (-before +after):\n%s", diff)
	}

	// An ADD of the reference's pod by podwire (a re-ADD after switching binaries)
	// replaces the reference's rules with podwire's.
	a := hpPlanA()
	if err := b.Apply(t.Context(), a); err != nil {
		t.Fatal(err)
	}
	if err := b.Check(t.Context(), a); err != nil {
		t.Error(err)
	}
	if d := k.Dump(); strings.Contains(d, "dnat name:") || strings.Contains(d, "-j CNI-HOSTPORT-SETMARK") {
		t.Errorf("the reference's rules of the re-added pod are left:\n%s", d)
	}
	if err := b.Remove(t.Context(), a.Owner, a.Families()); err != nil {
		t.Fatal(err)
	}
	requireEmpty(t, k, "removing the last pod")
}

// refMasq is the reference bridge's ipMasq of expnet/ctr1 at 10.77.0.2/24, as read
// from `iptables -t nat -S` after its ADD (seeded after kube-proxy's jump); refMasqOldJump is
// the jump older reference versions wrote (by subnet).
const (
	refMasq = `*nat
:CNI-cc94bae7a43faa95404efc2e - [0:0]
-A CNI-cc94bae7a43faa95404efc2e -d 10.77.0.0/24 -m comment --comment "name: \"expnet\" id: \"ctr1\"" -j ACCEPT
-A CNI-cc94bae7a43faa95404efc2e ! -d 224.0.0.0/4 -m comment --comment "name: \"expnet\" id: \"ctr1\"" -j MASQUERADE
`
	refMasqJump    = `-A POSTROUTING -s 10.77.0.2/32 -m comment --comment "name: \"expnet\" id: \"ctr1\"" -j CNI-cc94bae7a43faa95404efc2e` + "\n"
	refMasqOldJump = `-A POSTROUTING -s 10.77.0.0/24 -m comment --comment "name: \"expnet\" id: \"ctr1\"" -j CNI-cc94bae7a43faa95404efc2e` + "\n"
)

func TestMasqOverTheReferencesPod(t *testing.T) {
	p := netfilter.MasqPlan{Owner: masqOwner1, Addrs: masqPlan1().Addrs[:1]}
	kube := "*nat\n:KUBE-POSTROUTING - [0:0]\n-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\nCOMMIT\n"
	for _, tc := range []struct {
		name, jump string
		del        func(b netfilter.MasqBackend) error
	}{
		{"DEL with addresses", refMasqJump, func(b netfilter.MasqBackend) error { return b.Remove(t.Context(), p.Owner, p.Addrs) }},
		{"DEL without addresses", refMasqJump, func(b netfilter.MasqBackend) error { return b.Remove(t.Context(), p.Owner, nil) }},
		{"DEL of an old subnet jump", refMasqOldJump, func(b netfilter.MasqBackend) error { return b.Remove(t.Context(), p.Owner, p.Addrs) }},
		{"GC", refMasqJump, func(b netfilter.MasqBackend) error {
			return b.GC(t.Context(), "expnet", cniplumb.Owners{masqOwner2: true, {Network: "other", ContainerID: "ctr1"}: true})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := fake.New()
			want := seedIPv4(t, k, kube)
			ref := seedIPv4(t, k, refMasq+tc.jump+"COMMIT\n")
			b := netfilter.NewMasqOn(netfilter.KindIPTables, k, k)
			if tc.jump == refMasqJump {
				// podwire writes exactly what the reference wrote: its ADD adds nothing
				// and its CHECK accepts the reference's rules.
				if err := b.Apply(t.Context(), p); err != nil {
					t.Fatal(err)
				}
				if d := cmp.Diff(ref, k.Dump()); d != "" {
					t.Errorf("ADD over the reference's rules changed them (-before +after):\n%s", d)
				}
				if err := b.Check(t.Context(), p); err != nil {
					t.Error(err)
				}
				// A GC keeping any interface of the container keeps it (the layout
				// knows no interface names).
				if err := b.GC(t.Context(), "expnet", cniplumb.Owners{{Network: "expnet", ContainerID: "ctr1", IfName: "net9"}: true}); err != nil {
					t.Fatal(err)
				}
				if err := b.Check(t.Context(), p); err != nil {
					t.Errorf("after a GC keeping the container: %v", err)
				}
			}
			if err := tc.del(b); err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(want, k.Dump()); d != "" {
				t.Errorf("after %s (-want +got):\n%s", tc.name, d)
			}
		})
	}
}

// The reference portmap's nftables backend keeps tables ip and ip6 cni_hostport and
// comments every rule with the bare container ID.
func TestHostPortsNFTRemoveTheReferencesRules(t *testing.T) {
	k := fake.New()
	comment := func(s string) []byte { return userdata.AppendString(nil, userdata.TypeComment, s) }
	for _, fam := range []nftables.TableFamily{nftables.TableFamilyIPv4, nftables.TableFamilyIPv6} {
		tab := k.AddTable(&nftables.Table{Name: "cni_hostport", Family: fam})
		for _, name := range []string{"hostports", "hostip_hostports", "masquerading"} {
			ch := k.AddChain(&nftables.Chain{Name: name, Table: tab})
			for _, id := range []string{"abc", "def"} {
				k.AddRule(&nftables.Rule{Table: tab, Chain: ch, Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}, UserData: comment(id)})
			}
		}
	}
	if err := k.Flush(); err != nil {
		t.Fatal(err)
	}
	b := netfilter.NewHostPortsOn(netfilter.KindNFTables, k, k)
	if err := b.Remove(t.Context(), hpOwnerA, netfilter.All); err != nil {
		t.Fatal(err)
	}
	d := k.Dump()
	if got := len(dumpLines(d, "nft     ")); got != 6 || strings.Contains(d, "# abc") {
		t.Errorf("want only the 6 rules of container def left:\n%s", d)
	}
}

// GC judges only jumps it can tell are the network's: the comment names the network
// and the target is the chain derived from network and container. A forged comment,
// another network's pod and kube-proxy's jump stay.
func TestMasqGCLeavesForeignJumps(t *testing.T) {
	k := fake.New()
	seedIPv4(t, k, `*nat
:KUBE-POSTROUTING - [0:0]
:CNI-000000000000000000000000 - [0:0]
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A POSTROUTING -s 10.77.0.9/32 -m comment --comment "name: \"expnet\" id: \"forged\"" -j CNI-000000000000000000000000
COMMIT
`)
	b := netfilter.NewMasqOn(netfilter.KindIPTables, k, k)
	other := netfilter.MasqPlan{Owner: Owner{Network: "othernet", ContainerID: "ctr1", IfName: "eth0"}, Addrs: masqPlan1().Addrs}
	if err := b.Apply(t.Context(), other); err != nil {
		t.Fatal(err)
	}
	want := k.Dump()
	if err := b.Apply(t.Context(), masqPlan2()); err != nil {
		t.Fatal(err)
	}
	if err := b.GC(t.Context(), "expnet", cniplumb.Owners{masqOwner1: true}); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(want, k.Dump()); d != "" {
		t.Errorf("GC of expnet keeping ctr1 (-want +got):\n%s", d)
	}
}
