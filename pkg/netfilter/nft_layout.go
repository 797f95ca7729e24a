// SPDX-License-Identifier: Apache-2.0

package netfilter

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"golang.org/x/sys/unix"

	"github.com/podwire/podwire/pkg/cniplumb"
)

// The one nftables engine of every nftables layout (podwire's hostport and macspoof
// tables, the reference's masquerade table): an attachment's rules are those of the
// layout's chains whose comment names it; an operation is one dump of those chains
// and at most one atomic batch.

// NFTConn is the part of a google/nftables connection the nftables layouts use:
// *nftables.Conn, or in tests the in-memory kernel of package fake.
type NFTConn interface {
	ListTableOfFamily(name string, fam nftables.TableFamily) (*nftables.Table, error)
	ListChain(t *nftables.Table, name string) (*nftables.Chain, error)
	GetRules(t *nftables.Table, c *nftables.Chain) ([]*nftables.Rule, error)
	AddTable(t *nftables.Table) *nftables.Table
	AddChain(c *nftables.Chain) *nftables.Chain
	FlushChain(c *nftables.Chain)
	DelChain(c *nftables.Chain)
	AddRule(r *nftables.Rule) *nftables.Rule
	DelRule(r *nftables.Rule) error
	DelTable(t *nftables.Table)
	// Flush sends the batch built since the last Flush; the kernel applies all of it
	// or nothing.
	Flush() error
}

// nftSocket holds one nf_tables connection across calls, in the network namespace of
// its first call, and the lock that serializes podwire's read-modify-write cycles
// per table. Releasing an nf_tables socket that deleted rules waits for the RCU grace
// period after which the kernel frees them (~10 ms on a small VM); one socket for the
// whole process pays that once, at exit (in the plugin's own process: nothing it
// started outlives it), instead of once per batch.
type nftSocket struct {
	mu    sync.Mutex
	c     NFTConn
	dial  func() (NFTConn, error)
	close func() error
	lock  func(name string) (func(), error)
}

// nftSocketOn is a socket on c (a fake kernel in tests), without lock files.
func nftSocketOn(c NFTConn) *nftSocket {
	return &nftSocket{dial: func() (NFTConn, error) { return c, nil }, lock: noLock}
}

// noLock is the lock of backends on a fake kernel, which serializes calls itself.
func noLock(string) (func(), error) { return func() {}, nil }

// Close releases the netlink socket; the socket is opened again on next use.
func (s *nftSocket) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.c == nil || s.close == nil {
		return nil
	}
	err := s.close()
	s.c = nil
	return err
}

// conn returns the open connection, opening it on first use; done releases it.
func (s *nftSocket) conn() (c NFTConn, done func(), err error) {
	s.mu.Lock()
	if s.c == nil {
		if s.c, err = s.dial(); err != nil {
			s.mu.Unlock()
			return nil, nil, fmt.Errorf("opening nf_tables netlink socket: %w", err)
		}
	}
	return s.c, s.mu.Unlock, nil
}

// locked runs fn on the connection holding the lock of l's table.
func (s *nftSocket) locked(l *nftLayout, fn func(c NFTConn) error) error {
	unlock, err := s.lock("nftables-" + l.table.Name)
	if err != nil {
		return err
	}
	defer unlock()
	c, done, err := s.conn()
	if err != nil {
		return err
	}
	defer done()
	return fn(c)
}

// nftLayout is where a layout keeps attachments' rules and how it names their owners.
type nftLayout struct {
	id     layoutID // how Objects of the layout name owners and networks
	table  *nftables.Table
	chains []*nftables.Chain           // created when missing (base chains with their hook)
	fixed  map[string][]*nftables.Rule // per chain, rules for everyone, put back when missing
	// key is an owner's identity and ruleKey reads it, with the network's, from a
	// rule; ok is false for rules of no attachment.
	key     func(o Owner) string
	ruleKey func(r *nftables.Rule) (key, net string, ok bool)
	// ownerChains, when set, are the regular chains an attachment has to itself (the
	// reference's macspoofchk), named from its key and listed in jump order: a chain
	// jumps only to later ones. apply creates or flushes them; remove deletes them,
	// after the shared rules that jump to them.
	ownerChains func(key string) []*nftables.Chain
}

