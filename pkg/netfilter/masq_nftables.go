package netfilter

import (
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"

	"github.com/podwire/podwire/pkg/cniplumb"
)

// This file renders ipMasq in the reference's nftables layout (see masquerade.go) as
// google/nftables objects, with the same bytecode the nft tool generates for the
// reference's rule text, and reads rules back. It is pure; the netlink side is in
// masq_nftables_linux.go.

// The reference's nftables objects.
const (
	masqNFTTableName = "cni_plugins_masquerade"
	masqNFTChecks    = "masq_checks"
	masqNFTPost      = "postrouting"
)

func masqNFTTable() *nftables.Table {
	return &nftables.Table{Name: masqNFTTableName, Family: nftables.TableFamilyINet}
}

// masqNFTChains returns the regular chain masq_checks and the base chain postrouting
// (nat, hook postrouting, priority srcnat = 100, policy accept).
func masqNFTChains(t *nftables.Table) (checks, post *nftables.Chain) {
	accept := nftables.ChainPolicyAccept
	return &nftables.Chain{Name: masqNFTChecks, Table: t},
		&nftables.Chain{Name: masqNFTPost, Table: t, Type: nftables.ChainTypeNAT,
			Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept}
}

// nfproto matches the packet's family (the dependency nft adds before "ip"/"ip6"
// matches in an inet table).
func nfproto(f Family) []expr.Any {
	p := byte(unix.NFPROTO_IPV4)
	if f == IPv6 {
		p = unix.NFPROTO_IPV6
	}
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}}}
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

// nftPrefixMatch compares an address field with p as nft compiles "ip daddr <p>": a
// byte-aligned prefix loads just its bytes; any other loads the whole address and
// masks it.
func nftPrefixMatch(dst bool, p netip.Prefix, op expr.CmpOp) []expr.Any {
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
		e := append(nfproto(f), nftPrefixMatch(true, multicastOf(f), expr.CmpOpEq)...)
		e = append(e, &expr.Verdict{Kind: expr.VerdictReturn})
		out = append(out, &nftables.Rule{Table: t, Chain: post, Exprs: e})
	}
	return append(out, &nftables.Rule{Table: t, Chain: post, Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictGoto, Chain: masqNFTChecks}}})
}

