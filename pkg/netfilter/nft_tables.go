// SPDX-License-Identifier: Apache-2.0

package netfilter

import (
	"context"
	"slices"

	"github.com/google/nftables"

	"github.com/podwire/podwire/pkg/cniplumb"
)

// NFTables is the backend of podwire's own nftables tables: each Feature lives in a
// table podwire_<feature> with one base chain per hook, created with the first rule
// and deleted with the last; every rule carries its owner's Tag as comment.
type NFTables struct {
	s *nftSocket
}

// NewNFTablesOn returns the backend on the connection c (a fake kernel in tests),
// without podwire's lock files.
func NewNFTablesOn(c NFTConn) *NFTables { return &NFTables{s: nftSocketOn(c)} }

// Close releases the netlink socket; the backend may be used again afterwards.
func (b *NFTables) Close() error { return b.s.Close() }

// featureLayout is f's table: a base chain per hook, owners named by their tags.
func featureLayout(f Feature) *nftLayout {
	t := &nftables.Table{Name: TableName(f), Family: nftables.TableFamilyINet}
	l := &nftLayout{
		id:    byTag,
		table: t,
		key:   tagKey,
		ruleKey: func(r *nftables.Rule) (string, string, bool) {
			tag, ok := ParseTag(ruleComment(r))
			return string(tag.ID), tag.NetworkHash, ok
		},
	}
	for _, h := range f.Hooks {
		l.chains = append(l.chains, nftChain(t, h))
	}
	return l
}

// render validates p and turns it into f's table's rules, each tagged.
func (p Plan) render() (*nftLayout, []*nftables.Rule, error) {
	if err := p.Validate(); err != nil {
		return nil, nil, err
	}
	l := featureLayout(p.Feature)
	var out []*nftables.Rule
	for _, r := range p.Rules {
		ex, err := nftExprs(r)
		if err != nil {
			return nil, nil, err
		}
		ch := l.chains[slices.Index(p.Feature.Hooks, r.Hook)] // one chain per hook, in order
		out = append(out, &nftables.Rule{Table: l.table, Chain: ch, Exprs: ex, UserData: encodeTag(tagFor(p.Owner, r))})
	}
	return l, out, nil
}

// Apply installs p, replacing whatever p.Owner had in p.Feature. An invalid plan
// fails before anything changes.
func (b *NFTables) Apply(_ context.Context, p Plan) error {
	l, rules, err := p.render()
	if err != nil {
		return err
	}
	return l.apply(b.s, p.Owner, rules)
}

// Check reports an error when the owner's rules differ from p (missing, extra or
// changed); IsNotFound tells the missing case.
func (b *NFTables) Check(_ context.Context, p Plan) error {
	l, rules, err := p.render()
	if err != nil {
		return err
	}
	return l.check(b.s, p.Owner, rules)
}

// Remove deletes every rule of o in f; nothing to remove is success.
func (b *NFTables) Remove(_ context.Context, f Feature, o Owner) error {
	l := featureLayout(f)
	return l.remove(b.s, l.ownerPick(o))
}

// GC removes, in one batch, the rules in f of every attachment of network that keep
// does not hold.
func (b *NFTables) GC(_ context.Context, f Feature, network string, keep cniplumb.Owners) error {
	return featureLayout(f).gc(b.s, network, keep, nil)
}
