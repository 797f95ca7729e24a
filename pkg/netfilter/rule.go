// SPDX-License-Identifier: Apache-2.0

// Package netfilter is podwire's packet-filter layer, shared by bridge (ipMasq,
// macspoofchk) and portmap. An attachment's rules are plain data (a HostPortPlan, a
// MasqPlan, or a Plan of backend-neutral Rules) owned by one cniplumb.Owner; a layout
// renders them into one program's kernel objects and recognizes them again for CHECK,
// DEL and GC, whatever else the node holds:
//
//	portmap, iptables   the reference's CNI-HOSTPORT-DNAT/-MASQ and CNI-DN-<hash> (hostport_iptables.go)
//	portmap, nftables   podwire's table inet podwire_hostport (hostport_nft.go)
//	ipMasq, iptables    the reference's CNI-<hash> chain and POSTROUTING jumps (masq_iptables.go)
//	ipMasq, nftables    the reference's table inet cni_plugins_masquerade (masq_nft_layout.go)
//	macspoofchk         the reference's table bridge nat (macspoof.go)
//	podwire-agent       podwire's table inet podwire_agent (nft_tables.go)
//
// Layouts run on two seams, XTables (xtables.go) and NFTConn (nft_layout.go); package
// fake implements both in memory for unit tests.
package netfilter

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Family is the address family a rule applies to.
type Family uint8

const (
	AnyFamily Family = 0 // rules that match no address
	IPv4      Family = 4
	IPv6      Family = 6
)

func (f Family) String() string {
	switch f {
	case IPv4:
		return "ipv4"
	case IPv6:
		return "ipv6"
	}
	return "any"
}

// FamilyOf returns the family of a.
func FamilyOf(a netip.Addr) Family {
	if a.Unmap().Is4() {
		return IPv4
	}
	return IPv6
}

// Families is a set of address families, for operations that may skip one (ip6tables
// stays untouched when an attachment has no IPv6 address).
type Families uint8

const (
	V4  Families = 1 << iota
	V6  Families = 1 << iota
	All          = V4 | V6
)

var familyBits = map[Family]Families{IPv4: V4, IPv6: V6}

func (f Family) bit() Families { return familyBits[f] }

// Has reports whether f is in the set.
func (s Families) Has(f Family) bool { return s&f.bit() != 0 }

// list returns the families of the set, IPv4 first.
func (s Families) list() []Family {
	var out []Family
	for _, f := range []Family{IPv4, IPv6} {
		if s.Has(f) {
			out = append(out, f)
		}
	}
	return out
}

// Hook is a base chain a feature hangs its rules off: a netfilter hook, a chain type
// and a priority.
type Hook struct {
	Name     string // prerouting, input, forward, output, postrouting
	Type     string // nat or filter
	Priority int32  // nftables priority
}

var (
	NATPrerouting  = Hook{Name: "prerouting", Type: "nat", Priority: -100}
	NATOutput      = Hook{Name: "output", Type: "nat", Priority: -100}
	NATPostrouting = Hook{Name: "postrouting", Type: "nat", Priority: 100}
)

// Feature names a group of rules with its own nftables table, inet podwire_<Name>, so
// features never touch each other's rules.
type Feature struct {
	Name  string // a short lower-case word ("hostport", "agent")
	Hooks []Hook // the base chains the feature's rules go into
}

// Proto is a layer-4 protocol a rule can match.
type Proto string

const (
	TCP  Proto = "tcp"
	UDP  Proto = "udp"
	SCTP Proto = "sctp"
)

// Match is the conjunction of a rule's conditions; zero fields match anything. One
// field of each kind per rule keeps every rule expressible in iptables syntax.
type Match struct {
	Src, Dst       netip.Prefix // source / destination address in this prefix
	NotSrc, NotDst bool         // negate Src / Dst
	Proto          Proto
	DstPort        uint16 // needs Proto
	DstLocal       bool   // destination is an address of this host
	Mark           uint32 // all of these mark bits are set
	InIface        string // arriving on this interface
}

// ActionKind is what a rule does with a matching packet.
type ActionKind uint8

const (
	Return ActionKind = iota + 1
	Accept
	Drop
	Masquerade
	DNAT    // to Action.Addr and, when non-zero, Action.Port
	SetMark // OR Action.Mark into the packet mark
	// Jump continues in the existing iptables chain Action.Chain (kube-proxy's
	// KUBE-MARK-MASQ) and comes back; nftables cannot jump into an iptables chain.
	Jump
)

var actionNames = map[ActionKind]string{Return: "return", Accept: "accept", Drop: "drop",
	Masquerade: "masquerade", DNAT: "dnat", SetMark: "setmark", Jump: "jump"}

// Action is a rule's verdict or target.
type Action struct {
	Kind  ActionKind
	Addr  netip.Addr
	Port  uint16
	Mark  uint32
	Chain string // the target of a Jump
}

