// SPDX-License-Identifier: Apache-2.0

package netfilter_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/nftables"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/netfilter"
	"github.com/podwire/podwire/pkg/netfilter/fake"
)

// Golden tests of every layout on the fake kernel: two owners applied, the whole
// state compared with what the reference plugins write (iptables layouts) or with
// podwire's own tables (nftables), then everything removed again. The iptables goldens
// start from kube-proxy's jumps, so they show where the layouts put theirs.

// The reference portmap (plugins v1.10.0, portmap_iptables.go) for hpPlanA and
// hpPlanB, as `iptables -S` prints it, with two differences that are podwire's: the
// jump into CNI-DN-<hash> carries podwire's owner tag instead of
// `dnat name: "podnet" id: "abc"` (both end in "-j CNI-DN-<hash>", which is what
// either binary's DEL deletes), and the marks are set directly instead of through
// CNI-HOSTPORT-SETMARK. CNI-HOSTPORT-MASQ's entry is inserted first in POSTROUTING
// (the reference's prependEntry), the DNAT entries are appended.
const hostPortsIPTablesGolden = `ipv4 nat -N CNI-DN-0830037e596fec4874866
ipv4 nat -A CNI-DN-0830037e596fec4874866 -s 10.88.0.0/16 -p tcp -m tcp --dport 8080 -m comment --comment "pw:<tag> podnet/abc/eth0" -j MARK --set-xmark 0x2000/0x2000
ipv4 nat -A CNI-DN-0830037e596fec4874866 -s 127.0.0.1/32 -p tcp -m tcp --dport 8080 -m comment --comment "pw:<tag> podnet/abc/eth0" -j MARK --set-xmark 0x2000/0x2000
ipv4 nat -A CNI-DN-0830037e596fec4874866 -p tcp -m tcp --dport 8080 -m comment --comment "pw:<tag> podnet/abc/eth0" -j DNAT --to-destination 10.88.0.5:80
ipv4 nat -A CNI-DN-0830037e596fec4874866 -s 10.88.0.0/16 -p tcp -m tcp --dport 8443 -m comment --comment "pw:<tag> podnet/abc/eth0" -j MARK --set-xmark 0x2000/0x2000
ipv4 nat -A CNI-DN-0830037e596fec4874866 -s 127.0.0.1/32 -p tcp -m tcp --dport 8443 -m comment --comment "pw:<tag> podnet/abc/eth0" -j MARK --set-xmark 0x2000/0x2000
ipv4 nat -A CNI-DN-0830037e596fec4874866 -p tcp -m tcp --dport 8443 -m comment --comment "pw:<tag> podnet/abc/eth0" -j DNAT --to-destination 10.88.0.5:443
ipv4 nat -A CNI-DN-0830037e596fec4874866 -s 10.88.0.0/16 -d 192.0.2.1/32 -p udp -m udp --dport 5353 -m comment --comment "pw:<tag> podnet/abc/eth0" -j MARK --set-xmark 0x2000/0x2000
ipv4 nat -A CNI-DN-0830037e596fec4874866 -s 127.0.0.1/32 -d 192.0.2.1/32 -p udp -m udp --dport 5353 -m comment --comment "pw:<tag> podnet/abc/eth0" -j MARK --set-xmark 0x2000/0x2000
ipv4 nat -A CNI-DN-0830037e596fec4874866 -d 192.0.2.1/32 -p udp -m udp --dport 5353 -m comment --comment "pw:<tag> podnet/abc/eth0" -j DNAT --to-destination 10.88.0.5:53
ipv4 nat -N CNI-DN-98c6379f8ca6ff2d2cb98
ipv4 nat -A CNI-DN-98c6379f8ca6ff2d2cb98 -s 10.88.0.0/16 -p tcp -m tcp --dport 9090 -m comment --comment "pw:<tag> podnet/def/eth0" -j MARK --set-xmark 0x2000/0x2000
ipv4 nat -A CNI-DN-98c6379f8ca6ff2d2cb98 -s 127.0.0.1/32 -p tcp -m tcp --dport 9090 -m comment --comment "pw:<tag> podnet/def/eth0" -j MARK --set-xmark 0x2000/0x2000
ipv4 nat -A CNI-DN-98c6379f8ca6ff2d2cb98 -p tcp -m tcp --dport 9090 -m comment --comment "pw:<tag> podnet/def/eth0" -j DNAT --to-destination 10.88.0.6:8080
ipv4 nat -N CNI-HOSTPORT-DNAT
ipv4 nat -A CNI-HOSTPORT-DNAT -p tcp -m multiport --dports 8080,8443 -m comment --comment "pw:<tag> podnet/abc/eth0" -j CNI-DN-0830037e596fec4874866
ipv4 nat -A CNI-HOSTPORT-DNAT -p udp -m multiport --dports 5353 -m comment --comment "pw:<tag> podnet/abc/eth0" -j CNI-DN-0830037e596fec4874866
ipv4 nat -A CNI-HOSTPORT-DNAT -p tcp -m multiport --dports 9090 -m comment --comment "pw:<tag> podnet/def/eth0" -j CNI-DN-98c6379f8ca6ff2d2cb98
ipv4 nat -N CNI-HOSTPORT-MASQ
ipv4 nat -A CNI-HOSTPORT-MASQ -m mark --mark 0x2000/0x2000 -j MASQUERADE
ipv4 nat -N KUBE-POSTROUTING
ipv4 nat -N KUBE-SERVICES
ipv4 nat -A OUTPUT -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
ipv4 nat -A POSTROUTING -m comment --comment "CNI portfwd requiring masquerade" -j CNI-HOSTPORT-MASQ
ipv4 nat -A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
ipv4 nat -A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
ipv4 nat -A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
ipv6 nat -N CNI-DN-0830037e596fec4874866
ipv6 nat -A CNI-DN-0830037e596fec4874866 -s fd88::/64 -p tcp -m tcp --dport 8080 -m comment --comment "pw:<tag> podnet/abc/eth0" -j MARK --set-xmark 0x2000/0x2000
ipv6 nat -A CNI-DN-0830037e596fec4874866 -p tcp -m tcp --dport 8080 -m comment --comment "pw:<tag> podnet/abc/eth0" -j DNAT --to-destination [fd88::5]:80
ipv6 nat -N CNI-HOSTPORT-DNAT
ipv6 nat -A CNI-HOSTPORT-DNAT -p tcp -m multiport --dports 8080 -m comment --comment "pw:<tag> podnet/abc/eth0" -j CNI-DN-0830037e596fec4874866
ipv6 nat -N CNI-HOSTPORT-MASQ
ipv6 nat -A CNI-HOSTPORT-MASQ -m mark --mark 0x2000/0x2000 -j MASQUERADE
ipv6 nat -N KUBE-POSTROUTING
ipv6 nat -N KUBE-SERVICES
ipv6 nat -A OUTPUT -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
ipv6 nat -A POSTROUTING -m comment --comment "CNI portfwd requiring masquerade" -j CNI-HOSTPORT-MASQ
ipv6 nat -A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
ipv6 nat -A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
ipv6 nat -A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
`

