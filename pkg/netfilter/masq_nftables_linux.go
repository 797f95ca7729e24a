package netfilter

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"

	"github.com/podwire/podwire/pkg/cniplumb"
)

// MasqNFTables is the nftables MasqBackend: the reference's table inet
// cni_plugins_masquerade (see masquerade.go), through netlink only. Apply is one dump
// of postrouting, one of masq_checks and one atomic batch; Remove one dump and one
// batch (plus one table lookup when the last rule goes). It shares NFTables' lasting
// socket handling (see NFTables for why).
//
// The table and its two chains are created when missing, without the comments the
// reference gives them (google/nftables cannot write object comments); the reference
// does not care. podwire deletes the table with its last masquerade rule, so a node
// without pods carries nothing; the reference leaves it in place.
type MasqNFTables struct {
	nft *NFTables
}

var _ MasqBackend = (*MasqNFTables)(nil)

// NewMasqNFTables returns the nftables ipMasq backend.
func NewMasqNFTables() *MasqNFTables { return &MasqNFTables{nft: NewNFTables()} }

// Close releases the netlink socket.
func (b *MasqNFTables) Close() error { return b.nft.Close() }

// rules dumps one chain of the table; a missing table or chain reads as empty.
func rulesOf(c *nftables.Conn, t *nftables.Table, ch *nftables.Chain) ([]*nftables.Rule, error) {
	rs, err := c.GetRules(t, ch)
	if err != nil && !isNoEnt(err) {
		return nil, fmt.Errorf("listing nftables chain inet %s %s: %w", t.Name, ch.Name, err)
	}
	return rs, nil
}

// Apply implements MasqBackend.
func (b *MasqNFTables) Apply(_ context.Context, p MasqPlan) error {
	if err := p.Validate(); err != nil {
		return err
	}
	t := masqNFTTable()
	checks, post := masqNFTChains(t)
	add := masqNFTRules(t, checks, p)
	return b.nft.locked(masqLock, func(c *nftables.Conn) error {
		postRules, err := rulesOf(c, t, post)
		if err != nil {
			return err
		}
		have, err := rulesOf(c, t, checks)
		if err != nil {
			return err
		}
		if !hasGoto(postRules) {
			// First pod (or a damaged table): create table and chains and (re)fill
			// postrouting, as the reference does on every ADD. Only here, because adding an
			// existing base chain is an update that costs an RCU grace period.
			c.AddTable(t)
			c.AddChain(checks)
			c.AddChain(post)
			c.FlushChain(post)
			for _, r := range masqNFTPostRules(t, post) {
				c.AddRule(r)
			}
		}
		// A repeated ADD replaces the owner's rules.
		for _, r := range selectMasqNFT(have, p.Owner) {
			if err := c.DelRule(r); err != nil {
				return fmt.Errorf("deleting old masquerade rule of %s: %w", p.Owner, err)
			}
		}
		for _, r := range add {
			c.AddRule(r)
		}
		if err := c.Flush(); err != nil {
			return fmt.Errorf("installing masquerade of %s in nftables table inet %s: %w", p.Owner, masqNFTTableName, err)
		}
		return nil
	})
}

func hasGoto(rs []*nftables.Rule) bool {
	for _, r := range rs {
		if isGotoChecks(r) {
			return true
		}
	}
	return false
}

// Check implements MasqBackend.
func (b *MasqNFTables) Check(_ context.Context, p MasqPlan) error {
	t := masqNFTTable()
	checks, post := masqNFTChains(t)
	c, done, err := b.nft.conn()
	if err != nil {
		return err
	}
	defer done()
	have, err := rulesOf(c, t, checks)
	if err != nil {
		return err
	}
	postRules, err := rulesOf(c, t, post)
	if err != nil {
		return err
	}
	return checkMasqNFT(p, have, hasGoto(postRules))
}

// Remove implements MasqBackend; addrs do not matter here (rules carry the interface
// name in their comment hash).
func (b *MasqNFTables) Remove(_ context.Context, o Owner, _ []netip.Prefix) error {
	return b.removeWhere(func(rs []*nftables.Rule) []*nftables.Rule { return selectMasqNFT(rs, o) })
}

// GC implements MasqBackend.
func (b *MasqNFTables) GC(_ context.Context, network string, keep cniplumb.Owners) error {
	return b.removeWhere(func(rs []*nftables.Rule) []*nftables.Rule { return staleMasqNFT(rs, network, keep) })
}

// removeWhere deletes the masq_checks rules pick selects, in one batch. When they are
// the last ones and the table holds nothing but the reference's two chains and
// postrouting's three rules, the table goes too.
func (b *MasqNFTables) removeWhere(pick func([]*nftables.Rule) []*nftables.Rule) error {
	t := masqNFTTable()
	checks, post := masqNFTChains(t)
	return b.nft.locked(masqLock, func(c *nftables.Conn) error {
		have, err := rulesOf(c, t, checks)
		if err != nil {
			return err
		}
		gone := pick(have)
		if len(gone) == 0 {
			return nil
		}
		dropTable := false
		if len(gone) == len(have) {
			postRules, err := rulesOf(c, t, post)
			if err != nil {
				return err
			}
			tab, err := c.ListTableOfFamily(masqNFTTableName, nftables.TableFamilyINet)
			dropTable = err == nil && onlyTwoChains(tab) && len(postRules) <= len(masqNFTPostRules(t, post))
		}
		if dropTable {
			// Under the lock no podwire process adds to the table meanwhile. A reference
			// ADD could (it does not take our lock): its rule would go with the table if it
			// landed between the dump above and this batch, a window of one netlink round
			// trip that only exists while both binaries run on one node.
			c.DelTable(t)
		} else {
			for _, r := range gone {
				if err := c.DelRule(r); err != nil {
					return fmt.Errorf("deleting masquerade rule: %w", err)
				}
			}
		}
		if err := c.Flush(); err != nil {
			return fmt.Errorf("removing masquerade rules from nftables table inet %s: %w", masqNFTTableName, err)
		}
		return nil
	})
}

// onlyTwoChains reports whether the table holds just masq_checks and postrouting
// (nothing else of anyone's). google/nftables v0.3.0 decodes NFTA_TABLE_USE in host
// byte order instead of network order; either reading is accepted, so a fixed library
// keeps working.
func onlyTwoChains(t *nftables.Table) bool {
	swapped := binaryutil.BigEndian.Uint32(binaryutil.NativeEndian.PutUint32(t.Use))
	return t.Use == 2 || swapped == 2
}

// xtablesChainExists reports whether iptables-nft has chain in its nat table of fam
// (table ip nat or ip6 nat): one netlink request, no exec.
func (b *MasqNFTables) xtablesChainExists(fam Family, chain string) (bool, error) {
	c, done, err := b.nft.conn()
	if err != nil {
		return false, err
	}
	defer done()
	tf := nftables.TableFamilyIPv4
	if fam == IPv6 {
		tf = nftables.TableFamilyIPv6
	}
	_, err = c.ListChain(&nftables.Table{Name: "nat", Family: tf}, chain)
	if err == nil {
		return true, nil
	}
	if isNoEnt(err) {
		return false, nil
	}
	return false, fmt.Errorf("looking up chain %s in the %s nat table of iptables-nft: %w", chain, fam, err)
}