// nftState is a dump of a layout's chains.
type nftState struct {
	exists map[string]bool
	rules  []*nftables.Rule // of every chain
}

func (l *nftLayout) what() string {
	return fmt.Sprintf("nftables table %s %s", NFTFamily(l.table.Family), l.table.Name)
}

// read dumps l's chains; a missing table or chain reads as empty and absent.
func (l *nftLayout) read(c NFTConn) (nftState, error) { return l.readChains(c, l.chains) }

// readChains dumps chains; a missing table or chain reads as empty and absent.
func (l *nftLayout) readChains(c NFTConn, chains []*nftables.Chain) (nftState, error) {
	st := nftState{exists: map[string]bool{}}
	for _, ch := range chains {
		// A dump of a missing table or chain is empty, not an error; only an empty
		// dump needs the (cheap) question whether the chain exists.
		rules, err := c.GetRules(l.table, ch)
		if err != nil && !isNoEnt(err) {
			return st, fmt.Errorf("listing chain %s of %s: %w", ch.Name, l.what(), err)
		}
		if len(rules) == 0 {
			if _, err := c.ListChain(l.table, ch.Name); isNoEnt(err) {
				continue
			} else if err != nil {
				return st, fmt.Errorf("looking up chain %s of %s: %w", ch.Name, l.what(), err)
			}
		}
		st.exists[ch.Name] = true
		st.rules = append(st.rules, rules...)
	}
	return st, nil
}

// readOwners dumps the own chains of the attachments keys name (none without
// ownerChains).
func (l *nftLayout) readOwners(c NFTConn, keys []string) (nftState, []*nftables.Chain, error) {
	var chains []*nftables.Chain
	for _, k := range keys {
		if l.ownerChains != nil {
			chains = append(chains, l.ownerChains(k)...)
		}
	}
	st, err := l.readChains(c, chains)
	return st, chains, err
}

// owned returns the rules of st that pick selects by their owner key.
func (l *nftLayout) owned(st nftState, pick func(key, net string) bool) []*nftables.Rule {
	var out []*nftables.Rule
	for _, r := range st.rules {
		if k, n, ok := l.ruleKey(r); ok && pick(k, n) {
			out = append(out, r)
		}
	}
	return out
}

func (l *nftLayout) ownerPick(o Owner) func(key, net string) bool {
	k := l.key(o)
	return func(key, _ string) bool { return key == k }
}

// list dumps the layout's chains and groups their rules by attachment (objects.go).
func (l *nftLayout) list(s *nftSocket, what string) ([]Object, error) {
	c, done, err := s.conn()
	if err != nil {
		return nil, err
	}
	defer done()
	st, err := l.read(c)
	return l.objects(st, what), err
}

// gc removes, in one batch, the attachments Stale picks from list.
func (l *nftLayout) gc(s *nftSocket, network string, keep cniplumb.Owners, ours func(hostIf string) bool) error {
	objs, err := l.list(s, "")
	stale := map[string]bool{}
	for _, o := range Stale(objs, network, keep, ours) {
		stale[o.Key] = true
	}
	if err != nil || len(stale) == 0 {
		return err
	}
	// Another call may have changed the table since: remove goes by key again under
	// the lock, and an attachment added meanwhile is in no stale set.
	return l.remove(s, func(k, _ string) bool { return stale[k] })
}

func (l *nftLayout) fixedMissing(st nftState, chain string) bool {
	have := map[string]int{}
	for _, r := range st.rules {
		if _, _, ok := l.ruleKey(r); !ok && r.Chain.Name == chain {
			have[describeExprs(r.Exprs)]++
		}
	}
	for _, r := range l.fixed[chain] {
		if have[describeExprs(r.Exprs)] == 0 {
			return true
		}
	}
	return false
}