// podwire's own table for the same plans: per family the hairpin marks and DNATs in
// prerouting, the same plus the localhost marks in output, one masquerade per pod
// address in postrouting.
const hostPortsNFTablesGolden = `nft table inet podwire_hostport
nft   chain output (type nat hook 3 priority -100)
nft     meta nfproto ipv4 ip saddr 10.88.0.0/16 fib daddr type local meta l4proto tcp th dport 8080 meta mark set meta mark & 0xffffdfff | 0x2000 # pw:<tag> podnet/abc/eth0
nft     meta nfproto ipv4 ip saddr 127.0.0.1 fib daddr type local meta l4proto tcp th dport 8080 meta mark set meta mark & 0xffffdfff | 0x2000 # pw:<tag> podnet/abc/eth0
nft     meta nfproto ipv4 fib daddr type local meta l4proto tcp th dport 8080 dnat to 10.88.0.5:80 # pw:<tag> podnet/abc/eth0
nft     meta nfproto ipv4 ip saddr 10.88.0.0/16 fib daddr type local meta l4proto tcp th dport 8443 meta mark set meta mark & 0xffffdfff | 0x2000 # pw:<tag> podnet/abc/eth0
nft     meta nfproto ipv4 ip saddr 127.0.0.1 fib daddr type local meta l4proto tcp th dport 8443 meta mark set meta mark & 0xffffdfff | 0x2000 # pw:<tag> podnet/abc/eth0
nft     meta nfproto ipv4 fib daddr type local meta l4proto tcp th dport 8443 dnat to 10.88.0.5:443 # pw:<tag> podnet/abc/eth0
nft     meta nfproto ipv4 ip saddr 10.88.0.0/16 ip daddr 192.0.2.1 fib daddr type local meta l4proto udp th dport 5353 meta mark set meta mark & 0xffffdfff | 0x2000 # pw:<tag> podnet/abc/eth0
nft     meta nfproto ipv4 ip saddr 127.0.0.1 ip daddr 192.0.2.1 fib daddr type local meta l4proto udp th dport 5353 meta mark set meta mark & 0xffffdfff | 0x2000 # pw:<tag> podnet/abc/eth0
nft     meta nfproto ipv4 ip daddr 192.0.2.1 fib daddr type local meta l4proto udp th dport 5353 dnat to 10.88.0.5:53 # pw:<tag> podnet/abc/eth0
nft     meta nfproto ipv6 ip6 saddr fd88::/64 fib daddr type local meta l4proto tcp th dport 8080 meta mark set meta mark & 0xffffdfff | 0x2000 # pw:<tag> podnet/abc/eth0
nft     meta nfproto ipv6 fib daddr type local meta l4proto tcp th dport 8080 dnat to [fd88::5]:80 # pw:<tag> podnet/abc/eth0
nft     meta nfproto ipv4 ip saddr 10.88.0.0/16 fib daddr type local meta l4proto tcp th dport 9090 meta mark set meta mark & 0xffffdfff | 0x2000 # pw:<tag> podnet/def/eth0
nft     meta nfproto ipv4 ip saddr 127.0.0.1 fib daddr type local meta l4proto tcp th dport 9090 meta mark set meta mark & 0xffffdfff | 0x2000 # pw:<tag> podnet/def/eth0
nft     meta nfproto ipv4 fib daddr type local meta l4proto tcp th dport 9090 dnat to 10.88.0.6:8080 # pw:<tag> podnet/def/eth0
nft   chain postrouting (type nat hook 4 priority 100)
nft     meta nfproto ipv4 ip daddr 10.88.0.5 meta mark & 0x2000 == 0x2000 masquerade # pw:<tag> podnet/abc/eth0
nft     meta nfproto ipv6 ip6 daddr fd88::5 meta mark & 0x2000 == 0x2000 masquerade # pw:<tag> podnet/abc/eth0
nft     meta nfproto ipv4 ip daddr 10.88.0.6 meta mark & 0x2000 == 0x2000 masquerade # pw:<tag> podnet/def/eth0
nft   chain prerouting (type nat hook 0 priority -100)
nft     meta nfproto ipv4 ip saddr 10.88.0.0/16 fib daddr type local meta l4proto tcp th dport 8080 meta mark set meta mark & 0xffffdfff | 0x2000 # pw:<tag> podnet/abc/eth0
nft     meta nfproto ipv4 fib daddr type local meta l4proto tcp th dport 8080 dnat to 10.88.0.5:80 # pw:<tag> podnet/abc/eth0
nft     meta nfproto ipv4 ip saddr 10.88.0.0/16 fib daddr type local meta l4proto tcp th dport 8443 meta mark set meta mark & 0xffffdfff | 0x2000 # pw:<tag> podnet/abc/eth0
nft     meta nfproto ipv4 fib daddr type local meta l4proto tcp th dport 8443 dnat to 10.88.0.5:443 # pw:<tag> podnet/abc/eth0
nft     meta nfproto ipv4 ip saddr 10.88.0.0/16 ip daddr 192.0.2.1 fib daddr type local meta l4proto udp th dport 5353 meta mark set meta mark & 0xffffdfff | 0x2000 # pw:<tag> podnet/abc/eth0
nft     meta nfproto ipv4 ip daddr 192.0.2.1 fib daddr type local meta l4proto udp th dport 5353 dnat to 10.88.0.5:53 # pw:<tag> podnet/abc/eth0
nft     meta nfproto ipv6 ip6 saddr fd88::/64 fib daddr type local meta l4proto tcp th dport 8080 meta mark set meta mark & 0xffffdfff | 0x2000 # pw:<tag> podnet/abc/eth0
nft     meta nfproto ipv6 fib daddr type local meta l4proto tcp th dport 8080 dnat to [fd88::5]:80 # pw:<tag> podnet/abc/eth0
nft     meta nfproto ipv4 ip saddr 10.88.0.0/16 fib daddr type local meta l4proto tcp th dport 9090 meta mark set meta mark & 0xffffdfff | 0x2000 # pw:<tag> podnet/def/eth0
nft     meta nfproto ipv4 fib daddr type local meta l4proto tcp th dport 9090 dnat to 10.88.0.6:8080 # pw:<tag> podnet/def/eth0
`

