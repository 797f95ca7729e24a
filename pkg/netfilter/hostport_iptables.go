// SPDX-License-Identifier: Apache-2.0

package netfilter

import (
	"crypto/sha512"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// The iptables layout of host ports is the reference portmap's, so that each binary's
// DEL removes what the other's ADD created (nodes can switch binaries under live pods):
//
//	nat PREROUTING:  -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
//	nat OUTPUT:      -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
//	nat POSTROUTING: (first) -m comment --comment "CNI portfwd requiring masquerade" -j CNI-HOSTPORT-MASQ
//	CNI-HOSTPORT-MASQ:  -m mark --mark 0x2000/0x2000 -j MASQUERADE   (one per mark bit in use)
//	CNI-HOSTPORT-DNAT:  -p tcp -m multiport --dports 8080,8443 -m comment --comment "pw:..." -j CNI-DN-<hash>
//	CNI-DN-<hash>:      -s <pod subnet> -p tcp -m tcp --dport 8080 ... -j MARK --set-xmark 0x2000/0x2000
//	                    -s 127.0.0.1/32 -p tcp -m tcp --dport 8080 ... -j MARK --set-xmark 0x2000/0x2000
//	                    -p tcp -m tcp --dport 8080 ... -j DNAT --to-destination <pod>:80
//
// CNI-DN-<hash> is the reference's per-container chain (network + container ID),
// entered by a jump ending in "-j CNI-DN-<hash>": exactly what the reference's DEL
// deletes. Our rules there carry our owner tag (which includes the interface name), so
// two attachments of one network to one container share the chain without touching
// each other's rules. The shared chains and their rule text are the reference's, so
// neither binary duplicates them; podwire removes them with the last host port (the
// reference never does). Anyone may flush a built-in or shared chain: every ADD puts
// back missing entry jumps, and DEL and GC remove an attachment's chain by its derived
// name even when no jump leads to it any more.
//
// This file is pure: it plans iptables-restore transactions from listings of these
// chains (never a whole table); hostport_xt.go runs them.

// The reference portmap's shared chains.
const (
	HostPortDNATChain    = "CNI-HOSTPORT-DNAT"
	HostPortMasqChain    = "CNI-HOSTPORT-MASQ"
	HostPortSetMarkChain = "CNI-HOSTPORT-SETMARK" // the reference's; podwire marks directly
	hostPortChainPrefix  = "CNI-DN-"
)

var (
	hpEntryDNAT = "-m addrtype --dst-type LOCAL -j " + HostPortDNATChain
	hpEntryMasq = `-m comment --comment "CNI portfwd requiring masquerade" -j ` + HostPortMasqChain
)

// hpEntry is one jump from a built-in chain into a shared chain.
type hpEntry struct{ builtin, rule string }

var (
	hpEntryPre  = hpEntry{"PREROUTING", hpEntryDNAT}
	hpEntryOut  = hpEntry{"OUTPUT", hpEntryDNAT}
	hpEntryPost = hpEntry{"POSTROUTING", hpEntryMasq}
)

func (e hpEntry) args() []string { return SplitRuleArgs(e.rule) }

// multiportMax is how many ports one multiport match takes.
const multiportMax = 15

func hpMasqRule(mark uint32) string {
	return fmt.Sprintf("-m mark --mark %#x/%#x -j MASQUERADE", mark, mark)
}

// isHostPortMasq recognizes a CNI-HOSTPORT-MASQ rule as portmap writes it.
func isHostPortMasq(r xtRule) bool {
	a := r.args
	return len(a) == 8 && a[2] == "-m" && a[3] == "mark" && a[4] == "--mark" && a[6] == "-j" && a[7] == "MASQUERADE"
}

// HostPortChain is the reference portmap's per-container chain: "CNI-DN-" and the
// SHA-512 of network+containerID, cut to 28 bytes.
func HostPortChain(network, containerID string) string {
	sum := sha512.Sum512([]byte(network + containerID))
	return (hostPortChainPrefix + hex.EncodeToString(sum[:]))[:maxChainName]
}

// hpRendered is one family of a plan: the jumps into the per-container chain and the
// chain's rules, without their "-A <chain>", each with its tag's fingerprint.
type hpRendered struct {
	chain          string
	jumps, rules   []string
	jumpFP, ruleFP []string
}

func renderHostPortIPTables(fam Family, p HostPortPlan) (hpRendered, error) {
	r := hpRendered{chain: HostPortChain(p.Owner.Network, p.Owner.ContainerID)}
	if err := p.Validate(); err != nil {
		return r, err
	}
	// One jump per protocol and 15 ports, protocols in sorted order, ports in
	// configuration order without repeats.
	byProto := map[Proto][]string{}
	seen := map[string]bool{}
	for _, m := range p.Ports {
		k := string(m.Proto) + "/" + strconv.Itoa(int(m.HostPort))
		if m.Family() != fam || seen[k] {
			continue
		}
		seen[k] = true
		byProto[m.Proto] = append(byProto[m.Proto], strconv.Itoa(int(m.HostPort)))
	}
	cond := strings.Join(matchArgs(p.Conditions[fam]), " ")
	for _, pr := range slices.Sorted(maps.Keys(byProto)) {
		ports := byProto[pr]
		for len(ports) > 0 {
			n := min(len(ports), multiportMax)
			m := "-p " + string(pr) + " -m multiport --dports " + strings.Join(ports[:n], ",")
			ports = ports[n:]
			if cond != "" {
				m = cond + " " + m
			}
			t := Tag{NetworkHash: hash8(p.Owner.Network), ID: IDOf(p.Owner), Fingerprint: hash8("jump " + m + " " + r.chain), Owner: p.Owner}
			r.jumps = append(r.jumps, m+" -m comment --comment "+xtQuote(t.String())+" -j "+r.chain)
			r.jumpFP = append(r.jumpFP, t.Fingerprint)
		}
	}
	rules, err := p.portRules(fam, NATPrerouting, false, true, false)
	if err != nil {
		return r, err
	}
	for _, rule := range rules {
		t := tagFor(p.Owner, rule)
		a, err := ruleArgs(rule, t.String())
		if err != nil {
			return r, err
		}
		r.rules = append(r.rules, a)
		r.ruleFP = append(r.ruleFP, t.Fingerprint)
	}
	return r, nil
}

// refOwner reads the reference portmap's jump comment `dnat name: "N" id: "C"`.
func refOwner(comment string) (network, containerID string, ok bool) {
	rest, found := strings.CutPrefix(comment, "dnat ")
	if !found {
		return "", "", false
	}
	return parseMasqComment(rest)
}

// hpState is what a transaction is planned from: listings of the chains it touches.
type hpState struct {
	top     chainListing            // CNI-HOSTPORT-DNAT, always listed
	masq    *chainListing           // CNI-HOSTPORT-MASQ; nil when not listed
	dn      map[string]chainListing // per-container chains listed because they are shared
	entries map[hpEntry]bool        // which entry jumps exist; nil until checked
}

// hpChange is what a transaction does in one family.
type hpChange struct {
	add       *HostPortPlan    // rules to install (replacing add.Owner's)
	removeIDs map[OwnerID]bool // owners whose tagged rules go
	// chains are per-container chains the change concerns even when no jump leads to
	// them (someone flushed CNI-HOSTPORT-DNAT): their untagged (reference) rules go,
	// and so do they, unless a jump of an attachment that stays still uses them.
	chains   map[string]bool
	teardown bool // remove the shared chains if nothing uses them any more
}

// errNeed asks the caller to list a chain (or, for errNeedEntries, check the entry
// jumps) and plan again.
type errNeed string

func (e errNeed) Error() string { return "need a listing of " + string(e) }

const errNeedEntries = errNeed("entry jumps")

// planHostPortIPTables computes the lines (none: nothing changes) of the one
// iptables-restore transaction for ch from st, or an errNeed for a listing st lacks.
func planHostPortIPTables(fam Family, st hpState, ch hpChange) ([]string, error) {
	var decl, dels, adds, post []string
	var rend hpRendered
	if ch.add != nil {
		var err error
		if rend, err = renderHostPortIPTables(fam, *ch.add); err != nil {
			return nil, err
		}
	}
	declare := func(chain string) { decl = append(decl, ":"+chain+" - [0:0]") }
	removeRule := func(r xtRule, chain string) bool {
		return (r.ours && ch.removeIDs[r.tag.ID]) || (!r.ours && ch.chains[chain])
	}

	// Jumps into per-container chains: delete the removed owners' and the reference's
	// for the chains being replaced; count what stays per chain.
	remaining := map[string]int{}
	affected := map[string]bool{}
	maps.Copy(affected, ch.chains)
	topLeft := 0
	for _, r := range st.top.rules {
		if strings.HasPrefix(r.target, hostPortChainPrefix) && removeRule(r, r.target) {
			dels = append(dels, r.deleteLine())
			affected[r.target] = true
			continue
		}
		topLeft++
		remaining[r.target]++
	}
	for _, c := range slices.Sorted(maps.Keys(affected)) {
		if !strings.HasPrefix(c, hostPortChainPrefix) || !validChainName(c) {
			continue
		}
		switch {
		case remaining[c] > 0:
			// Shared with an attachment that stays: remove rule by rule.
			l, ok := st.dn[c]
			if !ok {
				return nil, errNeed(c)
			}
			if !l.exists {
				declare(c)
			}
			for _, r := range l.rules {
				if removeRule(r, c) {
					dels = append(dels, r.deleteLine())
				}
			}
		case c == rend.chain:
			// Declaring an existing chain in --noflush mode flushes it: create or
			// empty it without having to list it.
			declare(c)
		default:
			// Delete it whether or not it exists: declare (create or flush), then -X.
			declare(c)
			post = append(post, "-X "+c)
		}
	}

	if ch.add != nil && len(rend.rules) > 0 {
		// Entry jumps: with a new CNI-HOSTPORT-DNAT they go in with it; with an
		// existing one they are checked, since someone may have flushed PREROUTING or
		// OUTPUT (the reference re-adds its jumps on every ADD, too).
		if !st.top.exists {
			declare(HostPortDNATChain)
			adds = append(adds, "-A PREROUTING "+hpEntryDNAT, "-A OUTPUT "+hpEntryDNAT)
		} else {
			if st.entries == nil {
				return nil, errNeedEntries
			}
			for _, e := range []hpEntry{hpEntryPre, hpEntryOut} {
				if !st.entries[e] {
					adds = append(adds, "-A "+e.builtin+" "+e.rule)
				}
			}
		}
		for _, r := range rend.rules {
			adds = append(adds, "-A "+rend.chain+" "+r)
		}
		for _, j := range rend.jumps {
			adds = append(adds, "-A "+HostPortDNATChain+" "+j)
		}
		if ch.add.masquerades() {
			if st.masq == nil {
				return nil, errNeed(HostPortMasqChain)
			}
			rule := hpMasqRule(ch.add.Mark)
			if !st.masq.exists {
				declare(HostPortMasqChain)
				adds = append(adds, "-I POSTROUTING 1 "+hpEntryMasq)
			} else if st.entries == nil {
				return nil, errNeedEntries
			} else if !st.entries[hpEntryPost] {
				adds = append(adds, "-I POSTROUTING 1 "+hpEntryMasq)
			}
			if !st.masq.has("-A " + HostPortMasqChain + " " + rule) {
				adds = append(adds, "-A "+HostPortMasqChain+" "+rule)
			}
		}
	} else if ch.teardown && st.top.exists && topLeft == 0 {
		// The last host port of the node went: remove the shared chains too, so a node
		// without host ports carries nothing of portmap's. This also clears the empty
		// shared chains the reference's DEL leaves behind; once they are gone, a
		// repeated DEL finds no CNI-HOSTPORT-DNAT and does nothing. Only entry jumps
		// that exist are deleted (a -D of a missing one would fail the transaction).
		if st.masq == nil {
			return nil, errNeed(HostPortMasqChain)
		}
		// Entry jumps not checked yet are taken to be there, as they almost always are:
		// if one is not, the transaction fails and is planned again with the checks.
		present := func(e hpEntry) bool { return st.entries == nil || st.entries[e] }
		for _, e := range []hpEntry{hpEntryPre, hpEntryOut} {
			if present(e) {
				dels = append(dels, "-D "+e.builtin+" "+e.rule)
			}
		}
		post = append(post, "-X "+HostPortDNATChain)
		if st.masq.exists && !slices.ContainsFunc(st.masq.rules, func(r xtRule) bool { return !isHostPortMasq(r) }) {
			if present(hpEntryPost) {
				dels = append(dels, "-D POSTROUTING "+hpEntryMasq)
			}
			declare(HostPortMasqChain)
			post = append(post, "-X "+HostPortMasqChain)
		}
		// The reference's mark chain, unused once CNI-HOSTPORT-DNAT is gone.
		declare(HostPortSetMarkChain)
		post = append(post, "-X "+HostPortSetMarkChain)
	}

	if len(dels) == 0 && len(adds) == 0 && len(post) == 0 {
		// Declarations alone only create or flush chains: with nothing removed or
		// added there is nothing to do.
		return nil, nil
	}
	return slices.Concat(decl, dels, adds, post), nil
}

// hpCheck compares family fam of p with the listings of CNI-HOSTPORT-DNAT and the
// per-container chain: every rule p wants must be there, and nothing else of p.Owner.
func hpCheck(fam Family, p HostPortPlan, top, dn chainListing) error {
	rend, err := renderHostPortIPTables(fam, p)
	if err != nil {
		return err
	}
	id := IDOf(p.Owner)
	for _, c := range []struct {
		what string
		l    chainListing
		want []string
	}{{"jump in " + HostPortDNATChain, top, rend.jumpFP}, {"rule in " + rend.chain, dn, rend.ruleFP}} {
		if len(c.want) > 0 && !c.l.exists {
			return notFound("%s: chain missing for %s (%s)", c.what, p.Owner, fam)
		}
		have := map[string]int{}
		n := 0
		for _, r := range c.l.rules {
			if r.ours && r.tag.ID == id {
				have[r.tag.Fingerprint]++
				n++
			}
		}
		for _, fp := range c.want {
			if have[fp] == 0 {
				return notFound("host port %s of %s is missing (%s, fingerprint %s); run DEL and ADD again", c.what, p.Owner, fam, fp)
			}
		}
		if n != len(c.want) {
			return fmt.Errorf("%s has %d %ss for %s, want %d; run DEL and ADD again", fam, n, c.what, p.Owner, len(c.want))
		}
	}
	return nil
}
