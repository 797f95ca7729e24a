// SPDX-License-Identifier: Apache-2.0

// Package routes keeps the host-gw routes to other nodes' pod CIDRs: for every other
// Node whose InternalIP is on a subnet this host is directly connected to, one route per
// pod CIDR via that InternalIP. Every route carries Protocol, podwire's route protocol
// number, so the agent only ever lists, changes and deletes its own routes.
//
// Planning is pure (Plan); a Backend applies the difference (Sync).
package routes

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
)

// Protocol is the rtm_protocol of the agent's routes ("ip route show proto 165"): the
// marker the kernel keeps with each route, by which the agent finds its own and only its
// own (a route of another protocol, such as an operator's static or boot route, is
// never listed, so never changed or deleted). Linux reserves 0-4 for itself
// (RTPROT_UNSPEC, REDIRECT, KERNEL, BOOT, STATIC); include/uapi/linux/rtnetlink.h and
// iproute2's rt_protos assign 8-19, 42, 99 and 186-192 to routing daemons (gated, ra,
// mrt, zebra, bird, dnrouted, xorp, ntk, dhcp, mrouted, keepalived, babel, openr, bgp,
// isis, ospf, rip, eigrp); 165 is none of them.
//
// Upgrades: every podwire-agent has made its routes with this protocol since its route
// code was written, so there are no agent routes without it to migrate. (The 0.1.0
// VERSION commit predates the agent, which no release has shipped yet; a future change
// of the number must list the old one too.)
const Protocol = 165

// Node is what routing needs of a Kubernetes Node.
type Node struct {
	Name        string
	InternalIPs []netip.Addr
	PodCIDRs    []netip.Prefix
}

// Connected is a subnet the host has an address on, and that address's interface.
type Connected struct {
	Prefix    netip.Prefix // masked
	LinkIndex int
}

// Route is one host-gw route.
type Route struct {
	Dst       netip.Prefix
	Gw        netip.Addr
	LinkIndex int
	Node      string // for logs; not a kernel attribute
}

func (r Route) String() string {
	return fmt.Sprintf("%s via %s dev #%d (%s)", r.Dst, r.Gw, r.LinkIndex, r.Node)
}

// same reports whether two routes are the same kernel route.
func (r Route) same(o Route) bool {
	return r.Dst == o.Dst && r.Gw == o.Gw && r.LinkIndex == o.LinkIndex
}

// Plan returns the routes this node (self) needs, sorted by destination. A node whose
// InternalIP of a family is on no connected subnet gets no route for that family (it is
// not on this L2 segment: host-gw cannot reach it); own pod CIDRs never get a route.
// When two nodes claim one CIDR, the first by name wins (the other is reported in skipped).
func Plan(self string, conn []Connected, nodes []Node) (routes []Route, skipped []string) {
	var own []netip.Prefix
	for _, n := range nodes {
		if n.Name == self {
			own = append(own, n.PodCIDRs...)
		}
	}
	nodes = slices.Clone(nodes)
	slices.SortFunc(nodes, func(a, b Node) int { return cmp.Compare(a.Name, b.Name) })
	taken := map[netip.Prefix]string{}
	for _, n := range nodes {
		if n.Name == self {
			continue
		}
		for _, cidr := range n.PodCIDRs {
			cidr = cidr.Masked()
			if slices.ContainsFunc(own, func(p netip.Prefix) bool { return p.Overlaps(cidr) }) {
				skipped = append(skipped, fmt.Sprintf("node %s: pod CIDR %s overlaps this node's own", n.Name, cidr))
				continue
			}
			if other, ok := taken[cidr]; ok {
				skipped = append(skipped, fmt.Sprintf("node %s: pod CIDR %s is also node %s's", n.Name, cidr, other))
				continue
			}
			gw, link, ok := nextHop(conn, n.InternalIPs, cidr.Addr().Is4())
			if !ok {
				skipped = append(skipped, fmt.Sprintf("node %s: no InternalIP of %s's family on a subnet this node is connected to", n.Name, cidr))
				continue
			}
			taken[cidr] = n.Name
			routes = append(routes, Route{Dst: cidr, Gw: gw, LinkIndex: link, Node: n.Name})
		}
	}
	slices.SortFunc(routes, func(a, b Route) int { return a.Dst.Addr().Compare(b.Dst.Addr()) })
	return routes, skipped
}

// nextHop finds the first InternalIP of the family on a connected subnet.
func nextHop(conn []Connected, ips []netip.Addr, v4 bool) (netip.Addr, int, bool) {
	for _, ip := range ips {
		ip = ip.Unmap()
		if ip.Is4() != v4 {
			continue
		}
		for _, c := range conn {
			if c.Prefix.Contains(ip) && c.Prefix.Bits() < ip.BitLen() {
				return ip, c.LinkIndex, true
			}
		}
	}
	return netip.Addr{}, 0, false
}

// Backend is the host's routing table as the agent sees it.
type Backend interface {
	// Connected lists the host's connected subnets (its addresses' prefixes).
	Connected() ([]Connected, error)
	// List returns the routes with Protocol, and only those.
	List() ([]Route, error)
	// Replace adds r or replaces the route to r.Dst, with Protocol.
	Replace(r Route) error
	// Delete removes r; absent is success.
	Delete(r Route) error
}

// Changes is what a Sync did.
type Changes struct {
	Added, Removed []Route
}

// Sync makes the host's agent routes exactly want: it replaces what is missing or
// different and deletes the rest. It keeps going after a failure and returns them all.
func Sync(b Backend, want []Route) (Changes, error) {
	have, err := b.List()
	if err != nil {
		return Changes{}, fmt.Errorf("listing podwire's routes (proto %d): %w", Protocol, err)
	}
	var ch Changes
	var errs []error
	for _, r := range want {
		if slices.ContainsFunc(have, r.same) {
			continue
		}
		if err := b.Replace(r); err != nil {
			errs = append(errs, fmt.Errorf("adding route %s: %w", r, err))
			continue
		}
		ch.Added = append(ch.Added, r)
	}
	for _, r := range have {
		if slices.ContainsFunc(want, func(w Route) bool { return w.Dst == r.Dst }) {
			// Replaced above (or already right); a replaced route is not a second route.
			continue
		}
		if err := b.Delete(r); err != nil {
			errs = append(errs, fmt.Errorf("removing stale route %s: %w", r, err))
			continue
		}
		ch.Removed = append(ch.Removed, r)
	}
	return ch, errors.Join(errs...)
}

// RemoveAll deletes every agent route (uninstall).
func RemoveAll(b Backend) (Changes, error) { return Sync(b, nil) }
