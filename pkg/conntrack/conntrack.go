// SPDX-License-Identifier: Apache-2.0

// Package conntrack removes connection-tracking entries through netlink (no exec of the
// conntrack tool). portmap uses it so that UDP flows which conntrack pinned to an old
// destination do not keep black-holing traffic after a host port is mapped or
// unmapped.
package conntrack

import (
	"fmt"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// DeleteUDPDstPorts deletes the UDP entries of one address family (IPv6 when ipv6)
// whose original destination port is one of ports, in the caller's network namespace,
// with one dump of the conntrack table. It returns how many it deleted. No ports is a
// no-op without any netlink request.
func DeleteUDPDstPorts(ipv6 bool, ports []uint16) (uint, error) {
	if len(ports) == 0 {
		return 0, nil
	}
	fam := netlink.InetFamily(unix.AF_INET)
	if ipv6 {
		fam = unix.AF_INET6
	}
	var filters []netlink.CustomConntrackFilter
	for _, p := range ports {
		f := &netlink.ConntrackFilter{}
		if err := f.AddProtocol(unix.IPPROTO_UDP); err != nil {
			return 0, err
		}
		if err := f.AddPort(netlink.ConntrackOrigDstPort, p); err != nil {
			return 0, err
		}
		filters = append(filters, f)
	}
	n, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, fam, filters...)
	if err != nil {
		return n, fmt.Errorf("deleting UDP conntrack entries to ports %v: %w", ports, err)
	}
	return n, nil
}