// dnatTo is a DNAT's target as both nft and iptables write it: address[:port].
func (a Action) dnatTo() string {
	if a.Port == 0 {
		return a.Addr.String()
	}
	return netip.AddrPortFrom(a.Addr, a.Port).String()
}

// Rule is one backend-neutral rule in a feature's base chain.
type Rule struct {
	Hook   Hook
	Family Family
	Match  Match
	Action Action
}

// String renders the rule in a stable nft-like text, used in dumps, golden tests and
// (hashed) as the rule's fingerprint in its tag.
func (r Rule) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s/%s %s", r.Hook.Type, r.Hook.Name, r.Family)
	m := r.Match
	not := func(n bool) string {
		if n {
			return "!="
		}
		return "=="
	}
	if m.InIface != "" {
		fmt.Fprintf(&b, " iif %s", m.InIface)
	}
	if m.Src.IsValid() {
		fmt.Fprintf(&b, " saddr %s %s", not(m.NotSrc), m.Src)
	}
	if m.Dst.IsValid() {
		fmt.Fprintf(&b, " daddr %s %s", not(m.NotDst), m.Dst)
	}
	if m.DstLocal {
		b.WriteString(" daddr type local")
	}
	if m.Proto != "" {
		fmt.Fprintf(&b, " %s", m.Proto)
	}
	if m.DstPort != 0 {
		fmt.Fprintf(&b, " dport %d", m.DstPort)
	}
	if m.Mark != 0 {
		fmt.Fprintf(&b, " mark & %#x == %#x", m.Mark, m.Mark)
	}
	a := r.Action
	b.WriteString(" " + actionNames[a.Kind])
	switch a.Kind {
	case DNAT:
		b.WriteString(" to " + a.dnatTo())
	case SetMark:
		fmt.Fprintf(&b, " %#x", a.Mark)
	case Jump:
		b.WriteString(" " + a.Chain)
	}
	return b.String()
}

// Validate reports a rule no backend could install, naming the problem.
func (r Rule) validate(f Feature) error {
	if !slices.Contains(f.Hooks, r.Hook) {
		return fmt.Errorf("rule %q: hook %s/%s is not one of feature %s's hooks", r, r.Hook.Type, r.Hook.Name, f.Name)
	}
	m := r.Match
	if (m.Src.IsValid() || m.Dst.IsValid() || m.DstLocal) && r.Family == AnyFamily {
		return fmt.Errorf("rule %q: an address match needs a family", r)
	}
	for _, p := range []netip.Prefix{m.Src, m.Dst} {
		if p.IsValid() && FamilyOf(p.Addr()) != r.Family {
			return fmt.Errorf("rule %q: address %s is not %s", r, p, r.Family)
		}
	}
	if m.DstPort != 0 && m.Proto == "" {
		return fmt.Errorf("rule %q: a port match needs a protocol", r)
	}
	if _, ok := protoNums[m.Proto]; m.Proto != "" && !ok {
		return fmt.Errorf("rule %q: unknown protocol %q", r, m.Proto)
	}
	if len(m.InIface) > 15 {
		return fmt.Errorf("rule %q: interface name longer than 15 bytes", r)
	}
	a := r.Action
	if _, ok := actionNames[a.Kind]; !ok {
		return fmt.Errorf("rule %q: no action", r)
	}
	if a.Kind == DNAT && (!a.Addr.IsValid() || FamilyOf(a.Addr) != r.Family) {
		return fmt.Errorf("rule %q: DNAT needs a %s address", r, r.Family)
	}
	if a.Kind == Jump && !validChainName(a.Chain) {
		return fmt.Errorf("rule %q: %q is not a usable iptables chain name (1-28 letters, digits, '_', '-' or '.', not starting with '-')", r, a.Chain)
	}
	if (a.Kind == Masquerade || a.Kind == DNAT) && r.Hook.Type != "nat" {
		return fmt.Errorf("rule %q: NAT actions belong in a nat hook", r)
	}
	return nil
}

// Plan is every rule one owner has in one feature. It is data: it can be diffed, logged
// and golden-tested, and a Backend's Apply is the only code that installs it.
type Plan struct {
	Feature Feature
	Owner   Owner
	Rules   []Rule // in install order
}

// Validate checks every rule; Apply calls it before touching the kernel.
func (p Plan) Validate() error {
	if p.Feature.Name == "" {
		return fmt.Errorf("plan for %s has no feature", p.Owner)
	}
	for _, h := range p.Feature.Hooks {
		if _, ok := nftHooks[h.Name]; !ok {
			return fmt.Errorf("unknown netfilter hook %q", h.Name)
		}
	}
	for _, r := range p.Rules {
		if err := r.validate(p.Feature); err != nil {
			return err
		}
	}
	return nil
}

// String renders the plan one rule per line.
func (p Plan) String() string {
	var b strings.Builder
	for _, r := range p.Rules {
		b.WriteString(r.String())
		b.WriteByte('\n')
	}
	return b.String()
}
