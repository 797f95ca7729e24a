// SPDX-License-Identifier: Apache-2.0

package netfilter

import (
	"fmt"
	"net/netip"
	"strings"
)

// portmap's model, pure: HostPortPlan, the neutral Rules it becomes, HostPortBackend.
// The backends are in hostport_xt.go and hostport_nft.go.

// HostPortFeature is portmap's nftables table, inet podwire_hostport: prerouting and
// output take the DNAT decision, postrouting masquerades hairpin and localhost
// connections. The iptables backend keeps the reference portmap's layout instead, so
// either binary can remove the other's rules (hostport_iptables.go).
var HostPortFeature = Feature{Name: "hostport", Hooks: []Hook{NATPrerouting, NATOutput, NATPostrouting}}

// HostPort is one forwarded port to one pod address.
type HostPort struct {
	Proto    Proto
	HostPort uint16
	// HostIP restricts the forward to connections to this host address; the zero
	// value (or an unspecified address) means every local address.
	HostIP netip.Addr
	// Pod is the pod's address with its subnet's prefix length: the address is the
	// DNAT target, the subnet is where hairpin connections come from.
	Pod           netip.Prefix
	ContainerPort uint16
}

// Family is the address family of the pod address the port forwards to.
func (m HostPort) Family() Family { return FamilyOf(m.Pod.Addr()) }

func (m HostPort) hostDst() netip.Prefix {
	if !m.HostIP.IsValid() || m.HostIP.IsUnspecified() {
		return netip.Prefix{}
	}
	return hostPrefix(m.HostIP.Unmap())
}

// HostPortPlan is every hostPort rule one attachment owns, as data that each backend
// renders its own way.
type HostPortPlan struct {
	Owner Owner
	// Ports in configuration order; each forwards to an address of its family.
	Ports []HostPort
	// SNAT marks hairpin connections (from the pod's subnet) and, for IPv4, connections
	// from 127.0.0.1 to a host port, so they leave masqueraded and the replies come back
	// through the node (portmap's "snat", default true).
	SNAT bool
	// MasqAll marks connections from every source, not only hairpin and localhost.
	MasqAll bool
	// Mark is the one mark bit (1 << markMasqBit) marking sets and masquerade matches.
	Mark uint32
	// SetMarkChain, when set, is an existing iptables chain (kube-proxy's
	// KUBE-MARK-MASQ) that marks for masquerade instead of Mark; whoever owns it also
	// masquerades, so the plan then has no masquerade rule of its own. iptables only.
	SetMarkChain string
	// Conditions are extra matches on the DNAT decision per family (portmap's
	// conditionsV4/conditionsV6): only Src, NotSrc, Dst, NotDst and InIface may be set.
	Conditions map[Family]Match
}

// Families returns the families the plan forwards.
func (p HostPortPlan) Families() Families {
	var s Families
	for _, m := range p.Ports {
		s |= m.Family().bit()
	}
	return s
}

// Empty reports whether the plan forwards nothing.
func (p HostPortPlan) Empty() bool { return len(p.Ports) == 0 }

// masquerades reports whether the plan needs a masquerade rule of its own.
func (p HostPortPlan) masquerades() bool { return p.SNAT && p.SetMarkChain == "" }

// Validate reports a plan no backend could install. Backends call it before touching
// the kernel; the plugin calls it while parsing, so configuration errors come first.
func (p HostPortPlan) Validate() error {
	for _, m := range p.Ports {
		if m.HostPort == 0 || m.ContainerPort == 0 {
			return fmt.Errorf("host port %d -> container port %d: ports must be 1-65535", m.HostPort, m.ContainerPort)
		}
		if _, ok := protoNums[m.Proto]; !ok {
			return fmt.Errorf("host port %d: unknown protocol %q", m.HostPort, m.Proto)
		}
		if !m.Pod.IsValid() {
			return fmt.Errorf("host port %d: no pod address", m.HostPort)
		}
		if d := m.hostDst(); d.IsValid() && FamilyOf(d.Addr()) != m.Family() {
			return fmt.Errorf("host port %d: host address %s is not of the pod address %s's family", m.HostPort, m.HostIP, m.Pod.Addr())
		}
		if _, err := p.dnatMatch(m, false); err != nil {
			return err
		}
	}
	if p.SNAT && p.SetMarkChain == "" && (p.Mark == 0 || p.Mark&(p.Mark-1) != 0) {
		return fmt.Errorf("mark %#x is not a single bit", p.Mark)
	}
	if p.SetMarkChain != "" && !validChainName(p.SetMarkChain) {
		return fmt.Errorf("%q is not a usable iptables chain name", p.SetMarkChain)
	}
	for fam, c := range p.Conditions {
		if c.Proto != "" || c.DstPort != 0 || c.DstLocal || c.Mark != 0 {
			return fmt.Errorf("%s conditions may only match source, destination and input interface", fam)
		}
		for _, pf := range []netip.Prefix{c.Src, c.Dst} {
			if pf.IsValid() && FamilyOf(pf.Addr()) != fam {
				return fmt.Errorf("%s conditions: %s is not an %s prefix", fam, pf, fam)
			}
		}
	}
	return nil
}