// The reference bridge (plugins v1.10.0, pkg/ip/ipmasq_iptables_linux.go) for
// masqPlan1 and masqPlan2: one chain per network and container, an ACCEPT of the
// pod's subnet and a MASQUERADE of all but multicast, one POSTROUTING jump per pod
// address, every rule commented `name: "<network>" id: "<containerID>"`.
const masqIPTablesGolden = `ipv4 nat -N CNI-a0ec8203b259decb5a4b55ee
ipv4 nat -A CNI-a0ec8203b259decb5a4b55ee -d 10.77.0.0/24 -m comment --comment "name: \"expnet\" id: \"ctr2\"" -j ACCEPT
ipv4 nat -A CNI-a0ec8203b259decb5a4b55ee ! -d 224.0.0.0/4 -m comment --comment "name: \"expnet\" id: \"ctr2\"" -j MASQUERADE
ipv4 nat -N CNI-cc94bae7a43faa95404efc2e
ipv4 nat -A CNI-cc94bae7a43faa95404efc2e -d 10.77.0.0/24 -m comment --comment "name: \"expnet\" id: \"ctr1\"" -j ACCEPT
ipv4 nat -A CNI-cc94bae7a43faa95404efc2e ! -d 224.0.0.0/4 -m comment --comment "name: \"expnet\" id: \"ctr1\"" -j MASQUERADE
ipv4 nat -N KUBE-POSTROUTING
ipv4 nat -N KUBE-SERVICES
ipv4 nat -A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
ipv4 nat -A POSTROUTING -s 10.77.0.2/32 -m comment --comment "name: \"expnet\" id: \"ctr1\"" -j CNI-cc94bae7a43faa95404efc2e
ipv4 nat -A POSTROUTING -s 10.77.0.3/32 -m comment --comment "name: \"expnet\" id: \"ctr2\"" -j CNI-a0ec8203b259decb5a4b55ee
ipv4 nat -A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
ipv6 nat -N CNI-cc94bae7a43faa95404efc2e
ipv6 nat -A CNI-cc94bae7a43faa95404efc2e -d fd77::/64 -m comment --comment "name: \"expnet\" id: \"ctr1\"" -j ACCEPT
ipv6 nat -A CNI-cc94bae7a43faa95404efc2e ! -d ff00::/8 -m comment --comment "name: \"expnet\" id: \"ctr1\"" -j MASQUERADE
ipv6 nat -N KUBE-POSTROUTING
ipv6 nat -N KUBE-SERVICES
ipv6 nat -A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
ipv6 nat -A POSTROUTING -s fd77::2/128 -m comment --comment "name: \"expnet\" id: \"ctr1\"" -j CNI-cc94bae7a43faa95404efc2e
ipv6 nat -A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
`