// apply replaces o's rules with add, creating what is missing of the layout (and o's
// own chains). Existing base chains are left alone: adding one again is an update
// that makes the kernel wait for an RCU grace period, more than the rest of the batch
// costs.
func (l *nftLayout) apply(s *nftSocket, o Owner, add []*nftables.Rule) error {
	return s.locked(l, func(c NFTConn) error {
		st, err := l.read(c)
		if err != nil {
			return err
		}
		own, ownChains, err := l.readOwners(c, []string{l.key(o)})
		if err != nil {
			return err
		}
		tableAdded := false
		for _, ch := range l.chains {
			if !st.exists[ch.Name] {
				c.AddTable(l.table)
				c.AddChain(ch)
				tableAdded = true
			}
			if len(l.fixed[ch.Name]) > 0 && (!st.exists[ch.Name] || l.fixedMissing(st, ch.Name)) {
				c.FlushChain(ch)
				for _, r := range l.fixed[ch.Name] {
					c.AddRule(r)
				}
			}
		}
		// o's own chains exist before any rule jumps to them.
		for _, ch := range ownChains {
			if own.exists[ch.Name] {
				c.FlushChain(ch)
				continue
			}
			if !tableAdded {
				c.AddTable(l.table)
				tableAdded = true
			}
			c.AddChain(ch)
		}
		old := l.owned(st, l.ownerPick(o))
		for _, r := range old {
			if err := c.DelRule(r); err != nil {
				return fmt.Errorf("deleting an old rule of %s: %w", o, err)
			}
		}
		for _, r := range add {
			c.AddRule(r)
		}
		return wrapf(c.Flush(), "installing the rules of %s in %s", o, l.what())
	})
}

// remove deletes the rules pick selects in one batch, with the own chains of their
// attachments and of the attachments also names (whose chains may remain without any
// rule in the shared chains: an interrupted teardown). When no attachment's rule is
// left and the table holds nothing but the layout's chains and fixed rules, the
// table goes with them, so a node without pods carries nothing.
func (l *nftLayout) remove(s *nftSocket, pick func(key, net string) bool, also ...string) error {
	return s.locked(l, func(c NFTConn) error {
		st, err := l.read(c)
		if err != nil {
			return err
		}
		gone := l.owned(st, pick)
		keys := slices.Clone(also)
		for _, r := range gone {
			if k, _, _ := l.ruleKey(r); !slices.Contains(keys, k) {
				keys = append(keys, k)
			}
		}
		own, ownChains, err := l.readOwners(c, keys)
		if err != nil {
			return err
		}
		if len(gone) == 0 && len(own.exists) == 0 {
			return nil
		}
		if l.onlyThese(c, st, len(gone), len(own.exists)) && l.sameAgain(c, st) {
			// Under the lock no podwire process adds to the table meanwhile. Another
			// program could (the reference plugin takes no lock of ours): its rule would
			// go with the table if it landed between the dump and this batch.
			c.DelTable(l.table)
		} else {
			for _, r := range gone {
				if err := c.DelRule(r); err != nil {
					return err
				}
			}
			// In jump order: deleting a chain deletes its rules, and with them the
			// references to the chains after it.
			for _, ch := range ownChains {
				if own.exists[ch.Name] {
					c.DelChain(ch)
				}
			}
		}
		return wrapf(c.Flush(), "removing rules from %s", l.what())
	})
}

// sameAgain dumps the layout's chains once more and reports whether they hold the
// same rules as st. Deleting the table deletes everything in it, so it is decided on
// two dumps: a dump that the ruleset's changes interrupted (NLM_F_DUMP_INTR, which
// google/nftables does not report) can miss rules, and another attachment's rule it
// missed would go with the table.
func (l *nftLayout) sameAgain(c NFTConn, st nftState) bool {
	again, err := l.read(c)
	if err != nil || len(again.rules) != len(st.rules) {
		return false
	}
	for i, r := range again.rules {
		if r.Handle != st.rules[i].Handle || r.Chain.Name != st.rules[i].Chain.Name {
			return false
		}
	}
	return true
}