// dnatMatch is the DNAT decision's match for m: host port and address plus the
// family's conditions; local adds "destination is local" (nftables: iptables checks it
// on the way into CNI-HOSTPORT-DNAT). A destination condition leaves hostIP alone, or,
// when it excludes hostIP, is an error: the mapping could never match.
func (p HostPortPlan) dnatMatch(m HostPort, local bool) (Match, error) {
	mt := Match{Dst: m.hostDst(), DstLocal: local, Proto: m.Proto, DstPort: m.HostPort}
	c, ok := p.Conditions[m.Family()]
	if !ok {
		return mt, nil
	}
	mt.Src, mt.NotSrc, mt.InIface = c.Src, c.NotSrc, c.InIface
	if c.Dst.IsValid() {
		if !mt.Dst.IsValid() {
			mt.Dst, mt.NotDst = c.Dst, c.NotDst
		} else if c.Dst.Contains(mt.Dst.Addr()) == c.NotDst {
			return Match{}, fmt.Errorf("host port %d: hostIP %s is excluded by the %s destination condition %s%s; the mapping could never match", m.HostPort, m.HostIP, m.Family(), map[bool]string{true: "!= "}[c.NotDst], c.Dst)
		}
	}
	return mt, nil
}

var localhost4 = netip.MustParsePrefix("127.0.0.1/32")

func (p HostPortPlan) markAction() Action {
	if p.SetMarkChain != "" {
		return Action{Kind: Jump, Chain: p.SetMarkChain}
	}
	return Action{Kind: SetMark, Mark: p.Mark}
}

// portRules returns, for one hook, each mapping of family fam as: the hairpin mark,
// the localhost mark (IPv4, when withLocalhost and not MasqAll), then the DNAT. The marks
// carry no conditions: a mark only matters to the masquerade of connections that the
// DNAT (which does carry them) sent to the pod.
func (p HostPortPlan) portRules(fam Family, h Hook, local, withLocalhost, withConds bool) ([]Rule, error) {
	var out []Rule
	for _, m := range p.Ports {
		if m.Family() != fam {
			continue
		}
		base := Match{Dst: m.hostDst(), DstLocal: local, Proto: m.Proto, DstPort: m.HostPort}
		if p.SNAT {
			hp := base
			if !p.MasqAll {
				hp.Src = m.Pod.Masked()
			}
			out = append(out, Rule{Hook: h, Family: fam, Match: hp, Action: p.markAction()})
			if fam == IPv4 && withLocalhost && !p.MasqAll {
				lo := base
				lo.Src = localhost4
				out = append(out, Rule{Hook: h, Family: fam, Match: lo, Action: p.markAction()})
			}
		}
		dm := base
		if withConds {
			var err error
			if dm, err = p.dnatMatch(m, local); err != nil {
				return nil, err
			}
		}
		out = append(out, Rule{Hook: h, Family: fam, Match: dm,
			Action: Action{Kind: DNAT, Addr: m.Pod.Addr(), Port: m.ContainerPort}})
	}
	return out, nil
}

// podAddrs returns the distinct pod addresses of family fam, in order.
func (p HostPortPlan) podAddrs(fam Family) []netip.Addr {
	var out []netip.Addr
	seen := map[netip.Addr]bool{}
	for _, m := range p.Ports {
		if a := m.Pod.Addr(); m.Family() == fam && !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	return out
}

// Rules renders the plan as neutral rules in HostPortFeature, for the nftables
// backend. Per family: prerouting holds the hairpin marks and DNATs, output the same
// plus the localhost marks, postrouting one masquerade per pod address for
// connections to it that carry the mark.
func (p HostPortPlan) Rules() (Plan, error) {
	out := Plan{Feature: HostPortFeature, Owner: p.Owner}
	if err := p.Validate(); err != nil {
		return out, err
	}
	if p.SetMarkChain != "" {
		return out, fmt.Errorf("externalSetMarkChain %s is an iptables chain; nftables cannot use it (use the iptables backend)", p.SetMarkChain)
	}
	for _, fam := range []Family{IPv4, IPv6} {
		for _, h := range []Hook{NATPrerouting, NATOutput} {
			rs, err := p.portRules(fam, h, true, h == NATOutput, true)
			if err != nil {
				return out, err
			}
			out.Rules = append(out.Rules, rs...)
		}
		if p.masquerades() {
			for _, a := range p.podAddrs(fam) {
				out.Rules = append(out.Rules, Rule{Hook: NATPostrouting, Family: fam,
					Match:  Match{Dst: hostPrefix(a), Mark: p.Mark},
					Action: Action{Kind: Masquerade}})
			}
		}
	}
	return out, nil
}

// String renders the settings and a line per port, for logs and golden tests.
func (p HostPortPlan) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "owner %s snat=%v masqAll=%v", p.Owner, p.SNAT, p.MasqAll)
	if p.SetMarkChain != "" {
		fmt.Fprintf(&b, " setMarkChain=%s", p.SetMarkChain)
	} else {
		fmt.Fprintf(&b, " mark=%#x", p.Mark)
	}
	b.WriteByte('\n')
	for _, m := range p.Ports {
		host := "*"
		if d := m.hostDst(); d.IsValid() {
			host = d.Addr().String()
		}
		fmt.Fprintf(&b, "%s %s:%d -> %s:%d (%s)\n", m.Proto, host, m.HostPort, m.Pod.Addr(), m.ContainerPort, m.Pod.Masked())
	}
	return b.String()
}

// HostPortBackend installs and removes attachments' hostPort rules; removal knows the
// families used. Remove also deletes what the reference portmap created for the same
// network and container, so nodes can switch binaries under live pods.
type HostPortBackend = Backend[HostPortPlan, Families]

// NewHostPortsOn returns the host-port backend of kind k on the given seams (a fake
// kernel in tests), without podwire's lock files.
func NewHostPortsOn(k Kind, xt XTables, nc NFTConn) HostPortBackend {
	if k == KindNFTables {
		return &HostPortNFTables{nft: NewNFTablesOn(nc)}
	}
	return &HostPortIPTables{xtLayout{xt, func() (func(), error) { return noLock("") }}}
}
