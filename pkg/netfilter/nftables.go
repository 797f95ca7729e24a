// SPDX-License-Identifier: Apache-2.0

package netfilter

import (
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// This file renders rules as nftables expressions and reads tags back from rule
// userdata. It is pure; the netlink side is in nft_layout.go.

// TableName is the nftables table of feature f: inet podwire_<name>.
func TableName(f Feature) string { return "podwire_" + f.Name }

var nftHooks = map[string]nftables.ChainHook{
	"prerouting":  unix.NF_INET_PRE_ROUTING,
	"input":       unix.NF_INET_LOCAL_IN,
	"forward":     unix.NF_INET_FORWARD,
	"output":      unix.NF_INET_LOCAL_OUT,
	"postrouting": unix.NF_INET_POST_ROUTING,
}

// nftChain is the base chain of hook h in table t; its name is the hook's name.
// Plan.Validate refuses hooks nftHooks does not know.
func nftChain(t *nftables.Table, h Hook) *nftables.Chain {
	typ := nftables.ChainTypeFilter
	if h.Type == "nat" {
		typ = nftables.ChainTypeNAT
	}
	accept := nftables.ChainPolicyAccept
	return &nftables.Chain{
		Name: h.Name, Table: t, Type: typ,
		Hooknum: nftables.ChainHookRef(nftHooks[h.Name]), Priority: nftables.ChainPriorityRef(nftables.ChainPriority(h.Priority)),
		Policy: &accept,
	}
}

// encodeTag stores t as the rule's comment, in the userdata format the nft tool
// reads, so `nft list ruleset` shows it.
func encodeTag(t Tag) []byte { return userdata.AppendString(nil, userdata.TypeComment, t.String()) }

func addrBytes(a netip.Addr) []byte { return a.Unmap().AsSlice() }

var protoNums = map[Proto]byte{TCP: unix.IPPROTO_TCP, UDP: unix.IPPROTO_UDP, SCTP: unix.IPPROTO_SCTP}

// ifnameBytes is an interface name as the kernel compares it: NUL-padded to IFNAMSIZ.
func ifnameBytes(s string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, s)
	return b
}

// nftExprs renders r as expressions for an inet table.
func nftExprs(r Rule) ([]expr.Any, error) {
	var e []expr.Any
	m := r.Match
	if r.Family != AnyFamily {
		e = append(e, nfproto(r.Family)...)
	}
	if m.InIface != "" {
		e = append(e, &expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifnameBytes(m.InIface)})
	}
	if m.Src.IsValid() {
		e = append(e, nftPrefixMatch(false, m.Src, m.NotSrc)...)
	}
	if m.Dst.IsValid() {
		e = append(e, nftPrefixMatch(true, m.Dst, m.NotDst)...)
	}
	if m.DstLocal {
		e = append(e, &expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)})
	}
	if m.Proto != "" {
		e = append(e, &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{protoNums[m.Proto]}})
	}
	if m.DstPort != 0 {
		e = append(e, &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(m.DstPort)})
	}
	if m.Mark != 0 {
		mark := binaryutil.NativeEndian.PutUint32(m.Mark)
		e = append(e, &expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mark, Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: mark})
	}
	switch a := r.Action; a.Kind {
	case Return:
		e = append(e, &expr.Verdict{Kind: expr.VerdictReturn})
	case Accept:
		e = append(e, &expr.Verdict{Kind: expr.VerdictAccept})
	case Drop:
		e = append(e, &expr.Verdict{Kind: expr.VerdictDrop})
	case Masquerade:
		e = append(e, &expr.Masq{})
	case DNAT:
		nat := &expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(nfprotos[r.Family]), RegAddrMin: 1}
		e = append(e, &expr.Immediate{Register: 1, Data: addrBytes(a.Addr)})
		if a.Port != 0 {
			e = append(e, &expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(a.Port)})
			nat.RegProtoMin, nat.Specified = 2, true
		}
		e = append(e, nat)
	case SetMark:
		e = append(e, &expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
				Mask: binaryutil.NativeEndian.PutUint32(^a.Mark), Xor: binaryutil.NativeEndian.PutUint32(a.Mark)},
			&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1})
	case Jump:
		return nil, fmt.Errorf("rule %q: nftables cannot jump into the iptables chain %s; use the iptables backend", r, a.Chain)
	default:
		return nil, fmt.Errorf("rule %q: no nftables statement for action %d", r, a.Kind)
	}
	return e, nil
}