// The reference bridge (pkg/ip/ipmasq_nftables_linux.go): table inet
// cni_plugins_masquerade, postrouting returning multicast and going to masq_checks,
// one rule per pod address there, commented with the instance hashes
// (sha512(network)[:16]-sha512(ifname:containerID)[:16]) and the names.
const masqNFTablesGolden = `nft table inet cni_plugins_masquerade
nft   chain masq_checks
nft     meta nfproto ipv4 ip saddr 10.77.0.2 ip daddr != 10.77.0.0/24 masquerade # b5a1a0612e405423-7883a6f9ce71eedb, net: expnet, if: eth0, id: ctr1
nft     meta nfproto ipv6 ip6 saddr fd77::2 ip6 daddr != fd77::/64 masquerade # b5a1a0612e405423-7883a6f9ce71eedb, net: expnet, if: eth0, id: ctr1
nft     meta nfproto ipv4 ip saddr 10.77.0.3 ip daddr != 10.77.0.0/24 masquerade # b5a1a0612e405423-a09553539d4cc24c, net: expnet, if: eth0, id: ctr2
nft   chain postrouting (type nat hook 4 priority 100)
nft     meta nfproto ipv4 ip daddr 224.0.0.0/4 return
nft     meta nfproto ipv6 ip6 daddr ff00::/8 return
nft     goto masq_checks
`

