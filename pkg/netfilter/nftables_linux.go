package netfilter

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

// NFTables is the nftables backend: netlink only, no exec. Each feature lives in a
// table of its own (podwire_<feature>) with one base chain per hook; every operation is
// one dump of those chains and at most one atomic batch. The table is created with the
// first rule and deleted with the last, so a node without pods carries nothing of ours.
//
// An NFTables keeps one netlink socket open across calls, bound to the network
// namespace of its first call; Close releases it. This matters for speed: the kernel
// frees deleted rules after an RCU grace period, and releasing any nf_tables socket
// waits for that (~10 ms). A plugin that removes rules and then goes on with other work
// (deleting the veth, calling IPAM) lets the grace period pass in the background and
// closes the socket for free at exit.
type NFTables struct {
	mu sync.Mutex
	c  *nftables.Conn
}

// NewNFTables returns the nftables backend.
func NewNFTables() *NFTables { return &NFTables{} }

// Close releases the netlink socket; the backend may be used again afterwards.
func (b *NFTables) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.c == nil {
		return nil
	}
	err := b.c.CloseLasting()
	b.c = nil
	return err
}

// conn returns the open socket, opening it on first use. The returned func releases
// the backend's mutex (calls on one NFTables are serialized).
func (b *NFTables) conn() (*nftables.Conn, func(), error) {
	b.mu.Lock()
	if b.c == nil {
		c, err := nftables.New(nftables.AsLasting())
		if err != nil {
			b.mu.Unlock()
			return nil, nil, fmt.Errorf("opening nf_tables netlink socket: %w", err)
		}
		b.c = c
	}
	return b.c, b.mu.Unlock, nil
}

// locked runs fn on the backend's connection while holding f's lock, which serializes
// podwire's own read-modify-write cycles on f's table.
func (b *NFTables) locked(f Feature, fn func(c *nftables.Conn) error) error {
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
	return fn(c)
}

// ownedRule is a rule of our table with its parsed tag.
type ownedRule struct {
	rule *nftables.Rule
	tag  Tag
	ours bool
}

// listFeature reads every base chain of f; a missing table or chain reads as empty and
// is absent from the returned set of existing chains.
func (b *NFTables) listFeature(c *nftables.Conn, f Feature) (map[Hook][]ownedRule, map[Hook]bool, error) {
	t := nftTable(f)
	out := map[Hook][]ownedRule{}
	exists := map[Hook]bool{}
	for _, h := range f.Hooks {
		ch, err := nftChain(t, h)
		if err != nil {
			return nil, nil, err
		}
		// A dump of a missing table or chain is empty, not an error; only an empty
		// dump needs the (cheap) question whether the chain exists.
		rules, err := c.GetRules(t, ch)
		if err != nil && !isNoEnt(err) {
			return nil, nil, fmt.Errorf("listing nftables chain %s %s: %w", TableName(f), h.Name, err)
		}
		if len(rules) == 0 {
			if _, err := c.ListChain(t, h.Name); err != nil {
				if isNoEnt(err) {
					continue
				}
				return nil, nil, fmt.Errorf("looking up nftables chain %s %s: %w", TableName(f), h.Name, err)
			}
		}
		exists[h] = true
		for _, r := range rules {
			tag, ok := decodeTag(r.UserData)
			out[h] = append(out[h], ownedRule{rule: r, tag: tag, ours: ok})
		}
	}
	return out, exists, nil
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
	return b.locked(p.Feature, func(c *nftables.Conn) error {
		cur, exists, err := b.listFeature(c, p.Feature)
		if err != nil {
			return err
		}
		// Create the table and base chains only when missing: re-adding an existing base
		// chain is an update that makes the kernel wait for an RCU grace period (~10 ms
		// here), more than everything else in the batch together. The lock makes the
		// listing authoritative among podwire processes.
		for _, h := range p.Feature.Hooks {
			if !exists[h] {
				c.AddTable(t)
				c.AddChain(chains[h])
			}
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
	})
}

// Remove implements Backend; fams does not matter to an inet table.
func (b *NFTables) Remove(_ context.Context, f Feature, id OwnerID, _ Families) error {
	return b.locked(f, func(c *nftables.Conn) error {
		cur, _, err := b.listFeature(c, f)
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
	})
}

// Check implements Backend.
func (b *NFTables) Check(_ context.Context, p Plan) error {
	c, done, err := b.conn()
	if err != nil {
		return err
	}
	defer done()
	cur, _, err := b.listFeature(c, p.Feature)
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
	cur, _, err := b.listFeature(c, f)
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

// namedProbe is what a backend configured by name needs probed: nftables reports a
// kernel without nf_tables at its first netlink call; iptables needs iptables-restore.
// Any other kind (Auto) gets an empty Probe: callers probe the host for it.
func namedProbe(want Kind) Probe {
	var p Probe
	switch want {
	case KindNFTables:
		p.NFTables = true
	case KindIPTables:
		_, err := exec.LookPath("iptables-restore")
		p.IPTables = err == nil
	}
	return p
}

// Open returns the backend for want (Auto probes the host), and the kind it chose.
func Open(want Kind) (Backend, Kind, error) {
	p := namedProbe(want)
	if !want.Named() {
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

// isNoEnt recognizes ENOENT from google/nftables, which does not always wrap the errno.
func isNoEnt(err error) bool {
	return err != nil && (errors.Is(err, unix.ENOENT) || strings.Contains(err.Error(), "no such file or directory"))
}
