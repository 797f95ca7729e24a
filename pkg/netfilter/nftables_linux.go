package netfilter

import (
	"context"
	"errors"
	"fmt"
	"os/exec"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

// NFTables is the nftables backend: netlink only, no exec. Each feature lives in a
// table of its own (podwire_<feature>) with one base chain per hook; every operation is
// one dump of those chains and at most one atomic batch. The table is created with the
// first rule and deleted with the last, so a node without pods carries nothing of ours.
type NFTables struct{}

// NewNFTables returns the nftables backend.
func NewNFTables() *NFTables { return &NFTables{} }

func (b *NFTables) conn() (*nftables.Conn, func(), error) {
	c, err := nftables.New(nftables.AsLasting())
	if err != nil {
		return nil, nil, fmt.Errorf("opening nf_tables netlink socket: %w", err)
	}
	return c, func() { _ = c.CloseLasting() }, nil
}

// ownedRule is a rule of our table with its parsed tag.
type ownedRule struct {
	rule *nftables.Rule
	tag  Tag
	ours bool
}

// listFeature reads every base chain of f; a missing table or chain reads as empty.
func (b *NFTables) listFeature(c *nftables.Conn, f Feature) (map[Hook][]ownedRule, error) {
	t := nftTable(f)
	out := map[Hook][]ownedRule{}
	for _, h := range f.Hooks {
		ch, err := nftChain(t, h)
		if err != nil {
			return nil, err
		}
		rules, err := c.GetRules(t, ch)
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("listing nftables chain %s %s: %w", TableName(f), h.Name, err)
		}
		for _, r := range rules {
			tag, ok := decodeTag(r.UserData)
			out[h] = append(out[h], ownedRule{rule: r, tag: tag, ours: ok})
		}
	}
	return out, nil
}

// Apply implements Backend.
func (b *NFTables) Apply(_ context.Context, p Plan) error {
	if err := p.Validate(); err != nil {
		return err
	}
	t := nftTable(p.Feature)
	type newRule struct {
		chain *nftables.Chain
		rule  Rule
	}
	chains := map[Hook]*nftables.Chain{}
	for _, h := range p.Feature.Hooks {
		ch, err := nftChain(t, h)
		if err != nil {
			return err
		}
		chains[h] = ch
	}
	// Render everything before taking the lock or touching the kernel.
	var rendered []*nftables.Rule
	for _, r := range p.Rules {
		ex, err := nftExprs(p.Feature, r)
		if err != nil {
			return err
		}
		rendered = append(rendered, &nftables.Rule{Table: t, Chain: chains[r.Hook], Exprs: ex, UserData: encodeTag(tagFor(p.Owner, r))})
	}
	unlock, err := lockFeature("nftables", p.Feature)
	if err != nil {
		return err
	}
	defer unlock()
	c, done, err := b.conn()
	if err != nil {
		return err
	}
	defer done()
	cur, err := b.listFeature(c, p.Feature)
	if err != nil {
		return err
	}
	c.AddTable(t)
	for _, h := range p.Feature.Hooks {
		c.AddChain(chains[h])
	}
	id := IDOf(p.Owner)
	for _, rs := range cur {
		for _, r := range rs {
			if r.ours && r.tag.ID == id {
				if err := c.DelRule(r.rule); err != nil {
					return fmt.Errorf("deleting old %s rule of %s: %w", p.Feature.Name, p.Owner, err)
				}
			}
		}
	}
	for _, r := range rendered {
		c.AddRule(r)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("installing %s rules for %s in nftables table %s: %w", p.Feature.Name, p.Owner, TableName(p.Feature), err)
	}
	return nil
}

// Remove implements Backend; fams does not matter to an inet table.
func (b *NFTables) Remove(_ context.Context, f Feature, id OwnerID, _ Families) error {
	unlock, err := lockFeature("nftables", f)
	if err != nil {
		return err
	}
	defer unlock()
	c, done, err := b.conn()
	if err != nil {
		return err
	}
	defer done()
	cur, err := b.listFeature(c, f)
	if err != nil {
		return err
	}
	var mine []*nftables.Rule
	others := 0
	for _, rs := range cur {
		for _, r := range rs {
			if r.ours && r.tag.ID == id {
				mine = append(mine, r.rule)
			} else {
				others++
			}
		}
	}
	if len(mine) == 0 {
		return nil
	}
	if others == 0 {
		// Our last rules: drop the whole table. Under the lock no podwire process can
		// be adding to it concurrently.
		c.DelTable(nftTable(f))
	} else {
		for _, r := range mine {
			if err := c.DelRule(r); err != nil {
				return fmt.Errorf("deleting %s rule: %w", f.Name, err)
			}
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("removing %s rules from nftables table %s: %w", f.Name, TableName(f), err)
	}
	return nil
}

// Check implements Backend.
func (b *NFTables) Check(_ context.Context, p Plan) error {
	c, done, err := b.conn()
	if err != nil {
		return err
	}
	defer done()
	cur, err := b.listFeature(c, p.Feature)
	if err != nil {
		return err
	}
	var have []string
	for _, h := range p.Feature.Hooks {
		for _, r := range cur[h] {
			if r.ours && r.tag.Is(p.Owner) {
				have = append(have, r.tag.Fingerprint)
			}
		}
	}
	return compareFingerprints(p, have)
}

// Tags implements Backend.
func (b *NFTables) Tags(_ context.Context, f Feature) ([]Tag, error) {
	c, done, err := b.conn()
	if err != nil {
		return nil, err
	}
	defer done()
	cur, err := b.listFeature(c, f)
	if err != nil {
		return nil, err
	}
	var out []Tag
	for _, h := range f.Hooks {
		for _, r := range cur[h] {
			if r.ours {
				out = append(out, r.tag)
			}
		}
	}
	return out, nil
}

// ProbeHost finds which backends this host offers: nftables when the kernel answers
// an nf_tables request, iptables when iptables and iptables-restore are installed. It
// costs one netlink round trip and two PATH lookups.
func ProbeHost() Probe {
	var p Probe
	if c, err := nftables.New(); err == nil {
		if _, err := c.ListTablesOfFamily(nftables.TableFamilyINet); err == nil {
			p.NFTables = true
		}
	}
	_, e1 := exec.LookPath("iptables")
	_, e2 := exec.LookPath("iptables-restore")
	p.IPTables = e1 == nil && e2 == nil
	return p
}

// Open returns the backend for want (Auto probes the host), and the kind it chose.
func Open(want Kind) (Backend, Kind, error) {
	var p Probe
	switch want {
	case KindNFTables:
		p.NFTables = true // its first netlink call reports a kernel without nf_tables
	case KindIPTables:
		_, e1 := exec.LookPath("iptables-restore")
		p.IPTables = e1 == nil
	default:
		p = ProbeHost()
	}
	k, err := Pick(want, p)
	if err != nil {
		return nil, "", err
	}
	if k == KindIPTables {
		return NewIPTables(), k, nil
	}
	return NewNFTables(), k, nil
}