// masqNFTRuleExprs is "ip saddr <a> ip daddr != <subnet of a> masquerade" (ip6 for
// IPv6 addresses).
func masqNFTRuleExprs(a netip.Prefix) []expr.Any {
	e := nfproto(FamilyOf(a.Addr()))
	e = append(e, nftPrefixMatch(false, hostPrefix(a.Addr()), expr.CmpOpEq)...)
	e = append(e, nftPrefixMatch(true, a.Masked(), expr.CmpOpNeq)...)
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

// ruleComment returns a rule's comment ("" when it has none).
func ruleComment(r *nftables.Rule) string {
	s, _ := userdata.GetString(r.UserData, userdata.TypeComment)
	return s
}

// isGotoChecks reports whether a postrouting rule is the reference's "goto masq_checks".
func isGotoChecks(r *nftables.Rule) bool {
	if len(r.Exprs) == 0 {
		return false
	}
	v, ok := r.Exprs[len(r.Exprs)-1].(*expr.Verdict)
	return ok && v.Kind == expr.VerdictGoto && v.Chain == masqNFTChecks
}

// describeMasqNFT reads a masq_checks rule back as "<src> != <subnet>" (the form
// masqNFTWant produces), or "" when it is not a masquerade of that shape.
func describeMasqNFT(r *nftables.Rule) string {
	fam := Family(0)
	var src netip.Addr
	var dst netip.Prefix
	masq := false
	var load *expr.Payload
	var mask []byte
	for _, e := range r.Exprs {
		switch x := e.(type) {
		case *expr.Meta:
			load = nil
		case *expr.Payload:
			load, mask = x, nil
		case *expr.Bitwise:
			mask = x.Mask
		case *expr.Cmp:
			if load == nil {
				if len(x.Data) == 1 && x.Data[0] == unix.NFPROTO_IPV4 {
					fam = IPv4
				} else if len(x.Data) == 1 && x.Data[0] == unix.NFPROTO_IPV6 {
					fam = IPv6
				}
				continue
			}
			if fam == 0 || load.Base != expr.PayloadBaseNetworkHeader {
				return ""
			}
			soff, n := addrField(fam, false)
			doff, _ := addrField(fam, true)
			buf := make([]byte, n)
			copy(buf, x.Data)
			a, _ := netip.AddrFromSlice(buf)
			bits := int(load.Len) * 8
			if mask != nil {
				ones, _ := net.IPMask(mask).Size()
				bits = ones
			}
			switch {
			case load.Offset == soff && x.Op == expr.CmpOpEq && bits == int(n*8):
				src = a
			case load.Offset == doff && x.Op == expr.CmpOpNeq:
				dst = netip.PrefixFrom(a, bits)
			default:
				return ""
			}
			load = nil
		case *expr.Masq:
			masq = true
		case *expr.Counter:
		default:
			return ""
		}
	}
	if !masq || !src.IsValid() || !dst.IsValid() {
		return ""
	}
	return src.String() + " != " + dst.String()
}

// masqNFTWant is what describeMasqNFT returns for each of p's rules.
func masqNFTWant(p MasqPlan) []string {
	var out []string
	for _, a := range p.Addrs {
		out = append(out, a.Addr().String()+" != "+a.Masked().String())
	}
	return out
}

// checkMasqNFT compares the masq_checks rules (and whether postrouting leads there)
// with p: no rule of p's owner is IsNotFound; a missing one is an error naming it.
func checkMasqNFT(p MasqPlan, checks []*nftables.Rule, postOK bool) error {
	inst := masqInstance(p.Owner)
	have := map[string]bool{}
	n := 0
	for _, r := range checks {
		if strings.HasPrefix(ruleComment(r), inst) {
			have[describeMasqNFT(r)] = true
			n++
		}
	}
	if n == 0 {
		return notFound("no rule of %s in nftables chain inet %s %s", p.Owner, masqNFTTableName, masqNFTChecks)
	}
	for _, w := range masqNFTWant(p) {
		if !have[w] {
			return fmt.Errorf("nftables rule \"ip saddr %s masquerade\" of %s is missing; run DEL and ADD again", strings.Replace(w, " != ", " daddr != ", 1), p.Owner)
		}
	}
	if !postOK {
		return fmt.Errorf("nftables chain inet %s %s does not goto %s; run DEL and ADD again", masqNFTTableName, masqNFTPost, masqNFTChecks)
	}
	return nil
}

// selectMasqNFT returns the masq_checks rules to delete: those of o (the comment
// starts with its instance hash).
func selectMasqNFT(rules []*nftables.Rule, o Owner) []*nftables.Rule {
	inst := masqInstance(o)
	var out []*nftables.Rule
	for _, r := range rules {
		if strings.HasPrefix(ruleComment(r), inst) {
			out = append(out, r)
		}
	}
	return out
}

// staleMasqNFT returns the masq_checks rules of network's attachments that keep does
// not hold. Rules are matched on the hashes at the start of their comment, so a
// comment the reference cut at 128 bytes is still exact.
func staleMasqNFT(rules []*nftables.Rule, network string, keep cniplumb.Owners) []*nftables.Rule {
	valid := map[string]bool{}
	for o := range keep {
		if o.Network == network {
			valid[masqInstance(o)] = true
		}
	}
	prefix := masqNetHash(network) + "-"
	var out []*nftables.Rule
	for _, r := range rules {
		c := ruleComment(r)
		if len(c) < masqInstanceLen || !strings.HasPrefix(c, prefix) || valid[c[:masqInstanceLen]] {
			continue
		}
		out = append(out, r)
	}
	return out
}
