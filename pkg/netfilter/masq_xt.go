// SPDX-License-Identifier: Apache-2.0

package netfilter

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	"github.com/podwire/podwire/pkg/cniplumb"
)

// MasqIPTables is the iptables MasqBackend: the reference's per-container chain and
// POSTROUTING jumps (masquerade.go). Per family it touches it lists at most the
// container's chain and POSTROUTING (never a whole table) and runs one
// `iptables-restore --noflush`.
type MasqIPTables struct{ xtLayout }

var _ MasqBackend = (*MasqIPTables)(nil)

// Apply implements MasqBackend. A new container costs one listing (of its chain, which
// is absent) and one restore per family.
func (b *MasqIPTables) Apply(ctx context.Context, p MasqPlan) error {
	if err := p.Validate(); err != nil {
		return err
	}
	chain := MasqChain(p.Owner)
	return b.forFamilies(p.Families(), false, func(fam Family) error {
		own, post, err := b.listOwner(ctx, fam, chain)
		if err != nil {
			return err
		}
		return wrapf(b.restore(ctx, fam, planMasqXTAdd(p, fam, own, post)), "installing %s masquerade chain %s", fam, chain)
	})
}

// listOwner lists an attachment's chain in one family and, only when the chain exists,
// POSTROUTING: only an existing chain can have jumps already (a repeated ADD, or
// another interface of the same container in this network).
func (b *MasqIPTables) listOwner(ctx context.Context, fam Family, chain string) (own chainListing, post []xtRule, err error) {
	if own, err = b.list(ctx, fam, chain); err != nil || !own.exists {
		return own, nil, err
	}
	l, err := b.list(ctx, fam, masqPostrouting)
	return own, l.rules, err
}

// Check implements MasqBackend: an absent chain is IsNotFound; a missing rule is an
// error naming what ADD would write.
func (b *MasqIPTables) Check(ctx context.Context, p MasqPlan) error {
	chain := MasqChain(p.Owner)
	for _, fam := range p.Families().list() {
		own, post, err := b.listOwner(ctx, fam, chain)
		switch missing := planMasqXTAdd(p, fam, own, post); {
		case err != nil:
			return err
		case !own.exists:
			return notFound("%s: chain %s does not exist", fam, chain)
		case len(missing) > 0:
			return fmt.Errorf("%s: masquerade rule missing (ADD would write %q); run DEL and ADD again", fam, missing[0])
		}
	}
	return nil
}

// Remove implements MasqBackend: per family (those of addrs, or both, when installed)
// one listing of POSTROUTING, one of the chain only when no jump leads to it, and one
// restore when something is there.
func (b *MasqIPTables) Remove(ctx context.Context, o Owner, addrs []netip.Prefix) error {
	return b.forFamilies(removalFamilies(addrs), true, func(fam Family) error { return b.removeFamily(ctx, fam, o, addrs) })
}

// removeFamily runs Remove for one family; the caller holds the lock.
func (b *MasqIPTables) removeFamily(ctx context.Context, fam Family, o Owner, addrs []netip.Prefix) error {
	var famAddrs []netip.Prefix
	if len(addrs) > 0 {
		// Known addresses, none of this family: nothing of the pod's is here.
		if famAddrs = addrsOf(fam, addrs); len(famAddrs) == 0 {
			return nil
		}
	}
	chain := MasqChain(o)
	post, err := b.list(ctx, fam, masqPostrouting)
	if err != nil {
		return err
	}
	own := chainListing{exists: slices.ContainsFunc(post.rules, func(r xtRule) bool { return r.target == chain })}
	if !own.exists {
		// No jump into the chain; it may still exist (an interrupted teardown).
		if own, err = b.list(ctx, fam, chain); err != nil {
			return err
		}
	}
	return wrapf(b.restore(ctx, fam, planMasqXTDel(chain, famAddrs, post.rules, own.exists)), "removing %s masquerade chain %s of %s", fam, chain, o)
}

// GC implements MasqBackend: per installed family, one listing of POSTROUTING and one
// restore when something is stale. Chains no jump leads to are not found this way
// (they are inert and go with their attachment's DEL).
func (b *MasqIPTables) GC(ctx context.Context, network string, keep cniplumb.Owners) error {
	return b.forFamilies(All, true, func(fam Family) error {
		post, err := b.list(ctx, fam, masqPostrouting)
		if err != nil {
			return err
		}
		var lines, stale []string
		for _, o := range Stale(masqXTObjects(fam, post.rules), network, keep, nil) {
			lines = append(lines, planMasqXTDel(o.Key, nil, post.rules, true)...)
			stale = append(stale, o.Key)
		}
		return wrapf(b.restore(ctx, fam, lines), "removing stale %s masquerade chains of containers %v", fam, stale)
	})
}
