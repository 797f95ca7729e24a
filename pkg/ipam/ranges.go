// SPDX-License-Identifier: Apache-2.0

package ipam

import (
	"bytes"
	"math/big"
	"net"
	"strings"
)

// Range is one contiguous block of allocatable addresses inside a subnet. After
// parsing, every field is set and canonical: 4-byte IPv4 or 16-byte IPv6, RangeStart <=
// RangeEnd, all of them inside Subnet. The Gateway is never handed out.
type Range struct {
	Subnet     net.IPNet
	RangeStart net.IP
	RangeEnd   net.IP
	Gateway    net.IP
}

// Contains reports whether ip lies between RangeStart and RangeEnd (inclusive) and has
// the range's address family.
func (r *Range) Contains(ip net.IP) bool {
	ip = canonical(ip)
	if ip == nil || len(ip) != len(r.RangeStart) {
		return false
	}
	return cmpIP(ip, r.RangeStart) >= 0 && cmpIP(ip, r.RangeEnd) <= 0
}

// overlaps reports whether two ranges share an address.
func (r *Range) overlaps(o *Range) bool {
	if len(r.RangeStart) != len(o.RangeStart) {
		return false
	}
	return cmpIP(r.RangeStart, o.RangeEnd) <= 0 && cmpIP(o.RangeStart, r.RangeEnd) <= 0
}

// usable counts the addresses the range can hand out: the span minus the gateway
// when the gateway lies inside it.
func (r *Range) usable() *big.Int {
	n := new(big.Int).Sub(new(big.Int).SetBytes(r.RangeEnd), new(big.Int).SetBytes(r.RangeStart))
	n.Add(n, big.NewInt(1))
	if r.Contains(r.Gateway) {
		n.Sub(n, big.NewInt(1))
	}
	return n
}

func (r *Range) String() string { return r.RangeStart.String() + "-" + r.RangeEnd.String() }

// RangeSet is a list of ranges of one address family; an ADD takes one address from
// each range set of the configuration.
type RangeSet []Range

// RangeFor returns the range containing ip, or nil.
func (s RangeSet) RangeFor(ip net.IP) *Range {
	for i := range s {
		if s[i].Contains(ip) {
			return &s[i]
		}
	}
	return nil
}

// Contains reports whether any range of the set contains ip.
func (s RangeSet) Contains(ip net.IP) bool { return s.RangeFor(ip) != nil }

// Usable is the number of addresses the set can hand out.
func (s RangeSet) Usable() *big.Int {
	n := new(big.Int)
	for i := range s {
		n.Add(n, s[i].usable())
	}
	return n
}

func (s RangeSet) String() string {
	parts := make([]string, len(s))
	for i := range s {
		parts[i] = s[i].String()
	}
	return strings.Join(parts, ",")
}

// Iter walks a range set round-robin, as the reference host-local does: it starts
// right after last (when last is inside the set) or at the first range's RangeStart,
// goes on range after range, wraps around, skips gateways and stops when it is back
// where it started. Each address is yielded at most once.
type Iter struct {
	set   RangeSet
	idx   int
	cur   net.IP
	start net.IP
	done  bool
}

// NewIter returns an iterator over s starting after last (which may be nil).
func NewIter(s RangeSet, last net.IP) *Iter {
	it := &Iter{set: s}
	if last = canonical(last); last != nil {
		for i := range s {
			if s[i].Contains(last) {
				it.idx, it.cur = i, last
				return it
			}
		}
	}
	return it
}

// Next returns the next candidate address with its range, or nil when every address
// has been tried.
func (it *Iter) Next() (net.IP, *Range) {
	for !it.done {
		r := &it.set[it.idx]
		switch {
		case it.cur == nil:
			it.cur = r.RangeStart
		case it.cur.Equal(r.RangeEnd):
			it.idx = (it.idx + 1) % len(it.set)
			r = &it.set[it.idx]
			it.cur = r.RangeStart
		default:
			it.cur = NextIP(it.cur)
		}
		if it.start == nil {
			it.start = it.cur
		} else if it.cur.Equal(it.start) {
			it.done = true
			return nil, nil
		}
		if !it.cur.Equal(r.Gateway) {
			return it.cur, r
		}
	}
	return nil, nil
}

// canonical returns ip as 4 bytes for IPv4 (including v4-mapped) and 16 for IPv6, or
// nil when it is neither.
func canonical(ip net.IP) net.IP {
	if v4 := ip.To4(); v4 != nil {
		return v4
	}
	if len(ip) == net.IPv6len {
		return ip
	}
	return nil
}

func cmpIP(a, b net.IP) int { return bytes.Compare(a, b) }

// NextIP returns ip+1 (wrapping to all-zeroes past the last address).
func NextIP(ip net.IP) net.IP {
	out := make(net.IP, len(ip))
	copy(out, ip)
	for i := len(out) - 1; i >= 0; i-- {
		out[i]++
		if out[i] != 0 {
			break
		}
	}
	return out
}

// lastIP is the last address of subnet, less the broadcast address for IPv4 (the
// reference's default RangeEnd).
func lastIP(subnet net.IPNet) net.IP {
	out := make(net.IP, len(subnet.IP))
	for i := range out {
		out[i] = subnet.IP[i] | ^subnet.Mask[i]
	}
	if len(out) == net.IPv4len {
		out[3]--
	}
	return out
}
