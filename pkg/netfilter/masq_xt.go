package netfilter

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/podwire/podwire/pkg/cniplumb"
)

// MasqIPTables is the iptables MasqBackend: the reference's per-container chain and
// POSTROUTING jumps (see masquerade.go). Per family it touches it runs at most two
// `iptables -t nat -S` (the container's chain, and POSTROUTING, which holds one jump
// per masqueraded pod address; never a whole table) and one
// `iptables-restore --noflush`. ip6tables is not run for IPv4-only plans or removals.
type MasqIPTables struct {
	xt   XTables
	lock func() (func(), error)
}

var _ MasqBackend = (*MasqIPTables)(nil)

// list reads one nat chain of fam; exists is false when it is absent.
func (b *MasqIPTables) list(ctx context.Context, fam Family, chain string) (rules []xtRule, exists bool, err error) {
	return listXT(ctx, b.xt, fam, "nat", chain)
}

func (b *MasqIPTables) restore(ctx context.Context, fam Family, lines []string) error {
	if len(lines) == 0 {
		return nil
	}
	s := &restoreScript{table: "nat", lines: lines}
	return b.xt.Restore(ctx, fam, s.String())
}

// Apply implements MasqBackend. A new container costs one listing (of its chain, which
// is absent) and one restore per family.
func (b *MasqIPTables) Apply(ctx context.Context, p MasqPlan) error {
	if err := p.Validate(); err != nil {
		return err
	}
	unlock, err := b.lock()
	if err != nil {
		return err
	}
	defer unlock()
	chain := MasqChain(p.Owner)
	for _, fam := range []Family{IPv4, IPv6} {
		if !p.Families().Has(fam) {
			continue
		}
		rules, exists, post, err := b.listOwner(ctx, fam, chain)
		if err != nil {
			return err
		}
		if err := b.restore(ctx, fam, planMasqXTAdd(p, fam, rules, exists, post)); err != nil {
			return fmt.Errorf("installing %s masquerade chain %s: %w", fam, chain, err)
		}
	}
	return nil
}

// listOwner lists an attachment's chain in one family and, only when the chain exists,
// POSTROUTING: only an existing chain can have jumps already (a repeated ADD, or
// another interface of the same container in this network).
func (b *MasqIPTables) listOwner(ctx context.Context, fam Family, chain string) (rules []xtRule, exists bool, post []xtRule, err error) {
	if rules, exists, err = b.list(ctx, fam, chain); err != nil || !exists {
		return rules, exists, nil, err
	}
	post, _, err = b.list(ctx, fam, masqPostrouting)
	return rules, exists, post, err
}

// Check implements MasqBackend.
func (b *MasqIPTables) Check(ctx context.Context, p MasqPlan) error {
	chain := MasqChain(p.Owner)
	for _, fam := range []Family{IPv4, IPv6} {
		if !p.Families().Has(fam) {
			continue
		}
		rules, exists, post, err := b.listOwner(ctx, fam, chain)
		if err != nil {
			return err
		}
		if err := checkMasqXT(p, fam, rules, exists, post); err != nil {
			return err
		}
	}
	return nil
}

// Remove implements MasqBackend: for each family (those of addrs, or both), one
// listing of POSTROUTING, one of the chain only when no jump leads to it, and one
// restore when something is there. A family whose binary is not installed is skipped.
func (b *MasqIPTables) Remove(ctx context.Context, o Owner, addrs []netip.Prefix) error {
	fams := All
	if len(addrs) > 0 {
		fams = prefixFamilies(addrs)
	}
	return b.removeFamilies(ctx, o, addrs, fams)
}

func (b *MasqIPTables) removeFamilies(ctx context.Context, o Owner, addrs []netip.Prefix, fams Families) error {
	unlock, err := b.lock()
	if err != nil {
		return err
	}
	defer unlock()
	var errs []error
	for _, fam := range []Family{IPv4, IPv6} {
		if !fams.Has(fam) || !b.xt.Installed(fam) {
			continue
		}
		errs = append(errs, b.removeFamily(ctx, fam, o, addrs))
	}
	return errors.Join(errs...)
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
	post, _, err := b.list(ctx, fam, masqPostrouting)
	if err != nil {
		return err
	}
	jumped := false
	for _, r := range post {
		jumped = jumped || r.target == chain
	}
	exists := jumped
	if !jumped {
		// No jump into the chain; it may still exist (an interrupted teardown).
		if _, exists, err = b.list(ctx, fam, chain); err != nil {
			return err
		}
	}
	if err := b.restore(ctx, fam, planMasqXTDel(o, famAddrs, post, exists)); err != nil {
		return fmt.Errorf("removing %s masquerade chain %s of %s: %w", fam, chain, o, err)
	}
	return nil
}

// GC implements MasqBackend: per family whose binary is installed, one listing of
// POSTROUTING and one restore when something is stale. Chains no jump leads to are
// not found this way (they are inert and go with their attachment's DEL).
func (b *MasqIPTables) GC(ctx context.Context, network string, keep cniplumb.Owners) error {
	unlock, err := b.lock()
	if err != nil {
		return err
	}
	defer unlock()
	var errs []error
	for _, fam := range []Family{IPv4, IPv6} {
		if !b.xt.Installed(fam) {
			continue
		}
		post, _, err := b.list(ctx, fam, masqPostrouting)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		lines, stale := planMasqXTGC(network, keep, post)
		if err := b.restore(ctx, fam, lines); err != nil {
			errs = append(errs, fmt.Errorf("removing stale %s masquerade chains of containers %v: %w", fam, stale, err))
		}
	}
	return errors.Join(errs...)
}
