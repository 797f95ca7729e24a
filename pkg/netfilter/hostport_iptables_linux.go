package netfilter

import (
	"context"
	"errors"
	"fmt"
	"os/exec"

	"github.com/podwire/podwire/pkg/cniplumb"
)

// HostPortIPTables is the iptables HostPortBackend, in the reference portmap's layout
// (see hostport_iptables.go). Per address family an operation lists
// CNI-HOSTPORT-DNAT (and, when it needs them, CNI-HOSTPORT-MASQ or a per-container
// chain shared with another attachment; never a whole table) and runs one
// `iptables-restore --noflush` transaction. A busy xtables lock is waited for and
// retried inside the call (IPTables.LockWait, Attempts) before it becomes a code-11
// error. ip6tables is not run for a family the operation does not touch.
type HostPortIPTables struct {
	ipt *IPTables
}

var _ HostPortBackend = (*HostPortIPTables)(nil)

// NewHostPortIPTables returns the iptables host-port backend with default lock
// handling.
func NewHostPortIPTables() *HostPortIPTables { return &HostPortIPTables{ipt: NewIPTables()} }

// listChain lists one nat chain; a missing chain lists as not existing.
func (b *HostPortIPTables) listChain(ctx context.Context, fam Family, chain string) (chainListing, error) {
	bin, _ := binaries(fam)
	out, err := b.ipt.run(ctx, "", bin, "-t", "nat", "-S", chain)
	if IsNotFound(err) {
		return chainListing{}, nil
	}
	if err != nil {
		return chainListing{}, fmt.Errorf("listing %s nat chain %s: %w", fam, chain, err)
	}
	return parseListing(out), nil
}

// listBoth lists CNI-HOSTPORT-DNAT and, when masq, CNI-HOSTPORT-MASQ: concurrently when
// they are processes, one after the other on the direct iptables-nft path (a netlink
// round trip each, on one socket).
func (b *HostPortIPTables) listBoth(ctx context.Context, fam Family, masq bool) (hpState, error) {
	st := hpState{dn: map[string]chainListing{}}
	if xtDirectFor(fam) != nil {
		top, err := b.listChain(ctx, fam, HostPortDNATChain)
		if err != nil {
			return st, err
		}
		st.top = top
		if masq {
			l, err := b.listChain(ctx, fam, HostPortMasqChain)
			if err != nil {
				return st, err
			}
			st.masq = &l
		}
		return st, nil
	}
	var merr error
	done := make(chan struct{})
	if masq {
		go func() {
			defer close(done)
			l, err := b.listChain(ctx, fam, HostPortMasqChain)
			st.masq, merr = &l, err
		}()
	} else {
		close(done)
	}
	top, err := b.listChain(ctx, fam, HostPortDNATChain)
	<-done
	if err != nil {
		return st, err
	}
	if merr != nil {
		return st, merr
	}
	st.top = top
	return st, nil
}

// change plans and runs one family's transaction, listing more chains when the
// planner asks for them. When the transaction fails it retries without removing the
// shared chains, then (for removals) without deleting per-container chains, so a
// hand-edited node still gets this attachment's rules removed.
func (b *HostPortIPTables) change(ctx context.Context, fam Family, st hpState, ch hpChange) error {
	_, restore := binaries(fam)
	var lastErr error
	for tries := 0; tries < 10; tries++ {
		script, err := planHostPortIPTables(fam, st, ch)
		var need errNeedListing
		if errors.As(err, &need) {
			l, err := b.listChain(ctx, fam, string(need))
			if err != nil {
				return err
			}
			if string(need) == HostPortMasqChain {
				st.masq = &l
			} else {
				st.dn[string(need)] = l
			}
			continue
		}
		if err != nil {
			return err
		}
		if script.empty() {
			return nil
		}
		_, err = b.ipt.run(ctx, script.String(), restore, "--noflush")
		if err == nil {
			return nil
		}
		lastErr = err
		switch {
		case IsBusy(err):
			return err
		case ch.teardown:
			ch.teardown = false
		case ch.add == nil && !ch.keep:
			ch.keep = true
		default:
			return lastErr
		}
	}
	return lastErr
}

