// SPDX-License-Identifier: Apache-2.0

package netfilter

import (
	"context"
	"fmt"
	"net"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"

	"github.com/podwire/podwire/pkg/cniplumb"
)

// ipMasq in the reference's nftables layout (masquerade.go), with the bytecode the nft
// tool generates for the reference's rule text, on the engine of nft_layout.go.

const masqNFTChecks = "masq_checks"

var nfprotos = map[Family]byte{IPv4: unix.NFPROTO_IPV4, IPv6: unix.NFPROTO_IPV6}

// nfproto matches the packet's family (the dependency nft adds before "ip"/"ip6"
// matches in an inet table).
func nfproto(f Family) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{nfprotos[f]}}}
}

// addrField returns the network-header offset and length of the source or destination
// address of family f.
func addrField(f Family, dst bool) (off, n uint32) {
	off, n = 12, 4
	if f == IPv6 {
		off, n = 8, 16
	}
	if dst {
		off += n
	}
	return off, n
}

// nftPrefixMatch compares an address field with p (neg: "!=") as nft compiles "ip
// daddr <p>": a byte-aligned prefix loads just its bytes; any other loads the whole
// address and masks it.
func nftPrefixMatch(dst bool, p netip.Prefix, neg bool) []expr.Any {
	op := expr.CmpOpEq
	if neg {
		op = expr.CmpOpNeq
	}
	f := FamilyOf(p.Addr())
	off, n := addrField(f, dst)
	p = p.Masked()
	full := addrBytes(p.Addr())
	bits := p.Bits()
	if bits > 0 && bits%8 == 0 {
		k := uint32(bits / 8)
		return []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: k},
			&expr.Cmp{Op: op, Register: 1, Data: full[:k]},
		}
	}
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: n, Mask: net.CIDRMask(bits, int(n*8)), Xor: make([]byte, n)},
		&expr.Cmp{Op: op, Register: 1, Data: full},
	}
}

// masqNFTPostRules are postrouting's three rules: multicast returns (in both
// families), everything else goes to masq_checks.
func masqNFTPostRules(t *nftables.Table, post *nftables.Chain) []*nftables.Rule {
	var out []*nftables.Rule
	for _, f := range []Family{IPv4, IPv6} {
		e := append(nfproto(f), nftPrefixMatch(true, multicast[f], false)...)
		e = append(e, &expr.Verdict{Kind: expr.VerdictReturn})
		out = append(out, &nftables.Rule{Table: t, Chain: post, Exprs: e})
	}
	return append(out, &nftables.Rule{Table: t, Chain: post, Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictGoto, Chain: masqNFTChecks}}})
}

// masqNFTRuleExprs is "ip saddr <a> ip daddr != <subnet of a> masquerade" (ip6 for
// IPv6 addresses).
func masqNFTRuleExprs(a netip.Prefix) []expr.Any {
	e := nfproto(FamilyOf(a.Addr()))
	e = append(e, nftPrefixMatch(false, hostPrefix(a.Addr()), false)...)
	e = append(e, nftPrefixMatch(true, a.Masked(), true)...)
	return append(e, &expr.Masq{})
}

// masqNFTRules are o's masq_checks rules for p, in p's address order.
func masqNFTRules(t *nftables.Table, checks *nftables.Chain, p MasqPlan) []*nftables.Rule {
	ud := userdata.AppendString(nil, userdata.TypeComment, masqNFTComment(p.Owner))
	var out []*nftables.Rule
	for _, a := range p.Addrs {
		out = append(out, &nftables.Rule{Table: t, Chain: checks, Exprs: masqNFTRuleExprs(a), UserData: ud})
	}
	return out
}

func ruleComment(r *nftables.Rule) string {
	s, _ := userdata.GetString(r.UserData, userdata.TypeComment)
	return s
}

// masqLayout is the reference's table: masq_checks holds one rule per pod address,
// commented with the owner's instance hash first; the base chain postrouting (nat,
// priority srcnat, policy accept) holds three shared rules.
func masqLayout() *nftLayout {
	t := &nftables.Table{Name: "cni_plugins_masquerade", Family: nftables.TableFamilyINet}
	accept := nftables.ChainPolicyAccept
	checks := &nftables.Chain{Name: masqNFTChecks, Table: t}
	post := &nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept}
	return &nftLayout{
		id:     byMasqNFT,
		table:  t,
		chains: []*nftables.Chain{checks, post},
		fixed:  map[string][]*nftables.Rule{post.Name: masqNFTPostRules(t, post)},
		key:    masqInstance,
		// Rules are matched on the hashes at the start of their comment, so a comment
		// the reference cut at 128 bytes is still exact.
		ruleKey: func(r *nftables.Rule) (string, string, bool) {
			c := ruleComment(r)
			if len(c) < masqInstanceLen || c[16] != '-' {
				return "", "", false
			}
			return c[:masqInstanceLen], c[:16], true
		},
	}
}

// MasqNFTables is the nftables MasqBackend: the reference's table inet
// cni_plugins_masquerade (masquerade.go). The table and its chains are created when
// missing without the reference's object comments (google/nftables cannot write
// them; the reference does not read them), and deleted with the last masquerade rule
// (the reference leaves them).
type MasqNFTables struct {
	s *nftSocket
}

var _ MasqBackend = (*MasqNFTables)(nil)

// Apply implements MasqBackend: a repeated ADD replaces the owner's rules.
func (b *MasqNFTables) Apply(_ context.Context, p MasqPlan) error {
	if err := p.Validate(); err != nil {
		return err
	}
	l := masqLayout()
	return l.apply(b.s, p.Owner, masqNFTRules(l.table, l.chains[0], p))
}

// Check implements MasqBackend.
func (b *MasqNFTables) Check(_ context.Context, p MasqPlan) error {
	l := masqLayout()
	return l.check(b.s, p.Owner, masqNFTRules(l.table, l.chains[0], p))
}

// Remove implements MasqBackend; addrs do not matter here (rules carry the interface
// name in their comment hash).
func (b *MasqNFTables) Remove(_ context.Context, o Owner, _ []netip.Prefix) error {
	l := masqLayout()
	return l.remove(b.s, l.ownerPick(o))
}

// GC implements MasqBackend.
func (b *MasqNFTables) GC(_ context.Context, network string, keep cniplumb.Owners) error {
	return masqLayout().gc(b.s, network, keep, nil)
}

// xtablesChainExists reports whether iptables-nft has chain in its nat table of fam
// (table ip nat or ip6 nat): one netlink request, no exec.
func (b *MasqNFTables) xtablesChainExists(fam Family, chain string) (bool, error) {
	c, done, err := b.s.conn()
	if err != nil {
		return false, err
	}
	defer done()
	// Table families are the NFPROTO_ numbers.
	_, err = c.ListChain(&nftables.Table{Name: "nat", Family: nftables.TableFamily(nfprotos[fam])}, chain)
	if err == nil || isNoEnt(err) {
		return err == nil, nil
	}
	return false, fmt.Errorf("looking up chain %s in the %s nat table of iptables-nft: %w", chain, fam, err)
}