func TestHostPortLayouts(t *testing.T) {
	for _, tc := range []struct {
		kind    netfilter.Kind
		foreign string
		want    string
	}{
		{netfilter.KindIPTables, foreignNAT, hostPortsIPTablesGolden},
		{netfilter.KindNFTables, "", hostPortsNFTablesGolden},
	} {
		t.Run(string(tc.kind), func(t *testing.T) {
			k := fake.New()
			if tc.foreign != "" {
				restoreBoth(t, k, tc.foreign)
			}
			base := k.Dump()
			b := netfilter.NewHostPortsOn(tc.kind, k, k)
			plans := []netfilter.HostPortPlan{hpPlanA(), hpPlanB()}
			for _, p := range plans {
				if err := b.Apply(t.Context(), p); err != nil {
					t.Fatalf("Apply(%s): %v", p.Owner, err)
				}
			}
			got := k.Dump()
			if d := cmp.Diff(tc.want, readable(got)); d != "" {
				t.Errorf("layout (-want +got):\n%s", d)
			}
			requireTags(t, got, hpOwnerA, hpOwnerB)
			// A repeated ADD replaces the owner's rules: the same rules, its own
			// moved behind the others'.
			if err := b.Apply(t.Context(), plans[0]); err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(sortedLines(got), sortedLines(k.Dump())); d != "" {
				t.Errorf("a repeated Apply changed the layout (-before +after):\n%s", d)
			}
			for _, p := range plans {
				if err := b.Check(t.Context(), p); err != nil {
					t.Errorf("Check(%s): %v", p.Owner, err)
				}
			}
			for _, p := range plans {
				for range 2 {
					if err := b.Remove(t.Context(), p.Owner, p.Families()); err != nil {
						t.Fatalf("Remove(%s): %v", p.Owner, err)
					}
				}
				if err := b.Check(t.Context(), p); !netfilter.IsNotFound(err) {
					t.Errorf("Check(%s) after Remove = %v, want IsNotFound", p.Owner, err)
				}
			}
			if d := cmp.Diff(base, k.Dump()); d != "" {
				t.Errorf("after removing every owner (-before +after):\n%s", d)
			}
		})
	}
}

