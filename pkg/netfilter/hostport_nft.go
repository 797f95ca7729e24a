// SPDX-License-Identifier: Apache-2.0

package netfilter

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/nftables"

	"github.com/podwire/podwire/pkg/cniplumb"
)

// HostPortNFTables is the nftables HostPortBackend: the plan's Rules in table inet
// podwire_hostport, through NFTables.
type HostPortNFTables struct {
	nft *NFTables
}

var _ HostPortBackend = (*HostPortNFTables)(nil)

// Apply implements HostPortBackend.
func (b *HostPortNFTables) Apply(ctx context.Context, p HostPortPlan) error {
	r, err := p.Rules()
	if err != nil {
		return err
	}
	return b.nft.Apply(ctx, r)
}

// Check implements HostPortBackend.
func (b *HostPortNFTables) Check(ctx context.Context, p HostPortPlan) error {
	r, err := p.Rules()
	if err != nil {
		return err
	}
	return b.nft.Check(ctx, r)
}

// Remove implements HostPortBackend. It also removes the rules the reference portmap's
// nftables backend made for o's container (tables ip/ip6 cni_hostport, rules whose
// comment is the container ID: the reference keys them by container only).
func (b *HostPortNFTables) Remove(ctx context.Context, o Owner, _ Families) error {
	// The reference's rules first: after our own deletion, releasing the socket would
	// wait for an RCU grace period (see nftSocket); before it, nothing is pending.
	c, done, err := b.nft.s.conn()
	if err != nil {
		return err
	}
	rerr := removeRefNFT(c, o.ContainerID)
	done()
	return errors.Join(b.nft.Remove(ctx, HostPortFeature, o), rerr)
}

// GC implements HostPortBackend.
func (b *HostPortNFTables) GC(ctx context.Context, network string, keep cniplumb.Owners) error {
	return b.nft.GC(ctx, HostPortFeature, network, keep)
}

// readRefHP dumps the reference portmap's container chains (objects.go) in both
// families; an absent table, or no nf_tables at all, reads as empty at the cost of
// one netlink round trip per family.
func readRefHP(c NFTConn) (map[nftables.TableFamily][]*nftables.Rule, error) {
	out := map[nftables.TableFamily][]*nftables.Rule{}
	var errs []error
	for _, fam := range refNFTFamilies {
		t, err := c.ListTableOfFamily(refNFTTable, fam)
		if err != nil || t == nil {
			continue
		}
		for _, name := range refNFTChains {
			rules, err := c.GetRules(t, &nftables.Chain{Name: name, Table: t})
			if err != nil && !isNoEnt(err) {
				errs = append(errs, fmt.Errorf("listing chain %s of nftables table %s %s: %w", name, NFTFamily(fam), refNFTTable, err))
			}
			out[fam] = append(out[fam], rules...)
		}
	}
	return out, errors.Join(errs...)
}

// removeRefNFT deletes the reference nftables portmap's rules for containerID, one
// batch per family.
func removeRefNFT(c NFTConn, containerID string) error {
	ref, err := readRefHP(c)
	errs := []error{err}
	for _, rules := range ref {
		n := 0
		for _, r := range rules {
			if ruleComment(r) == containerID {
				errs = append(errs, c.DelRule(r))
				n++
			}
		}
		if n > 0 {
			errs = append(errs, wrapf(c.Flush(), "removing the reference portmap's nftables rules of %s", containerID))
		}
	}
	return errors.Join(errs...)
}
