// SPDX-License-Identifier: Apache-2.0

// Package usage counts, per pod CIDR range, the addresses host-local has leased and the
// ones it can still hand out, so an exhausted node is visible (a Node annotation and
// metrics; the scheduler cannot see it otherwise: containernetworking/plugins#338).
package usage

import (
	"encoding/json"
	"net/netip"
)

// Range is one range's count.
type Range struct {
	Range string
	Used  int64
	Free  int64
}

// capacity is how many addresses host-local hands out in p when the range has no
// rangeStart/rangeEnd: every address but the network address, the gateway (the first
// address, which the bridge takes with isGateway) and, for IPv4, the broadcast address.
// Ranges with more than 2^62 addresses count as 2^62.
func capacity(p netip.Prefix) int64 {
	host := p.Addr().BitLen() - p.Bits()
	if host >= 62 {
		return 1 << 62
	}
	n := int64(1) << host
	reserved := int64(2) // network, gateway
	if p.Addr().Is4() {
		reserved++ // broadcast
	}
	if n <= reserved {
		return 0
	}
	return n - reserved
}

// Count returns each range's usage given the leased addresses.
func Count(ranges []netip.Prefix, leases map[string]bool) []Range {
	var out []Range
	for _, p := range ranges {
		p = p.Masked()
		var used int64
		for l := range leases {
			if a, err := netip.ParseAddr(l); err == nil && p.Contains(a) {
				used++
			}
		}
		free := capacity(p) - used
		if free < 0 {
			free = 0
		}
		out = append(out, Range{Range: p.String(), Used: used, Free: free})
	}
	return out
}

// Annotation renders the podwire.io/free-addresses value: {"<range>": free, ...}.
func Annotation(rs []Range) string {
	m := map[string]int64{}
	for _, r := range rs {
		m[r.Range] = r.Free
	}
	b, _ := json.Marshal(m)
	return string(b)
}
