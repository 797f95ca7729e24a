// SPDX-License-Identifier: Apache-2.0

package routes

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Netlink is the kernel's main routing table through vishvananda/netlink (dumps through
// netlinksafe, which retries interrupted dumps).
type Netlink struct{}

var _ Backend = Netlink{}

func (Netlink) Connected() ([]Connected, error) {
	addrs, err := netlinksafe.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("listing host addresses: %w", err)
	}
	var out []Connected
	for _, a := range addrs {
		if a.IPNet == nil || a.Scope == unix.RT_SCOPE_HOST || a.IP.IsLinkLocalUnicast() {
			continue
		}
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ones, _ := a.Mask.Size()
		out = append(out, Connected{Prefix: netip.PrefixFrom(ip.Unmap(), ones).Masked(), LinkIndex: a.LinkIndex})
	}
	return out, nil
}

func (Netlink) List() ([]Route, error) {
	filter := &netlink.Route{Protocol: Protocol, Table: unix.RT_TABLE_MAIN}
	rs, err := netlinksafe.RouteListFiltered(netlink.FAMILY_ALL, filter, netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, err
	}
	var out []Route
	for _, r := range rs {
		if r.Dst == nil || r.Protocol != Protocol {
			continue
		}
		ip, _ := netip.AddrFromSlice(r.Dst.IP)
		ones, _ := r.Dst.Mask.Size()
		gw, _ := netip.AddrFromSlice(r.Gw)
		out = append(out, Route{Dst: netip.PrefixFrom(ip.Unmap(), ones), Gw: gw.Unmap(), LinkIndex: r.LinkIndex})
	}
	return out, nil
}

func toNetlink(r Route) *netlink.Route {
	return &netlink.Route{
		Dst:       &net.IPNet{IP: r.Dst.Addr().AsSlice(), Mask: net.CIDRMask(r.Dst.Bits(), r.Dst.Addr().BitLen())},
		Gw:        r.Gw.AsSlice(),
		LinkIndex: r.LinkIndex,
		Protocol:  Protocol,
		Table:     unix.RT_TABLE_MAIN,
		Scope:     netlink.SCOPE_UNIVERSE,
	}
}

func (Netlink) Replace(r Route) error { return netlink.RouteReplace(toNetlink(r)) }

func (Netlink) Delete(r Route) error {
	err := netlink.RouteDel(toNetlink(r))
	if errors.Is(err, unix.ESRCH) || errors.Is(err, unix.ENOENT) {
		return nil
	}
	return err
}
