package netfilter

import "net/netip"

// The generic owner-tagged layer's tests use a masquerade as their worked example.
// bridge's ipMasq does not use this model (it keeps the reference plugin's layout, see
// masquerade.go); these fixtures keep the generic tests readable.

// MasqFeature is the example feature: chain PW-MASQ-POSTROUTING, table inet
// podwire_masq.
var MasqFeature = Feature{Name: "masq", Hooks: []Hook{NATPostrouting}}

// PlanMasquerade is three neutral rules per address: return for the subnet, return
// for multicast, masquerade the rest.
func PlanMasquerade(o Owner, addrs []netip.Prefix) Plan {
	p := Plan{Feature: MasqFeature, Owner: o}
	for _, a := range addrs {
		fam := FamilyOf(a.Addr())
		src := hostPrefix(a.Addr())
		p.Rules = append(p.Rules,
			Rule{Hook: NATPostrouting, Family: fam, Match: Match{Src: src, Dst: a.Masked()}, Action: Action{Kind: Return}},
			Rule{Hook: NATPostrouting, Family: fam, Match: Match{Src: src, Dst: multicastOf(fam)}, Action: Action{Kind: Return}},
			Rule{Hook: NATPostrouting, Family: fam, Match: Match{Src: src}, Action: Action{Kind: Masquerade}},
		)
	}
	return p
}
