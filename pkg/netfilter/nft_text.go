// SPDX-License-Identifier: Apache-2.0

package netfilter

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// NFTFamily is the nft tool's name of a table family.
func NFTFamily(f nftables.TableFamily) string {
	if s, ok := nftFamilies[f]; ok {
		return s
	}
	return strconv.Itoa(int(f))
}

var nftFamilies = map[nftables.TableFamily]string{nftables.TableFamilyINet: "inet",
	nftables.TableFamilyIPv4: "ip", nftables.TableFamilyIPv6: "ip6", nftables.TableFamilyBridge: "bridge"}

// DescribeRule is describeExprs of r followed by its comment, for messages and
// readable golden tests.
func DescribeRule(r *nftables.Rule) string {
	s := describeExprs(r.Exprs)
	if c := ruleComment(r); c != "" {
		s += " # " + c
	}
	return s
}

// describeExprs renders rule expressions in nft's words for the shapes this package
// writes (an expression it does not know shows as its Go type): what CHECK compares.
func describeExprs(es []expr.Any) string {
	var out []string
	load, fam, mask := "", "", []byte(nil)
	regs := map[uint32][]byte{}
	for _, e := range es {
		switch x := e.(type) {
		case *expr.Meta:
			if x.SourceRegister {
				out = append(out, "meta mark set meta mark & "+hexWord(mask)+" | "+hexWord(regs[0]))
				load, mask = "", nil
				continue
			}
			names := map[expr.MetaKey]string{expr.MetaKeyNFPROTO: "meta nfproto", expr.MetaKeyL4PROTO: "meta l4proto",
				expr.MetaKeyIIFNAME: "iifname", expr.MetaKeyMARK: "meta mark"}
			load, mask = names[x.Key], nil
		case *expr.Payload:
			load, mask = payloadName(x, fam), nil
		case *expr.Bitwise:
			mask, regs[0] = x.Mask, x.Xor
		case *expr.Fib:
			load = "fib daddr type"
		case *expr.Cmp:
			op := map[expr.CmpOp]string{expr.CmpOpEq: "", expr.CmpOpNeq: "!= "}[x.Op]
			v := cmpValue(load, x.Data, mask)
			if load == "meta nfproto" {
				fam = v
			}
			out = append(out, load+" "+op+v)
			load, mask = "", nil
		case *expr.Immediate:
			regs[x.Register] = x.Data
		case *expr.NAT:
			to := cmpValue("ip daddr", regs[x.RegAddrMin], nil)
			if x.Specified {
				to = netip.AddrPortFrom(netip.MustParseAddr(to), binary.BigEndian.Uint16(regs[x.RegProtoMin])).String()
			}
			out = append(out, "dnat to "+to)
		case *expr.Masq:
			out = append(out, "masquerade")
		case *expr.Verdict:
			v := map[expr.VerdictKind]string{expr.VerdictAccept: "accept", expr.VerdictDrop: "drop",
				expr.VerdictReturn: "return", expr.VerdictGoto: "goto", expr.VerdictJump: "jump"}[x.Kind]
			out = append(out, strings.TrimSpace(v+" "+x.Chain))
		case *expr.Counter:
			out = append(out, "counter")
		default:
			out = append(out, fmt.Sprintf("%T", e))
		}
	}
	return strings.Join(out, " ")
}

func payloadName(p *expr.Payload, fam string) string {
	ip := map[string]string{"ipv4": "ip", "ipv6": "ip6"}[fam]
	switch {
	case p.Base == expr.PayloadBaseLLHeader && p.Offset == 6:
		return "ether saddr"
	case p.Base == expr.PayloadBaseTransportHeader && p.Offset == 2:
		return "th dport"
	case p.Base == expr.PayloadBaseNetworkHeader && (p.Offset == 12 || p.Offset == 8):
		return ip + " saddr"
	case p.Base == expr.PayloadBaseNetworkHeader:
		return ip + " daddr"
	}
	return fmt.Sprintf("payload(%d,%d,%d)", p.Base, p.Offset, p.Len)
}

// cmpValue renders compared data for what was loaded.
func cmpValue(load string, data, mask []byte) string {
	switch {
	case load == "meta nfproto":
		return map[byte]string{unix.NFPROTO_IPV4: "ipv4", unix.NFPROTO_IPV6: "ipv6"}[data[0]]
	case load == "meta l4proto":
		return map[byte]string{unix.IPPROTO_TCP: "tcp", unix.IPPROTO_UDP: "udp", unix.IPPROTO_SCTP: "sctp"}[data[0]]
	case load == "iifname":
		return strconv.Quote(strings.TrimRight(string(data), "\x00"))
	case load == "th dport":
		return strconv.Itoa(int(binary.BigEndian.Uint16(data)))
	case load == "fib daddr type" && binary.NativeEndian.Uint32(data) == unix.RTN_LOCAL:
		return "local"
	case load == "meta mark":
		return "& " + hexWord(mask) + " == " + hexWord(data)
	case load == "ether saddr":
		return net.HardwareAddr(data).String()
	case strings.HasSuffix(load, "addr"):
		full := 4
		if strings.HasPrefix(load, "ip6") || len(data) == 16 {
			full = 16
		}
		buf := make([]byte, full)
		copy(buf, data)
		a, _ := netip.AddrFromSlice(buf)
		bits := len(data) * 8
		if mask != nil {
			bits, _ = net.IPMask(mask).Size()
		}
		if bits == full*8 {
			return a.String()
		}
		return netip.PrefixFrom(a, bits).String()
	}
	return hex.EncodeToString(data)
}

func hexWord(b []byte) string {
	if len(b) != 4 {
		return hex.EncodeToString(b)
	}
	return fmt.Sprintf("%#x", binary.NativeEndian.Uint32(b))
}
