package netfilter

import (
	"net"
	"net/netip"
)

// MasqFeature is bridge's ipMasq: chain PW-MASQ-POSTROUTING in iptables' nat table,
// table inet podwire_masq in nftables.
var MasqFeature = Feature{Name: "masq", Hooks: []Hook{NATPostrouting}}

var (
	multicast4 = netip.MustParsePrefix("224.0.0.0/4")
	multicast6 = netip.MustParsePrefix("ff00::/8")
)

// PlanMasquerade is the masquerade of one attachment: for each of its addresses (with
// the subnet's prefix length), traffic from that address to any destination outside
// the subnet and not multicast leaves with the node's address. Three rules per address,
// each expressible in iptables: return for the subnet, return for multicast,
// masquerade the rest.
func PlanMasquerade(o Owner, addrs []netip.Prefix) Plan {
	p := Plan{Feature: MasqFeature, Owner: o}
	for _, a := range addrs {
		fam := FamilyOf(a.Addr())
		mc := multicast4
		if fam == IPv6 {
			mc = multicast6
		}
		src := netip.PrefixFrom(a.Addr(), a.Addr().BitLen())
		p.Rules = append(p.Rules,
			Rule{Hook: NATPostrouting, Family: fam, Match: Match{Src: src, Dst: a.Masked()}, Action: Action{Kind: Return}},
			Rule{Hook: NATPostrouting, Family: fam, Match: Match{Src: src, Dst: mc}, Action: Action{Kind: Return}},
			Rule{Hook: NATPostrouting, Family: fam, Match: Match{Src: src}, Action: Action{Kind: Masquerade}},
		)
	}
	return p
}

// MacSpoofFeature is bridge's macspoofchk: table bridge podwire_macspoof (nftables
// only, as in the reference plugin).
var MacSpoofFeature = Feature{Name: "macspoof", Hooks: []Hook{BridgePrerouting}, Bridge: true}

// PlanMacSpoof drops frames entering the bridge from the pod's host-side port whose
// source MAC is not the pod interface's.
func PlanMacSpoof(o Owner, hostPort string, mac net.HardwareAddr) Plan {
	return Plan{Feature: MacSpoofFeature, Owner: o, Rules: []Rule{{
		Hook: BridgePrerouting, Family: AnyFamily,
		Match:  Match{InIface: hostPort, SrcMAC: mac, NotSrcMAC: true},
		Action: Action{Kind: Drop},
	}}}
}