// families lists the families of fams whose iptables binary is installed.
func presentFamilies(fams Families) []Family {
	var out []Family
	for _, fam := range []Family{IPv4, IPv6} {
		if !fams.Has(fam) {
			continue
		}
		bin, restore := binaries(fam)
		if _, err := exec.LookPath(bin); err != nil {
			continue
		}
		if _, err := exec.LookPath(restore); err != nil {
			continue
		}
		out = append(out, fam)
	}
	return out
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
	unlock, err := lockFeature("iptables", HostPortFeature)
	if err != nil {
		return err
	}
	defer unlock()
	chain := HostPortChain(p.Owner.Network, p.Owner.ContainerID)
	for _, fam := range []Family{IPv4, IPv6} {
		if !fams.Has(fam) {
			continue
		}
		st, err := b.listBoth(ctx, fam, p.masquerades())
		if err != nil {
			return err
		}
		ch := hpChange{add: &p, removeIDs: map[OwnerID]bool{IDOf(p.Owner): true}, removeRef: map[string]bool{chain: true}}
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
// container only, so this covers every interface of o's container in that network).
func (b *HostPortIPTables) Remove(ctx context.Context, o Owner, fams Families) error {
	present := presentFamilies(fams)
	if len(present) == 0 {
		return nil
	}
	unlock, err := lockFeature("iptables", HostPortFeature)
	if err != nil {
		return err
	}
	defer unlock()
	chain := HostPortChain(o.Network, o.ContainerID)
	var errs []error
	for _, fam := range present {
		st, err := b.listBoth(ctx, fam, false)
		if err == nil && !st.top.exists {
			continue // no host port at all in this family
		}
		if err == nil {
			ch := hpChange{removeIDs: map[OwnerID]bool{IDOf(o): true}, removeRef: map[string]bool{chain: true}, teardown: true}
			err = b.change(ctx, fam, st, ch)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("removing %s host ports of %s: %w", fam, o, err))
		}
	}
	return errors.Join(errs...)
}

// Check implements HostPortBackend: this attachment's jumps and rules, the entry
// jumps into the shared chains, and the masquerade rule for its mark.
func (b *HostPortIPTables) Check(ctx context.Context, p HostPortPlan) error {
	chain := HostPortChain(p.Owner.Network, p.Owner.ContainerID)
	for _, fam := range []Family{IPv4, IPv6} {
		if !p.Families().Has(fam) {
			continue
		}
		st, err := b.listBoth(ctx, fam, p.masquerades())
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
		bin, _ := binaries(fam)
		entries := [][2]string{{"PREROUTING", hpEntryDNAT}, {"OUTPUT", hpEntryDNAT}}
		if p.masquerades() {
			if !st.masq.has("-A " + HostPortMasqChain + " " + hpMasqRule(p.Mark)) {
				return notFound("%s %s has no masquerade rule for mark %#x; run DEL and ADD again", fam, HostPortMasqChain, p.Mark)
			}
			entries = append(entries, [2]string{"POSTROUTING", hpEntryMasq})
		}
		for _, e := range entries {
			args := append([]string{"-t", "nat", "-C", e[0]}, xtTokens(e[1])...)
			if _, err := b.ipt.run(ctx, "", bin, args...); err != nil {
				return fmt.Errorf("%s nat %s does not jump as portmap needs (%s): %w; run DEL and ADD again", fam, e[0], e[1], err)
			}
		}
	}
	return nil
}

// GC implements HostPortBackend, in both families (when installed). It also removes
// the reference portmap's rules for containers of network that keep does not list.
func (b *HostPortIPTables) GC(ctx context.Context, network string, keep cniplumb.Owners) error {
	present := presentFamilies(All)
	if len(present) == 0 {
		return nil
	}
	unlock, err := lockFeature("iptables", HostPortFeature)
	if err != nil {
		return err
	}
	defer unlock()
	var errs []error
	for _, fam := range present {
		st, err := b.listBoth(ctx, fam, false)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !st.top.exists {
			continue
		}
		ch := hpGCChange(st.top, network, keep)
		if len(ch.removeIDs) == 0 && len(ch.removeRef) == 0 {
			continue
		}
		if err := b.change(ctx, fam, st, ch); err != nil {
			errs = append(errs, fmt.Errorf("collecting %s host ports of network %s: %w", fam, network, err))
		}
	}
	return errors.Join(errs...)
}
