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
// (see hostport_iptables.go). Per address family an operation lists
// CNI-HOSTPORT-DNAT (and, when it needs them, CNI-HOSTPORT-MASQ, a per-container chain
// shared with another attachment, or the entry jumps; never a whole table) and runs
// one `iptables-restore --noflush` transaction. A busy xtables lock is waited for and
// retried inside the call before it becomes a code-11 error. ip6tables is not run for
// a family the operation does not touch.
type HostPortIPTables struct {
	xt   XTables
	lock func() (func(), error)
}

var _ HostPortBackend = (*HostPortIPTables)(nil)

// listChain lists one nat chain.
func (b *HostPortIPTables) listChain(ctx context.Context, fam Family, chain string) (chainListing, error) {
	rules, exists, err := listXT(ctx, b.xt, fam, "nat", chain)
	return chainListing{exists: exists, rules: rules}, err
}

// parallel runs the functions at once (each is a process start on the real backend)
// and returns the first error.
func parallel(fns ...func() error) error {
	errs := make([]error, len(fns))
	var wg sync.WaitGroup
	for i, fn := range fns {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = fn() }()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// listState lists CNI-HOSTPORT-DNAT and, when masq, CNI-HOSTPORT-MASQ; with entries,
// it checks the entry jumps at the same time (an ADD needs them whenever the shared
// chains exist, which is every ADD but a node's first).
func (b *HostPortIPTables) listState(ctx context.Context, fam Family, masq, entries bool) (hpState, error) {
	st := hpState{dn: map[string]chainListing{}}
	fns := []func() error{func() (err error) { st.top, err = b.listChain(ctx, fam, HostPortDNATChain); return err }}
	if entries {
		fns = append(fns, func() (err error) { st.entries, err = b.checkEntries(ctx, fam); return err })
	}
	if masq {
		fns = append(fns, func() error {
			l, err := b.listChain(ctx, fam, HostPortMasqChain)
			st.masq = &l
			return err
		})
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

// change plans and runs one family's transaction, listing more when the planner asks
// for it. When the transaction fails while tearing down the shared chains (someone
// else's rule may still reference them), it is retried without that part, so the
// attachment's own rules still go.
func (b *HostPortIPTables) change(ctx context.Context, fam Family, st hpState, ch hpChange) error {
	for tries := 0; ; tries++ {
		script, err := planHostPortIPTables(fam, st, ch)
		var need errNeed
		if errors.As(err, &need) && tries < 10 {
			switch need {
			case errNeedEntries:
				st.entries, err = b.checkEntries(ctx, fam)
			case HostPortMasqChain:
				var l chainListing
				l, err = b.listChain(ctx, fam, HostPortMasqChain)
				st.masq = &l
			default:
				st.dn[string(need)], err = b.listChain(ctx, fam, string(need))
			}
			if err != nil {
				return err
			}
			continue
		}
		if err != nil || script.empty() {
			return err
		}
		err = b.xt.Restore(ctx, fam, script.String())
		switch {
		case err == nil || IsBusy(err) || !ch.teardown:
			return err
		case st.entries == nil:
			// The teardown took the entry jumps to be there; see which are.
			if st.entries, err = b.checkEntries(ctx, fam); err != nil {
				return err
			}
		default:
			// Someone else's rule may still reference a shared chain: remove just
			// the attachment's own rules.
			ch.teardown = false
		}
	}
}

// Apply implements HostPortBackend.
func (b *HostPortIPTables) Apply(ctx context.Context, p HostPortPlan) error {
	fams := p.Families()
	for _, fam := range []Family{IPv4, IPv6} {
		if fams.Has(fam) {
			if _, err := renderHostPortIPTables(fam, p); err != nil {
				return err
			}
		}
	}
	unlock, err := b.lock()
	if err != nil {
		return err
	}
	defer unlock()
	chain := HostPortChain(p.Owner.Network, p.Owner.ContainerID)
	for _, fam := range []Family{IPv4, IPv6} {
		if !fams.Has(fam) {
			continue
		}
		st, err := b.listState(ctx, fam, p.masquerades(), true)
		if err != nil {
			return err
		}
		ch := hpChange{add: &p, removeIDs: map[OwnerID]bool{IDOf(p.Owner): true}, chains: map[string]bool{chain: true}}
		if err := b.change(ctx, fam, st, ch); err != nil {
			if p.SetMarkChain != "" && !IsBusy(err) {
				if l, lerr := b.listChain(ctx, fam, p.SetMarkChain); lerr == nil && !l.exists {
					return cniplumb.ConfigError("externalSetMarkChain", "the %s nat table has no chain %s: create it first (kube-proxy does) or remove externalSetMarkChain", fam, p.SetMarkChain)
				}
			}
			return fmt.Errorf("installing %s host ports of %s: %w", fam, p.Owner, err)
		}
	}
	return nil
}

// Remove implements HostPortBackend. It also removes the reference portmap's jumps and
// rules for o's network and container (the reference keys them by network and
// container only, so this covers every interface of o's container in that network),
// and o's per-container chain even when no jump leads to it.
func (b *HostPortIPTables) Remove(ctx context.Context, o Owner, fams Families) error {
	var present []Family
	for _, fam := range []Family{IPv4, IPv6} {
		if fams.Has(fam) && b.xt.Installed(fam) {
			present = append(present, fam)
		}
	}
	if len(present) == 0 {
		return nil
	}
	unlock, err := b.lock()
	if err != nil {
		return err
	}
	defer unlock()
	var errs []error
	for _, fam := range present {
		errs = append(errs, b.removeFamily(ctx, fam, map[OwnerID]bool{IDOf(o): true}, HostPortChain(o.Network, o.ContainerID)))
	}
	return errors.Join(errs...)
}

// removeFamily removes the owners ids and the per-container chains from one family;
// the caller holds the lock.
func (b *HostPortIPTables) removeFamily(ctx context.Context, fam Family, ids map[OwnerID]bool, chains ...string) error {
	st, err := b.listState(ctx, fam, false, false)
	ch := hpChange{removeIDs: ids, chains: map[string]bool{}, teardown: true}
	for _, c := range chains {
		if err != nil {
			break
		}
		jumped := slices.ContainsFunc(st.top.rules, func(r xtRule) bool { return r.target == c })
		if !jumped {
			// No jump leads there (a repeated DEL, or CNI-HOSTPORT-DNAT was flushed):
			// a listing, cheaper than a transaction, tells whether it is there at all.
			var l chainListing
			if l, err = b.listChain(ctx, fam, c); err != nil || !l.exists {
				continue
			}
		}
		ch.chains[c] = true
	}
	if err == nil {
		err = b.change(ctx, fam, st, ch)
	}
	if err != nil {
		return fmt.Errorf("removing %s host ports: %w", fam, err)
	}
	return nil
}

// Check implements HostPortBackend: this attachment's jumps and rules, the entry
// jumps into the shared chains, and the masquerade rule for its mark.
func (b *HostPortIPTables) Check(ctx context.Context, p HostPortPlan) error {
	chain := HostPortChain(p.Owner.Network, p.Owner.ContainerID)
	for _, fam := range []Family{IPv4, IPv6} {
		if !p.Families().Has(fam) {
			continue
		}
		st, err := b.listState(ctx, fam, p.masquerades(), true)
		if err != nil {
			return err
		}
		dn, err := b.listChain(ctx, fam, chain)
		if err != nil {
			return err
		}
		if err := hpCheck(fam, p, st.top, dn); err != nil {
			return err
		}
		entries := st.entries
		want := []hpEntry{hpEntryPre, hpEntryOut}
		if p.masquerades() {
			if !st.masq.has("-A " + HostPortMasqChain + " " + hpMasqRule(p.Mark)) {
				return notFound("%s %s has no masquerade rule for mark %#x; run DEL and ADD again", fam, HostPortMasqChain, p.Mark)
			}
			want = append(want, hpEntryPost)
		}
		for _, e := range want {
			if !entries[e] {
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
		st, err := b.listState(ctx, fam, false, false)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !st.top.exists {
			continue
		}
		ch := hpGCChange(st.top, network, keep)
		if len(ch.removeIDs) == 0 && len(ch.chains) == 0 {
			continue
		}
		if err := b.change(ctx, fam, st, ch); err != nil {
			errs = append(errs, fmt.Errorf("collecting %s host ports of network %s: %w", fam, network, err))
		}
	}
	return errors.Join(errs...)
}