// onlyThese reports whether the table would hold nothing of anyone's once the gone
// rules are deleted: no other attachment's rule, no rule but the fixed ones, no
// chain but the layout's and the ownChains of the attachments going.
func (l *nftLayout) onlyThese(c NFTConn, st nftState, gone, ownChains int) bool {
	owned, fixed := 0, 0
	for _, r := range st.rules {
		if _, _, ok := l.ruleKey(r); ok {
			owned++
		}
	}
	for _, rs := range l.fixed {
		fixed += len(rs)
	}
	if owned != gone || len(st.rules)-owned > fixed {
		return false
	}
	t, err := c.ListTableOfFamily(l.table.Name, l.table.Family)
	if err != nil {
		return false
	}
	// google/nftables v0.3.0 decodes NFTA_TABLE_USE in host byte order instead of
	// network order; either reading is accepted, so a fixed library keeps working.
	n := uint32(len(l.chains) + ownChains)
	return t.Use == n || binaryutil.BigEndian.Uint32(binaryutil.NativeEndian.PutUint32(t.Use)) == n
}

// check compares o's rules with want by chain and what they do (describeExprs; the
// chain matters, as prerouting and output hold the same rules for different traffic),
// and the layout's fixed rules. None of o's is IsNotFound. It holds the table's lock,
// so no podwire process changes the table during the dump, and a verdict other than
// "as wanted" is given only on two equal dumps: google/nftables does not report a
// dump that another program's changes interrupted (NLM_F_DUMP_INTR), and such a dump
// can miss rules.
func (l *nftLayout) check(s *nftSocket, o Owner, want []*nftables.Rule) error {
	return s.locked(l, func(c NFTConn) error {
		var err error
		for range 3 {
			st, rerr := l.read(c)
			if rerr != nil {
				return rerr
			}
			own, _, rerr := l.readOwners(c, []string{l.key(o)})
			if rerr != nil {
				return rerr
			}
			if err = l.compare(st, own, o, want); err == nil || l.sameAgain(c, st) {
				return err
			}
		}
		return err
	})
}

// compare is check's verdict on one dump: st of the layout's chains, own of o's own.
func (l *nftLayout) compare(st, own nftState, o Owner, want []*nftables.Rule) error {
	st.rules = append(slices.Clip(st.rules), own.rules...)
	text := func(r *nftables.Rule) string { return r.Chain.Name + ": " + describeExprs(r.Exprs) }
	have := map[string]int{}
	mine := l.owned(st, l.ownerPick(o))
	for _, r := range mine {
		have[text(r)]++
	}
	if len(mine) == 0 {
		return notFound("%s holds no rule of %s", l.what(), o)
	}
	for _, r := range want {
		d := text(r)
		if have[d] == 0 {
			return fmt.Errorf("%s lacks the rule %q of %s; run DEL and ADD again", l.what(), d, o)
		}
		have[d]--
	}
	for d, n := range have {
		if n > 0 {
			return fmt.Errorf("%s holds a rule of %s its configuration does not ask for (%q); run DEL and ADD again", l.what(), o, d)
		}
	}
	for ch := range l.fixed {
		if l.fixedMissing(st, ch) {
			return fmt.Errorf("chain %s of %s lacks its shared rules; run DEL and ADD again", ch, l.what())
		}
	}
	return nil
}

// isNoEnt recognizes ENOENT from google/nftables, which does not always wrap the errno.
func isNoEnt(err error) bool {
	return err != nil && (errors.Is(err, unix.ENOENT) || strings.Contains(err.Error(), "no such file or directory"))
}
