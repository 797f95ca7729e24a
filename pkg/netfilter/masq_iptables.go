// SPDX-License-Identifier: Apache-2.0

package netfilter

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// ipMasq in the reference's iptables layout (masquerade.go), pure: what to add, check
// and remove, decided from listings of one chain and of POSTROUTING; masq_xt.go runs it.

// masqPostrouting is the built-in chain the per-address jumps hang off.
const masqPostrouting = "POSTROUTING"

func addrsOf(fam Family, addrs []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, a := range addrs {
		if FamilyOf(a.Addr()) == fam {
			out = append(out, a)
		}
	}
	return out
}

// planMasqXTAdd returns the restore lines that give family fam of p's owner every rule
// of p, given the listings of the owner's chain and of POSTROUTING (not needed when
// the chain does not exist: then no jump to it can either); none when all are there,
// which is what CHECK asks. The rules are the reference's as `iptables -S` prints
// them: in the chain an ACCEPT per subnet, then a MASQUERADE; in POSTROUTING a jump
// per address. Rules already there stay; missing ACCEPTs go in front of the MASQUERADE.
func planMasqXTAdd(p MasqPlan, fam Family, own chainListing, post []xtRule) []string {
	name, c := MasqChain(p.Owner), xtQuote(masqComment(p.Owner))
	var rules, jumps []string
	seen := map[netip.Prefix]bool{}
	for _, a := range addrsOf(fam, p.Addrs) {
		if n := a.Masked(); !seen[n] {
			seen[n] = true
			rules = append(rules, fmt.Sprintf("-A %s -d %s -m comment --comment %s -j ACCEPT", name, n, c))
		}
		jumps = append(jumps, fmt.Sprintf("-A %s -s %s -m comment --comment %s -j %s", masqPostrouting, hostPrefix(a.Addr()), c, name))
	}
	if len(rules) == 0 {
		return nil
	}
	rules = append(rules, fmt.Sprintf("-A %s ! -d %s -m comment --comment %s -j MASQUERADE", name, multicast[fam], c))
	if !own.exists {
		return append(append([]string{":" + name + " - [0:0]"}, rules...), jumps...)
	}
	var out []string
	accepts, masq := rules[:len(rules)-1], rules[len(rules)-1]
	// Insert the missing ACCEPTs at the top in reverse, so they end up in order.
	for i := len(accepts) - 1; i >= 0; i-- {
		if !own.has(accepts[i]) {
			out = append(out, "-I "+name+" 1"+strings.TrimPrefix(accepts[i], "-A "+name))
		}
	}
	if !own.has(masq) {
		out = append(out, masq)
	}
	for _, j := range jumps {
		if !containsRule(post, j) {
			out = append(out, j)
		}
	}
	return out
}

// planMasqXTDel returns the restore lines that remove the jumps into chain name from
// POSTROUTING and, when none remains, the chain itself. addrs are the owner's
// addresses of this family when known: only their jumps go (also the reference's old
// "-s <subnet>" form); nil means every jump into the chain. chainExists says whether
// the chain is there when post shows no jump to it.
func planMasqXTDel(name string, addrs []netip.Prefix, post []xtRule, chainExists bool) []string {
	var out []string
	remaining := 0
	for _, r := range post {
		if r.chain != masqPostrouting || r.target != name {
			continue
		}
		chainExists = true
		if addrs != nil && !fromAny(r.src, addrs) {
			remaining++
			continue
		}
		out = append(out, r.deleteLine())
	}
	if chainExists && remaining == 0 {
		out = append(out, "-F "+name, "-X "+name)
	}
	return out
}

// fromAny reports whether a jump's source is one of addrs, as a single address or as
// its subnet (the form older reference versions wrote).
func fromAny(src netip.Prefix, addrs []netip.Prefix) bool {
	return src.IsValid() && slices.ContainsFunc(addrs, func(a netip.Prefix) bool {
		return src == hostPrefix(a.Addr()) || src == a.Masked()
	})
}