// With externalSetMarkChain (kube-proxy's KUBE-MARK-MASQ) the marks jump there, as
// the reference's do, and portmap has no masquerade of its own.
func TestHostPortsExternalSetMarkChain(t *testing.T) {
	k := fake.New()
	b := netfilter.NewHostPortsOn(netfilter.KindIPTables, k, k)
	p := hpPlanB()
	p.Mark, p.SetMarkChain = 0, "KUBE-MARK-MASQ"
	if err := b.Apply(t.Context(), p); cniplumb.Code(err) != 7 || !strings.Contains(err.Error(), "KUBE-MARK-MASQ") {
		t.Errorf("Apply without the chain = %v, want a code-7 error naming it", err)
	}
	requireEmpty(t, k, "a failed Apply")
	kube := seedIPv4(t, k, "*nat\n:KUBE-MARK-MASQ - [0:0]\n-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\nCOMMIT\n")
	if err := b.Apply(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	want := `ipv4 nat -N CNI-DN-98c6379f8ca6ff2d2cb98
ipv4 nat -A CNI-DN-98c6379f8ca6ff2d2cb98 -s 10.88.0.0/16 -p tcp -m tcp --dport 9090 -m comment --comment "pw:<tag> podnet/def/eth0" -j KUBE-MARK-MASQ
ipv4 nat -A CNI-DN-98c6379f8ca6ff2d2cb98 -s 127.0.0.1/32 -p tcp -m tcp --dport 9090 -m comment --comment "pw:<tag> podnet/def/eth0" -j KUBE-MARK-MASQ
ipv4 nat -A CNI-DN-98c6379f8ca6ff2d2cb98 -p tcp -m tcp --dport 9090 -m comment --comment "pw:<tag> podnet/def/eth0" -j DNAT --to-destination 10.88.0.6:8080
ipv4 nat -N CNI-HOSTPORT-DNAT
ipv4 nat -A CNI-HOSTPORT-DNAT -p tcp -m multiport --dports 9090 -m comment --comment "pw:<tag> podnet/def/eth0" -j CNI-DN-98c6379f8ca6ff2d2cb98
ipv4 nat -N KUBE-MARK-MASQ
ipv4 nat -A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
ipv4 nat -A OUTPUT -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
ipv4 nat -A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
`
	if d := cmp.Diff(want, readable(k.Dump())); d != "" {
		t.Errorf("layout (-want +got):\n%s", d)
	}
	if err := b.Check(t.Context(), p); err != nil {
		t.Error(err)
	}
	if err := b.Remove(t.Context(), p.Owner, p.Families()); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(kube, k.Dump()); d != "" {
		t.Errorf("after Remove (-want +got):\n%s", d)
	}
	// nftables cannot jump into an iptables chain.
	nft := netfilter.NewHostPortsOn(netfilter.KindNFTables, k, k)
	if err := nft.Apply(t.Context(), p); err == nil || !strings.Contains(err.Error(), "iptables") {
		t.Errorf("nftables Apply with an external mark chain: %v", err)
	}
}

func TestMasqLayouts(t *testing.T) {
	for _, tc := range []struct {
		kind    netfilter.Kind
		foreign string
		want    string
	}{
		{netfilter.KindIPTables, foreignNAT, masqIPTablesGolden},
		{netfilter.KindNFTables, "", masqNFTablesGolden},
	} {
		t.Run(string(tc.kind), func(t *testing.T) {
			k := fake.New()
			if tc.foreign != "" {
				restoreBoth(t, k, tc.foreign)
			}
			base := k.Dump()
			b := netfilter.NewMasqOn(tc.kind, k, k)
			plans := []netfilter.MasqPlan{masqPlan1(), masqPlan2()}
			for _, p := range plans {
				if err := b.Apply(t.Context(), p); err != nil {
					t.Fatalf("Apply(%s): %v", p.Owner, err)
				}
			}
			got := k.Dump()
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("layout (-want +got):\n%s", d)
			}
			// A repeated ADD keeps the rules (iptables, as the reference's
			// AppendUnique) or replaces them (nftables, as the reference's ADD does).
			if err := b.Apply(t.Context(), plans[0]); err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(sortedLines(got), sortedLines(k.Dump())); d != "" {
				t.Errorf("a repeated Apply changed the layout (-before +after):\n%s", d)
			}
			for _, p := range plans {
				if err := b.Check(t.Context(), p); err != nil {
					t.Errorf("Check(%s): %v", p.Owner, err)
				}
			}
			// Once with the addresses (prevResult), once without.
			if err := b.Remove(t.Context(), masqOwner1, plans[0].Addrs); err != nil {
				t.Fatal(err)
			}
			if err := b.Remove(t.Context(), masqOwner2, nil); err != nil {
				t.Fatal(err)
			}
			for _, p := range plans {
				if err := b.Remove(t.Context(), p.Owner, nil); err != nil {
					t.Fatalf("repeated Remove(%s): %v", p.Owner, err)
				}
				if err := b.Check(t.Context(), p); !netfilter.IsNotFound(err) {
					t.Errorf("Check(%s) after Remove = %v, want IsNotFound", p.Owner, err)
				}
			}
			if d := cmp.Diff(base, k.Dump()); d != "" {
				t.Errorf("after removing every owner (-before +after):\n%s", d)
			}
		})
	}
}

