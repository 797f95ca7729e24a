// SPDX-License-Identifier: Apache-2.0

package ipam

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strings"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/podwire/podwire/pkg/cniplumb"
)

// Allocation is the address an ADD got from one range set.
type Allocation struct {
	Set     int       // index into Conf.RangeSets
	Address net.IPNet // the address with its subnet's mask
	Gateway net.IP
}

func allocation(set int, s RangeSet, ip net.IP) Allocation {
	r := s.RangeFor(ip)
	return Allocation{Set: set, Address: net.IPNet{IP: ip, Mask: r.Subnet.Mask}, Gateway: r.Gateway}
}

// Allocate gives o one address from each range set of c, in one transaction.
//
//   - When o already holds a lease in a range set (a runtime retrying ADD after a
//     restart), that lease is returned instead of a second one (see held).
//   - A requested address (c.Requested) is taken if free, or if its lease is from a
//     previous boot; otherwise the call fails naming the holder.
//   - Otherwise the set is walked round-robin from its last reserved address. When
//     every address is taken, leases from a previous boot in that set are reclaimed
//     and the walk is repeated once; if that finds nothing either, the error has
//     code 50.
//
// On any failure the leases this call created are released again, and only those:
// a lease o held before the call is never released by it.
func Allocate(ctx context.Context, st Store, c *Conf, o Owner) ([]Allocation, error) {
	var out []Allocation
	err := st.Do(ctx, func(tx Tx) (err error) {
		held, err := held(tx, c, o)
		if err != nil {
			return err
		}
		if len(held) > 0 {
			if err := tx.Renew(o); err != nil {
				return err
			}
		}
		var created []net.IP
		defer func() {
			if err == nil {
				return
			}
			for _, ip := range created {
				if uerr := tx.ReleaseIP(ip, o); uerr != nil {
					err = fmt.Errorf("%w (and releasing %s again failed: %v; run GC or DEL for %s)", err, ip, uerr, o)
				}
			}
		}()
		for i, set := range c.RangeSets {
			req, hasReq := c.Requested[i]
			if l := leaseIn(held, set); l != nil {
				if hasReq && !req.IP.Equal(l.IP) {
					return requestError(req, "attachment %s already holds %s in range set %d (%s), not the requested %s; DEL the attachment before asking for another address",
						o, l.IP, i, set.String(), req.IP)
				}
				out = append(out, allocation(i, set, l.IP))
				continue
			}
			var ip net.IP
			if hasReq {
				ip, err = reserveRequested(tx, o, i, req)
			} else {
				ip, err = reserveNext(tx, o, i, set)
			}
			if err != nil {
				return err
			}
			created = append(created, ip)
			out = append(out, allocation(i, set, ip))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// held returns the leases o holds. In a range set where o holds none, a legacy lease
// of its container (one a reference host-local before v0.8 wrote with the container
// ID only) counts as o's, as in the reference's lookup; it is adopted (rewritten in
// o's name, the address never free in between), so that a repeated ADD finds it
// together with the leases this ADD adds, DEL releases them all, and no other
// interface of the container is given the same address.
func held(tx Tx, c *Conf, o Owner) ([]Lease, error) {
	own, err := tx.Leases(o)
	if err != nil {
		return nil, err
	}
	var legacy []Lease
	switch {
	case len(own) > 0 && own[0].Owner != o:
		own, legacy = nil, own // o holds none; these are its container's legacy leases
	case o.IfName != "":
		for _, set := range c.RangeSets {
			if leaseIn(own, set) == nil {
				if legacy, err = tx.Leases(Owner{ContainerID: o.ContainerID}); err != nil {
					return nil, err
				}
				break
			}
		}
	}
	for _, set := range c.RangeSets {
		l := leaseIn(legacy, set)
		if l == nil || leaseIn(own, set) != nil {
			continue
		}
		if err := tx.Adopt(l.IP, l.Owner, o); err != nil {
			return nil, fmt.Errorf("taking over %s's legacy lease on %s: %w", o.ContainerID, l.IP, err)
		}
		adopted := *l
		adopted.Owner = o
		own = append(own, adopted)
	}
	return own, nil
}

// leaseIn returns the lease of ls inside set, or nil.
func leaseIn(ls []Lease, set RangeSet) *Lease {
	for i := range ls {
		if set.Contains(ls[i].IP) {
			return &ls[i]
		}
	}
	return nil
}

func requestError(req Request, format string, a ...any) error {
	if req.Source == "CNI_ARGS IP" {
		return cniplumb.EnvError("CNI_ARGS", "IP="+format, a...)
	}
	return cniplumb.ConfigError(req.Source, format, a...)
}

func reserveRequested(tx Tx, o Owner, set int, req Request) (net.IP, error) {
	for attempt := 0; attempt < 2; attempt++ {
		ok, err := tx.Reserve(o, req.IP, set)
		if err != nil {
			return nil, err
		}
		if ok {
			return req.IP, nil
		}
		h, found, err := tx.Holder(req.IP)
		if err != nil {
			return nil, err
		}
		if found && h.Unreadable {
			return nil, requestError(req, "%s is blocked: its lease file was replaced by something that is not a lease file (a symlink?), which podwire does not follow; remove it from the lease directory, or request another address", req.IP)
		}
		if !found || !h.PrevBoot {
			holder := "another attachment"
			if found {
				holder = h.Owner.String()
			}
			return nil, requestError(req, "%s is already leased to %s; release it (DEL that container) or request another address", req.IP, holder)
		}
		// The holder's namespace died with the previous boot: take the address over.
		if err := tx.ReleaseIP(req.IP, h.Owner); err != nil {
			return nil, err
		}
	}
	return nil, requestError(req, "%s could not be reserved", req.IP)
}

func reserveNext(tx Tx, o Owner, i int, set RangeSet) (net.IP, error) {
	for pass := 0; pass < 2; pass++ {
		last, err := tx.LastReserved(i)
		if err != nil {
			return nil, err
		}
		it := NewIter(set, last)
		for ip, _ := it.Next(); ip != nil; ip, _ = it.Next() {
			ok, err := tx.Reserve(o, ip, i)
			if err != nil {
				return nil, err
			}
			if ok {
				return ip, nil
			}
		}
		if pass == 0 {
			n, err := reclaimPrevBoot(tx, set)
			if err != nil {
				return nil, err
			}
			if n == 0 {
				break
			}
		}
	}
	return nil, cniplumb.NotAvailable("no free address in range set %d (%s): all %s usable addresses are leased and none is from a previous boot; release leases (DEL, or GC with the valid attachments) or widen the range",
		i, set.String(), set.Usable().String())
}

// reclaimPrevBoot releases every lease in set that dates from a previous boot, and
// every broken (empty, stale) lease file, and returns how many it released.
func reclaimPrevBoot(tx Tx, set RangeSet) (int, error) {
	all, err := tx.All()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, l := range all {
		if (!l.PrevBoot && !l.Broken) || !set.Contains(l.IP) {
			continue
		}
		if err := tx.ReleaseIP(l.IP, l.Owner); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// Release removes every lease of o (its legacy leases when it has none). An
// attachment without leases is success: DEL may repeat.
func Release(ctx context.Context, st Store, o Owner) error {
	return st.Do(ctx, func(tx Tx) error { return tx.Release(o) })
}

// Check verifies that o holds a lease in every range set of c and, when prev is not
// nil (the prevResult's addresses), that prev lists exactly o's addresses within the
// configured ranges. A missing lease is code 3 (unknown container).
func Check(ctx context.Context, st Store, c *Conf, o Owner, prev []net.IP) error {
	return st.Do(ctx, func(tx Tx) error {
		held, err := tx.Leases(o)
		if err != nil {
			return err
		}
		if len(held) == 0 {
			return types.NewError(types.ErrUnknownContainer, "no lease",
				fmt.Sprintf("attachment %s holds no address in network %s; ADD it again", o, c.Network))
		}
		heldSet := map[string]bool{}
		for i, set := range c.RangeSets {
			found := false
			for _, l := range held {
				if set.Contains(l.IP) {
					found = true
					heldSet[l.IP.String()] = true
				}
			}
			if !found {
				return types.NewError(types.ErrUnknownContainer, "no lease",
					fmt.Sprintf("attachment %s holds no address in range set %d (%s) of network %s; ADD it again", o, i, set.String(), c.Network))
			}
		}
		if prev == nil {
			return nil
		}
		prevSet := map[string]bool{}
		for _, ip := range prev {
			ip = canonical(ip)
			for _, set := range c.RangeSets {
				if set.Contains(ip) {
					prevSet[ip.String()] = true
				}
			}
		}
		if d := setDiff(heldSet, prevSet); d != "" {
			return fmt.Errorf("the leases of %s in network %s do not match prevResult: %s", o, c.Network, d)
		}
		return nil
	})
}

func setDiff(held, prev map[string]bool) string {
	var parts []string
	for ip := range held {
		if !prev[ip] {
			parts = append(parts, "leased "+ip+" is missing from prevResult")
		}
	}
	for ip := range prev {
		if !held[ip] {
			parts = append(parts, "prevResult's "+ip+" is not leased to it")
		}
	}
	sort.Strings(parts)
	return strings.Join(parts, "; ")
}

// GC releases every lease PlanGC picks. It keeps going past errors and returns them
// all.
func GC(ctx context.Context, st Store, valid []Owner) error {
	return st.Do(ctx, func(tx Tx) error {
		stale, err := PlanGC(tx, valid)
		if err != nil {
			return err
		}
		var errs []error
		for _, l := range stale {
			if err := tx.ReleaseIP(l.IP, l.Owner); err != nil {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	})
}

// PlanGC returns the leases GC releases, reading tx only: every lease whose
// attachment is not in valid, and every broken lease file. A legacy lease (no
// interface name) is kept when any valid attachment has its container ID. An
// Unreadable lease (a symlink in place of the lease file) is released unless the
// store's records give it to a valid attachment. `podwire gc --dry-run` calls it in
// a transaction of its own, so what it lists is what GC removes.
func PlanGC(tx Tx, valid []Owner) ([]Lease, error) {
	keep := map[Owner]bool{}
	for _, o := range valid {
		keep[o] = true
		keep[Owner{ContainerID: o.ContainerID}] = true
	}
	all, err := tx.All()
	if err != nil {
		return nil, err
	}
	var stale []Lease
	var validIPs map[string]bool // of Unreadable leases; looked up when there are some
	for _, l := range all {
		if l.Unreadable {
			if validIPs == nil {
				if validIPs, err = unreadableOf(tx, valid); err != nil {
					return nil, err
				}
			}
			if validIPs[l.IP.String()] {
				continue
			}
		} else if !l.Broken && keep[l.Owner] {
			continue
		}
		stale = append(stale, l)
	}
	return stale, nil
}

// unreadableOf returns the addresses of the valid attachments' Unreadable leases.
func unreadableOf(tx Tx, valid []Owner) (map[string]bool, error) {
	out := map[string]bool{}
	for _, o := range valid {
		ls, err := tx.Leases(o)
		if err != nil {
			return nil, err
		}
		for _, l := range ls {
			if l.Unreadable {
				out[l.IP.String()] = true
			}
		}
	}
	return out, nil
}

// Status fails with code 50 when the store cannot take a new lease (not writable) or
// some range set has no free address and nothing reclaimable.
func Status(ctx context.Context, st Store, c *Conf) error {
	return st.Do(ctx, func(tx Tx) error {
		if err := tx.Writable(); err != nil {
			return cniplumb.NotAvailable("the lease store of network %s cannot be written: %v", c.Network, err)
		}
		for i, set := range c.RangeSets {
			last, err := tx.LastReserved(i)
			if err != nil {
				return cniplumb.NotAvailable("reading the lease store of network %s: %v", c.Network, err)
			}
			// Walk from the last reserved address, as ADD would: on a healthy network the
			// first candidate is free and this costs one lookup.
			free := false
			it := NewIter(set, last)
			for ip, _ := it.Next(); ip != nil && !free; ip, _ = it.Next() {
				l, found, err := tx.Holder(ip)
				if err != nil {
					return cniplumb.NotAvailable("reading the lease store of network %s: %v", c.Network, err)
				}
				free = !found || l.Broken || l.PrevBoot
			}
			if free {
				continue
			}
			return cniplumb.NotAvailable("range set %d (%s) of network %s is exhausted: all %s usable addresses are leased; release leases (DEL, or GC with the valid attachments) or widen the range",
				i, set.String(), c.Network, set.Usable().String())
		}
		return nil
	})
}
