// SPDX-License-Identifier: Apache-2.0

package netfilter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/podwire/podwire/pkg/cniplumb"
)

// HostPortIPTables is the iptables HostPortBackend, in the reference portmap's layout
// (hostport_iptables.go). Per family it touches (ip6tables does not run otherwise), an
// operation lists CNI-HOSTPORT-DNAT (and as needed CNI-HOSTPORT-MASQ, a shared
// per-container chain or the entry jumps; never a whole table) and runs one
// `iptables-restore --noflush`; a busy xtables lock is retried before it is a code-11
// error.
type HostPortIPTables struct{ xtLayout }

var _ HostPortBackend = (*HostPortIPTables)(nil)

// parallel runs the functions at once (each is a process start on the real backend)
// and joins their errors.
func parallel(fns ...func() error) error {
	errs := make([]error, len(fns))
	var wg sync.WaitGroup
	for i, fn := range fns {
		wg.Go(func() { errs[i] = fn() })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// listState lists CNI-HOSTPORT-DNAT (and CNI-HOSTPORT-MASQ); with entries it checks
// the entry jumps at the same time, as every ADD but a node's first needs them.
func (b *HostPortIPTables) listState(ctx context.Context, fam Family, masq, entries bool) (hpState, error) {
	st := hpState{dn: map[string]chainListing{}}
	fns := []func() error{func() (err error) { st.top, err = b.list(ctx, fam, HostPortDNATChain); return err }}
	if entries {
		fns = append(fns, func() (err error) { st.entries, err = b.checkEntries(ctx, fam); return err })
	}
	if masq {
		st.masq = &chainListing{}
		fns = append(fns, func() (err error) { *st.masq, err = b.list(ctx, fam, HostPortMasqChain); return err })
	}
	return st, parallel(fns...)
}

// checkEntries finds which entry jumps exist (three -C at once).
func (b *HostPortIPTables) checkEntries(ctx context.Context, fam Family) (map[hpEntry]bool, error) {
	es := []hpEntry{hpEntryPre, hpEntryOut, hpEntryPost}
	found := make([]bool, len(es))
	var fns []func() error
	for i, e := range es {
		fns = append(fns, func() (err error) { found[i], err = b.xt.Has(ctx, fam, "nat", e.builtin, e.args()); return err })
	}
	if err := parallel(fns...); err != nil {
		return nil, err
	}
	out := map[hpEntry]bool{}
	for i, e := range es {
		out[e] = found[i]
	}
	return out, nil
}

// change plans and runs one family's transaction, listing what the planner asks for.
// A transaction that fails while tearing down the shared chains is planned again
// with the entry jumps checked (the teardown takes them to be there), then without
// the teardown (someone else's rule may still reference a shared chain), so the
// attachment's own rules still go.
func (b *HostPortIPTables) change(ctx context.Context, fam Family, st hpState, ch hpChange) error {
	for tries := 0; ; tries++ {
		lines, err := planHostPortIPTables(fam, st, ch)
		var need errNeed
		if errors.As(err, &need) && tries < 10 {
			switch need {
			case errNeedEntries:
				st.entries, err = b.checkEntries(ctx, fam)
			case HostPortMasqChain:
				st.masq = &chainListing{}
				*st.masq, err = b.list(ctx, fam, HostPortMasqChain)
			default:
				st.dn[string(need)], err = b.list(ctx, fam, string(need))
			}
			if err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		err = b.restore(ctx, fam, lines)
		switch {
		case err == nil || IsBusy(err) || !ch.teardown:
			return err
		case st.entries == nil:
			if st.entries, err = b.checkEntries(ctx, fam); err != nil {
				return err
			}
		default:
			ch.teardown = false
		}
	}
}

// Apply implements HostPortBackend.
func (b *HostPortIPTables) Apply(ctx context.Context, p HostPortPlan) error {
	for _, fam := range p.Families().list() {
		if _, err := renderHostPortIPTables(fam, p); err != nil {
			return err
		}
	}
	chain := HostPortChain(p.Owner.Network, p.Owner.ContainerID)
	return b.forFamilies(p.Families(), false, func(fam Family) error {
		st, err := b.listState(ctx, fam, p.masquerades(), true)
		if err != nil {
			return err
		}
		ch := hpChange{add: &p, removeIDs: map[OwnerID]bool{IDOf(p.Owner): true}, chains: map[string]bool{chain: true}}
		if err := b.change(ctx, fam, st, ch); err != nil {
			if p.SetMarkChain != "" && !IsBusy(err) {
				if l, lerr := b.list(ctx, fam, p.SetMarkChain); lerr == nil && !l.exists {
					return cniplumb.ConfigError("externalSetMarkChain", "the %s nat table has no chain %s: create it first (kube-proxy does) or remove externalSetMarkChain", fam, p.SetMarkChain)
				}
			}
			return fmt.Errorf("installing %s host ports of %s: %w", fam, p.Owner, err)
		}
		return nil
	})
}

// Remove implements HostPortBackend. It also removes the reference portmap's jumps and
// rules for o's network and container (the reference keys them by network and
// container only, so this covers every interface of o's container in that network),
// and o's per-container chain even when no jump leads to it.
func (b *HostPortIPTables) Remove(ctx context.Context, o Owner, fams Families) error {
	return b.forFamilies(fams, true, func(fam Family) error {
		return wrapf(b.removeFamily(ctx, fam, o), "removing %s host ports", fam)
	})
}

func (b *HostPortIPTables) removeFamily(ctx context.Context, fam Family, o Owner) error {
	st, err := b.listState(ctx, fam, false, false)
	if err != nil {
		return err
	}
	ch := hpChange{removeIDs: map[OwnerID]bool{IDOf(o): true}, chains: map[string]bool{}, teardown: true}
	chain := HostPortChain(o.Network, o.ContainerID)
	dn := chainListing{exists: true}
	if !slices.ContainsFunc(st.top.rules, func(r xtRule) bool { return r.target == chain }) {
		// No jump leads there (a repeated DEL, or CNI-HOSTPORT-DNAT was flushed):
		// a listing, cheaper than a transaction, tells whether it is there at all.
		if dn, err = b.list(ctx, fam, chain); err != nil {
			return err
		}
	}
	if dn.exists {
		ch.chains[chain] = true
	}
	return b.change(ctx, fam, st, ch)
}

// Check implements HostPortBackend: this attachment's jumps and rules, the entry
// jumps into the shared chains, and the masquerade rule for its mark.
func (b *HostPortIPTables) Check(ctx context.Context, p HostPortPlan) error {
	chain := HostPortChain(p.Owner.Network, p.Owner.ContainerID)
	for _, fam := range p.Families().list() {
		st, err := b.listState(ctx, fam, p.masquerades(), true)
		if err != nil {
			return err
		}
		dn, err := b.list(ctx, fam, chain)
		if err != nil {
			return err
		}
		if err := hpCheck(fam, p, st.top, dn); err != nil {
			return err
		}
		want := []hpEntry{hpEntryPre, hpEntryOut}
		if p.masquerades() {
			if !st.masq.has("-A " + HostPortMasqChain + " " + hpMasqRule(p.Mark)) {
				return notFound("%s %s has no masquerade rule for mark %#x; run DEL and ADD again", fam, HostPortMasqChain, p.Mark)
			}
			want = append(want, hpEntryPost)
		}
		for _, e := range want {
			if !st.entries[e] {
				return fmt.Errorf("%s nat %s does not jump as portmap needs (%s); run DEL and ADD again", fam, e.builtin, e.rule)
			}
		}
	}
	return nil
}

// GC implements HostPortBackend, in both families (when installed). It also removes
// the reference portmap's rules for containers of network that keep does not list.
// An attachment whose jumps someone flushed away is not found here; portmap's GC
// removes it through its marker (Remove).
func (b *HostPortIPTables) GC(ctx context.Context, network string, keep cniplumb.Owners) error {
	return b.forFamilies(All, true, func(fam Family) error {
		st, err := b.listState(ctx, fam, false, false)
		if err != nil || !st.top.exists {
			return err
		}
		ch := hpChange{removeIDs: map[OwnerID]bool{}, chains: map[string]bool{}, teardown: true}
		for _, o := range Stale(hpXTObjects(fam, st.top), network, keep, nil) {
			if o.layout == byTag {
				ch.removeIDs[OwnerID(o.Key)] = true
			} else {
				ch.chains[o.Key] = true
			}
		}
		if len(ch.removeIDs) == 0 && len(ch.chains) == 0 {
			return nil
		}
		return wrapf(b.change(ctx, fam, st, ch), "collecting %s host ports of network %s", fam, network)
	})
}