// CHECK compares rules per chain: output's DNAT (localhost connections) moved into
// prerouting is a rule missing from output, even though prerouting's DNAT of the same
// mapping reads the same.
func TestHostPortsNFTCheckSeesTheChain(t *testing.T) {
	k := fake.New()
	b := netfilter.NewHostPortsOn(netfilter.KindNFTables, k, k)
	p := hpPlanB()
	if err := b.Apply(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	tab := &nftables.Table{Name: "podwire_hostport", Family: nftables.TableFamilyINet}
	out, pre := &nftables.Chain{Name: "output", Table: tab}, &nftables.Chain{Name: "prerouting", Table: tab}
	rules, err := k.GetRules(tab, out)
	if err != nil {
		t.Fatal(err)
	}
	dnat := rules[len(rules)-1]
	if err := k.DelRule(dnat); err != nil {
		t.Fatal(err)
	}
	moved := *dnat
	moved.Chain, moved.Handle = pre, 0
	k.AddRule(&moved)
	if err := k.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := b.Check(t.Context(), p); err == nil {
		t.Errorf("Check passed with output's DNAT in prerouting:\n%s", k.Dump())
	}
}

// shortDump is a kernel whose next dumps of chain miss its last rule, as a dump that
// another program's changes interrupted can (google/nftables does not report
// NLM_F_DUMP_INTR).
type shortDump struct {
	*fake.Kernel
	chain  string
	misses int
}

func (k *shortDump) GetRules(t *nftables.Table, c *nftables.Chain) ([]*nftables.Rule, error) {
	rs, err := k.Kernel.GetRules(t, c)
	if c.Name == k.chain && k.misses > 0 && len(rs) > 0 {
		k.misses--
		rs = rs[:len(rs)-1]
	}
	return rs, err
}

// TestCheckRereadsAShortDump: CHECK of a live attachment passes when one dump missed
// its rule (seen in TestBridgeChurnNoDuplicateAddress, CHECK running beside other
// pods' ADD and DEL), and still fails when every dump misses it.
func TestCheckRereadsAShortDump(t *testing.T) {
	k := &shortDump{Kernel: fake.New(), chain: "masq_checks"}
	b := netfilter.NewMasqOn(netfilter.KindNFTables, k, k)
	p1, p2 := masqPlan1(), masqPlan2()
	for _, p := range []netfilter.MasqPlan{p1, p2} {
		if err := b.Apply(t.Context(), p); err != nil {
			t.Fatal(err)
		}
	}
	k.misses = 1
	if err := b.Check(t.Context(), p2); err != nil {
		t.Errorf("Check after one short dump: %v", err)
	}
	k.misses = 100
	if err := b.Check(t.Context(), p2); !netfilter.IsNotFound(err) {
		t.Errorf("Check with every dump short = %v, want not found", err)
	}
}
