package netfilter

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// This file is the rule codec of the direct iptables-nft path (xtnft_linux.go): the
// iptables rule specifications podwire writes, parsed from their `iptables -S` text,
// encoded as the nf_tables expressions iptables-nft itself stores for them, and decoded
// back into the text `iptables -S` prints. It covers only what podwire's iptables
// backends write (and what the reference plugins write into the chains podwire
// shares); anything else is reported as unsupported, and the caller runs the iptables
// binaries instead. The encodings are those of iptables 1.8.9 (nf_tables); the direct
// path is used only where the installed iptables was seen storing exactly the same
// expressions for the same rules (the self-check in xtnft_linux.go).

// errXTUnsupported marks a rule the codec does not handle.
var errXTUnsupported = errors.New("not handled by the direct iptables-nft path")

func unsupported(format string, a ...any) error {
	return fmt.Errorf("%w: %s", errXTUnsupported, fmt.Sprintf(format, a...))
}

// xtSpec is one iptables rule specification (what follows "-A <chain>").
type xtSpec struct {
	src, dst       netip.Prefix
	notSrc, notDst bool
	in             string // "-i"; a trailing "+" is a wildcard
	notIn          bool
	proto          string // "tcp", "udp" or ""
	matches        []xtMatch
	target         xtTarget
}

type xtMatch struct {
	kind    string // tcp, udp (--dport), multiport (--dports), comment, addrtype (--dst-type LOCAL), mark
	port    uint16
	ports   []uint16
	comment string
	mark    uint32
	mask    uint32
}

type xtTarget struct {
	kind  string // "" (none), verdict (ACCEPT, RETURN, DROP), jump, DNAT, MARK, MASQUERADE
	name  string // verdict or chain
	addr  netip.Addr
	port  uint16
	mark  uint32
	mask  uint32
	valid bool
}

var xtProtoNums = map[string]uint8{"tcp": unix.IPPROTO_TCP, "udp": unix.IPPROTO_UDP}

// parseXTSpec parses rule arguments as podwire writes them (and `iptables -S` prints
// them).
func parseXTSpec(fam Family, args []string) (xtSpec, error) {
	var s xtSpec
	neg := false
	var cur *xtMatch
	next := func(i *int, opt string) (string, error) {
		if *i+1 >= len(args) {
			return "", fmt.Errorf("option %s needs a value", opt)
		}
		*i++
		return args[*i], nil
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "!" {
			neg = true
			continue
		}
		wasNeg := neg
		neg = false
		switch a {
		case "-s", "-d":
			v, err := next(&i, a)
			if err != nil {
				return s, err
			}
			p, err := parseXTPrefix(fam, v)
			if err != nil {
				return s, err
			}
			if a == "-s" {
				s.src, s.notSrc = p, wasNeg
			} else {
				s.dst, s.notDst = p, wasNeg
			}
			continue
		case "-i":
			v, err := next(&i, a)
			if err != nil {
				return s, err
			}
			if v == "" || len(v) > unix.IFNAMSIZ-1 {
				return s, unsupported("interface %q", v)
			}
			s.in, s.notIn = v, wasNeg
			continue
		case "-p":
			v, err := next(&i, a)
			if err != nil {
				return s, err
			}
			if _, ok := xtProtoNums[v]; !ok || wasNeg {
				return s, unsupported("protocol %q", v)
			}
			s.proto = v
			continue
		case "-m":
			v, err := next(&i, a)
			if err != nil {
				return s, err
			}
			switch v {
			case "tcp", "udp":
				if v != s.proto {
					return s, unsupported("match %s for protocol %q", v, s.proto)
				}
			case "multiport":
				if s.proto == "" {
					return s, unsupported("multiport without a protocol")
				}
			case "comment", "addrtype", "mark":
			default:
				return s, unsupported("match %q", v)
			}
			s.matches = append(s.matches, xtMatch{kind: v})
			cur = &s.matches[len(s.matches)-1]
			continue
		case "-j":
			v, err := next(&i, a)
			if err != nil {
				return s, err
			}
			if wasNeg || s.target.valid {
				return s, unsupported("-j")
			}
			s.target = xtTarget{valid: true, name: v}
			switch v {
			case "ACCEPT", "RETURN", "DROP":
				s.target.kind = "verdict"
			case "DNAT", "MARK", "MASQUERADE":
				s.target.kind = v
			default:
				if !validChainName(v) {
					return s, unsupported("target %q", v)
				}
				s.target.kind = "jump"
			}
			cur = nil
			continue
		}
		if wasNeg {
			return s, unsupported("negated %s", a)
		}
		v, err := next(&i, a)
		if err != nil {
			return s, err
		}
		switch {
		case s.target.valid && s.target.kind == "DNAT" && a == "--to-destination":
			if s.target.addr, s.target.port, err = parseXTDest(fam, v); err != nil {
				return s, err
			}
		case s.target.valid && s.target.kind == "MARK" && a == "--set-xmark":
			if s.target.mark, s.target.mask, err = parseMarkMask(v); err != nil {
				return s, err
			}
		case s.target.valid:
			return s, unsupported("target option %s", a)
		case cur == nil:
			return s, unsupported("option %s", a)
		case (cur.kind == "tcp" || cur.kind == "udp") && a == "--dport":
			n, err := strconv.ParseUint(v, 10, 16)
			if err != nil || n == 0 {
				return s, unsupported("port %q", v)
			}
			cur.port = uint16(n)
		case cur.kind == "multiport" && a == "--dports":
			for _, p := range strings.Split(v, ",") {
				n, err := strconv.ParseUint(p, 10, 16)
				if err != nil || n == 0 {
					return s, unsupported("port %q", p)
				}
				cur.ports = append(cur.ports, uint16(n))
			}
			if len(cur.ports) > multiportMax {
				return s, unsupported("%d ports in one multiport match", len(cur.ports))
			}
		case cur.kind == "comment" && a == "--comment":
			if len(v) > 255 {
				return s, unsupported("comment longer than 255 bytes")
			}
			cur.comment = v
		case cur.kind == "addrtype" && a == "--dst-type" && v == "LOCAL":
		case cur.kind == "mark" && a == "--mark":
			if cur.mark, cur.mask, err = parseMarkMask(v); err != nil {
				return s, err
			}
		default:
			return s, unsupported("option %s %s", a, v)
		}
	}
	if neg {
		return s, unsupported("dangling !")
	}
	for _, m := range s.matches {
		if (m.kind == "tcp" || m.kind == "udp") && m.port == 0 ||
			m.kind == "multiport" && len(m.ports) == 0 {
			return s, unsupported("match %s without --dport(s)", m.kind)
		}
	}
	if s.target.kind == "DNAT" && !s.target.addr.IsValid() {
		return s, unsupported("DNAT without --to-destination")
	}
	if s.target.kind == "MARK" && s.target.mask == 0 {
		return s, unsupported("MARK without --set-xmark")
	}
	return s, nil
}

func parseXTPrefix(fam Family, v string) (netip.Prefix, error) {
	var p netip.Prefix
	var err error
	if strings.Contains(v, "/") {
		p, err = netip.ParsePrefix(v)
	} else {
		var a netip.Addr
		if a, err = netip.ParseAddr(v); err == nil {
			p = netip.PrefixFrom(a, a.BitLen())
		}
	}
	if err != nil || p.Addr().Zone() != "" || FamilyOf(p.Addr()) != fam || p.Addr().Is4In6() {
		return p, unsupported("address %q", v)
	}
	return p.Masked(), nil
}

func parseXTDest(fam Family, v string) (netip.Addr, uint16, error) {
	if ap, err := netip.ParseAddrPort(v); err == nil && ap.Port() != 0 {
		if FamilyOf(ap.Addr()) != fam || ap.Addr().Zone() != "" {
			return netip.Addr{}, 0, unsupported("destination %q", v)
		}
		return ap.Addr(), ap.Port(), nil
	}
	a, err := netip.ParseAddr(v)
	if err != nil || FamilyOf(a) != fam || a.Zone() != "" {
		return netip.Addr{}, 0, unsupported("destination %q", v)
	}
	return a, 0, nil
}

func parseMarkMask(v string) (uint32, uint32, error) {
	mv, mm, slash := strings.Cut(v, "/")
	m, err := strconv.ParseUint(mv, 0, 32)
	if err != nil {
		return 0, 0, unsupported("mark %q", v)
	}
	mask := uint64(0xffffffff)
	if slash {
		if mask, err = strconv.ParseUint(mm, 0, 32); err != nil {
			return 0, 0, unsupported("mark %q", v)
		}
	}
	return uint32(m), uint32(mask), nil
}

// xtSaveString renders an option value as iptables' xtables_save_string does.
func xtSaveString(v string) string {
	const plain = "_-0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
	simple := v != ""
	for _, r := range v {
		if !strings.ContainsRune(plain, r) {
			simple = false
			break
		}
	}
	if simple {
		return v
	}
	return `"` + backslashEscape(v, `"\'`) + `"`
}

// text renders s as `iptables -S` prints it (without "-A <chain> ").
func (s xtSpec) text() string {
	var b []string
	addr := func(not bool, opt string, p netip.Prefix) {
		if !p.IsValid() {
			return
		}
		if not {
			b = append(b, "!")
		}
		b = append(b, opt, p.String())
	}
	addr(s.notSrc, "-s", s.src)
	addr(s.notDst, "-d", s.dst)
	if s.in != "" {
		if s.notIn {
			b = append(b, "!")
		}
		b = append(b, "-i", s.in)
	}
	if s.proto != "" {
		b = append(b, "-p", s.proto)
	}
	for _, m := range s.matches {
		b = append(b, "-m", m.kind)
		switch m.kind {
		case "tcp", "udp":
			b = append(b, "--dport", strconv.Itoa(int(m.port)))
		case "multiport":
			ps := make([]string, len(m.ports))
			for i, p := range m.ports {
				ps[i] = strconv.Itoa(int(p))
			}
			b = append(b, "--dports", strings.Join(ps, ","))
		case "comment":
			b = append(b, "--comment", xtSaveString(m.comment))
		case "addrtype":
			b = append(b, "--dst-type", "LOCAL")
		case "mark":
			b = append(b, "--mark", markText(m.mark, m.mask))
		}
	}
	t := s.target
	switch t.kind {
	case "verdict", "jump", "MASQUERADE":
		b = append(b, "-j", t.name)
	case "DNAT":
		to := t.addr.String()
		if t.port != 0 {
			to = netip.AddrPortFrom(t.addr, t.port).String()
		}
		b = append(b, "-j", "DNAT", "--to-destination", to)
	case "MARK":
		b = append(b, "-j", "MARK", "--set-xmark", fmt.Sprintf("%#x/%#x", t.mark, t.mask))
	}
	return strings.Join(b, " ")
}

func markText(mark, mask uint32) string {
	if mask == 0xffffffff {
		return fmt.Sprintf("%#x", mark)
	}
	return fmt.Sprintf("%#x/%#x", mark, mask)
}

// Expression encoding. Register 1 is NFT_REG_1, as iptables-nft uses it.
const (
	nftReg1       = 1
	nftaBitwiseOp = 6 // NFTA_BITWISE_OP
	nftRegVerdict = 0
	nftCmpEq      = 0
	nftCmpNeq     = 1
	nftJump       = 0xfffffffd // NFT_JUMP (-3)
	nftReturn     = 0xfffffffb // NFT_RETURN (-5)
	nfDrop        = 0
	nfAccept      = 1
	natMapIPs     = 1 // NF_NAT_RANGE_MAP_IPS
	natProto      = 2 // NF_NAT_RANGE_PROTO_SPECIFIED
	addrTypeLocal = 4 // XT_ADDRTYPE_LOCAL
	multiportDst  = 1 // XT_MULTIPORT_DESTINATION
)

type xtEncoded struct {
	exprs       []nfExpr
	compatProto uint32
}

func exprData(f func(a attrs)) []byte {
	a := newAttrs()
	f(a)
	return a.bytes()
}

func dataValue(a attrs, t uint16, v []byte) {
	a.nest(t, func(n attrs) { n.raw(unix.NFTA_DATA_VALUE, v) })
}

func metaExpr(key uint32) nfExpr {
	return nfExpr{"meta", exprData(func(a attrs) {
		a.u32(unix.NFTA_META_KEY, key)
		a.u32(unix.NFTA_META_DREG, nftReg1)
	})}
}

func payloadExpr(base, off, n uint32) nfExpr {
	return nfExpr{"payload", exprData(func(a attrs) {
		a.u32(unix.NFTA_PAYLOAD_DREG, nftReg1)
		a.u32(unix.NFTA_PAYLOAD_BASE, base)
		a.u32(unix.NFTA_PAYLOAD_OFFSET, off)
		a.u32(unix.NFTA_PAYLOAD_LEN, n)
	})}
}

func cmpExpr(neq bool, v []byte) nfExpr {
	op := uint32(nftCmpEq)
	if neq {
		op = nftCmpNeq
	}
	return nfExpr{"cmp", exprData(func(a attrs) {
		a.u32(unix.NFTA_CMP_SREG, nftReg1)
		a.u32(unix.NFTA_CMP_OP, op)
		dataValue(a, unix.NFTA_CMP_DATA, v)
	})}
}

func bitwiseExpr(mask []byte) nfExpr {
	return nfExpr{"bitwise", exprData(func(a attrs) {
		a.u32(unix.NFTA_BITWISE_SREG, nftReg1)
		a.u32(unix.NFTA_BITWISE_DREG, nftReg1)
		a.u32(unix.NFTA_BITWISE_LEN, uint32(len(mask)))
		dataValue(a, unix.NFTA_BITWISE_MASK, mask)
		dataValue(a, unix.NFTA_BITWISE_XOR, make([]byte, len(mask)))
	})}
}

func xtExpr(kind, name string, rev uint32, info []byte) nfExpr {
	return nfExpr{kind, exprData(func(a attrs) {
		a.str(1, name) // NFTA_MATCH_NAME / NFTA_TARGET_NAME
		a.u32(2, rev)
		a.raw(3, info)
	})}
}

func verdictExpr(code uint32, chain string) nfExpr {
	return nfExpr{"immediate", exprData(func(a attrs) {
		a.u32(unix.NFTA_IMMEDIATE_DREG, nftRegVerdict)
		a.nest(unix.NFTA_IMMEDIATE_DATA, func(d attrs) {
			d.nest(unix.NFTA_DATA_VERDICT, func(v attrs) {
				v.u32(unix.NFTA_VERDICT_CODE, code)
				if chain != "" {
					v.str(unix.NFTA_VERDICT_CHAIN, chain)
				}
			})
		})
	})}
}

func counterExpr() nfExpr {
	return nfExpr{"counter", exprData(func(a attrs) {
		a.u64(unix.NFTA_COUNTER_BYTES, 0)
		a.u64(unix.NFTA_COUNTER_PACKETS, 0)
	})}
}

// addrExprs matches a prefix at offset off of the network header, as iptables-nft
// 1.8.9 does: whole bytes are compared directly, other lengths load the full address
// and mask it.
func addrExprs(p netip.Prefix, off uint32, neq bool) []nfExpr {
	a := p.Addr().AsSlice()
	bits := p.Bits()
	if bits == 0 {
		return nil
	}
	if bits%8 == 0 {
		return []nfExpr{payloadExpr(unix.NFT_PAYLOAD_NETWORK_HEADER, off, uint32(bits/8)), cmpExpr(neq, a[:bits/8])}
	}
	mask := make([]byte, len(a))
	for i := 0; i < bits; i++ {
		mask[i/8] |= 0x80 >> (i % 8)
	}
	return []nfExpr{payloadExpr(unix.NFT_PAYLOAD_NETWORK_HEADER, off, uint32(len(a))), bitwiseExpr(mask), cmpExpr(neq, a)}
}

func le16(v uint16) []byte { return binary.LittleEndian.AppendUint16(nil, v) }
func le32(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }

// encodeXTSpec encodes s as iptables-nft stores it in family fam.
func encodeXTSpec(fam Family, s xtSpec) (xtEncoded, error) {
	var e xtEncoded
	if s.in != "" {
		name := []byte(s.in)
		if strings.HasSuffix(s.in, "+") {
			name = name[:len(name)-1]
		} else {
			name = append(name, 0)
		}
		e.exprs = append(e.exprs, metaExpr(unix.NFT_META_IIFNAME), cmpExpr(s.notIn, name))
	}
	if s.proto != "" {
		e.compatProto = uint32(xtProtoNums[s.proto])
		e.exprs = append(e.exprs, metaExpr(unix.NFT_META_L4PROTO), cmpExpr(false, []byte{xtProtoNums[s.proto]}))
	}
	srcOff, dstOff := uint32(12), uint32(16)
	if fam == IPv6 {
		srcOff, dstOff = 8, 24
	}
	if s.src.IsValid() {
		e.exprs = append(e.exprs, addrExprs(s.src, srcOff, s.notSrc)...)
	}
	if s.dst.IsValid() {
		e.exprs = append(e.exprs, addrExprs(s.dst, dstOff, s.notDst)...)
	}
	for _, m := range s.matches {
		switch m.kind {
		case "tcp", "udp":
			e.exprs = append(e.exprs, payloadExpr(unix.NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2),
				cmpExpr(false, binary.BigEndian.AppendUint16(nil, m.port)))
		case "multiport":
			info := make([]byte, 48) // struct xt_multiport_v1
			info[0], info[1] = multiportDst, byte(len(m.ports))
			for i, p := range m.ports {
				binary.LittleEndian.PutUint16(info[2+2*i:], p)
			}
			e.exprs = append(e.exprs, xtExpr("match", "multiport", 1, info))
		case "comment":
			info := make([]byte, 256) // struct xt_comment_info
			copy(info, m.comment)
			e.exprs = append(e.exprs, xtExpr("match", "comment", 0, info))
		case "addrtype":
			info := make([]byte, 8) // struct xt_addrtype_info_v1
			binary.LittleEndian.PutUint16(info[2:], addrTypeLocal)
			e.exprs = append(e.exprs, xtExpr("match", "addrtype", 1, info))
		case "mark":
			e.exprs = append(e.exprs, metaExpr(unix.NFT_META_MARK))
			if m.mask != 0xffffffff {
				e.exprs = append(e.exprs, bitwiseExpr(le32(m.mask)))
			}
			e.exprs = append(e.exprs, cmpExpr(false, le32(m.mark)))
		default:
			return e, unsupported("match %s", m.kind)
		}
	}
	e.exprs = append(e.exprs, counterExpr())
	t := s.target
	switch t.kind {
	case "":
	case "verdict":
		code := map[string]uint32{"ACCEPT": nfAccept, "DROP": nfDrop, "RETURN": nftReturn}[t.name]
		e.exprs = append(e.exprs, verdictExpr(code, ""))
	case "jump":
		e.exprs = append(e.exprs, verdictExpr(nftJump, t.name))
	case "MARK":
		e.exprs = append(e.exprs, xtExpr("target", "MARK", 2, append(le32(t.mark), le32(t.mask)...)))
	case "DNAT":
		info := make([]byte, 48) // struct nf_nat_range2
		flags := uint32(natMapIPs)
		if t.port != 0 {
			flags |= natProto
			binary.BigEndian.PutUint16(info[36:], t.port)
			binary.BigEndian.PutUint16(info[38:], t.port)
		}
		binary.LittleEndian.PutUint32(info, flags)
		copy(info[4:], t.addr.AsSlice())
		copy(info[20:], t.addr.AsSlice())
		e.exprs = append(e.exprs, xtExpr("target", "DNAT", 2, info))
	case "MASQUERADE":
		var info []byte
		if fam == IPv4 {
			info = make([]byte, 24) // struct nf_nat_ipv4_multi_range_compat, one range
			info[0] = 1
		} else {
			info = make([]byte, 40) // struct nf_nat_range
		}
		e.exprs = append(e.exprs, xtExpr("target", "MASQUERADE", 0, info))
	default:
		return e, unsupported("target %s", t.kind)
	}
	return e, nil
}

// decodeXTSpec reads back a rule's expressions as iptables-nft would print them. It
// returns ok false for any expression or layout it does not know; such a rule is never
// taken for one of the specifications above.
func decodeXTSpec(fam Family, exprs []nfExpr) (s xtSpec, ok bool) {
	type load struct {
		meta     uint32
		base     uint32
		off, len uint32
		mask     []byte
		isMeta   bool
		isLoaded bool
	}
	var ld load
	srcOff, dstOff, alen := uint32(12), uint32(16), 4
	if fam == IPv6 {
		srcOff, dstOff, alen = 8, 24, 16
	}
	u32 := func(b []byte) uint32 {
		if len(b) != 4 {
			return 0xffffffff
		}
		return binary.BigEndian.Uint32(b)
	}
	for _, ex := range exprs {
		a, err := decodeAttrs(ex.data)
		if err != nil {
			return s, false
		}
		if s.target.valid {
			return s, false // nothing may follow the target
		}
		switch ex.name {
		case "counter":
		case "meta":
			if a.has(unix.NFTA_META_SREG) || u32(a.get(unix.NFTA_META_DREG)) != nftReg1 {
				return s, false
			}
			ld = load{isLoaded: true, isMeta: true, meta: u32(a.get(unix.NFTA_META_KEY))}
		case "payload":
			if u32(a.get(unix.NFTA_PAYLOAD_DREG)) != nftReg1 {
				return s, false
			}
			ld = load{isLoaded: true, base: u32(a.get(unix.NFTA_PAYLOAD_BASE)), off: u32(a.get(unix.NFTA_PAYLOAD_OFFSET)), len: u32(a.get(unix.NFTA_PAYLOAD_LEN))}
		case "bitwise":
			if !ld.isLoaded || ld.mask != nil || u32(a.get(unix.NFTA_BITWISE_SREG)) != nftReg1 || u32(a.get(unix.NFTA_BITWISE_DREG)) != nftReg1 {
				return s, false
			}
			if op, set := a.lookup(nftaBitwiseOp); set && u32(op) != 0 {
				return s, false
			}
			mask, ok1 := nestedValue(a.get(unix.NFTA_BITWISE_MASK))
			xor, ok2 := nestedValue(a.get(unix.NFTA_BITWISE_XOR))
			if !ok1 || !ok2 || len(mask) != int(u32(a.get(unix.NFTA_BITWISE_LEN))) || !allZero(xor) {
				return s, false
			}
			ld.mask = mask
		case "cmp":
			v, ok1 := nestedValue(a.get(unix.NFTA_CMP_DATA))
			op := u32(a.get(unix.NFTA_CMP_OP))
			if !ld.isLoaded || !ok1 || u32(a.get(unix.NFTA_CMP_SREG)) != nftReg1 || (op != nftCmpEq && op != nftCmpNeq) {
				return s, false
			}
			neq := op == nftCmpNeq
			if !decodeCmp(fam, &s, ld.isMeta, ld.meta, ld.base, ld.off, ld.len, ld.mask, v, neq, srcOff, dstOff, alen) {
				return s, false
			}
			ld = load{}
		case "match":
			if ld.isLoaded || !decodeMatch(&s, cstr(a.get(1)), u32(a.get(2)), a.get(3)) {
				return s, false
			}
		case "target":
			if ld.isLoaded || !decodeTarget(fam, &s, cstr(a.get(1)), u32(a.get(2)), a.get(3)) {
				return s, false
			}
		case "immediate":
			if ld.isLoaded || u32(a.get(unix.NFTA_IMMEDIATE_DREG)) != nftRegVerdict {
				return s, false
			}
			d, err := decodeAttrs(a.get(unix.NFTA_IMMEDIATE_DATA))
			if err != nil {
				return s, false
			}
			v, err := decodeAttrs(d.get(unix.NFTA_DATA_VERDICT))
			if err != nil {
				return s, false
			}
			switch code := u32(v.get(unix.NFTA_VERDICT_CODE)); code {
			case nftJump:
				s.target = xtTarget{valid: true, kind: "jump", name: cstr(v.get(unix.NFTA_VERDICT_CHAIN))}
			case nfAccept, nfDrop, nftReturn:
				s.target = xtTarget{valid: true, kind: "verdict", name: map[uint32]string{nfAccept: "ACCEPT", nfDrop: "DROP", nftReturn: "RETURN"}[code]}
			default:
				return s, false
			}
		default:
			return s, false
		}
	}
	if ld.isLoaded {
		return s, false
	}
	return s, true
}

func nestedValue(b []byte) ([]byte, bool) {
	a, err := decodeAttrs(b)
	if err != nil {
		return nil, false
	}
	v, ok := a.lookup(unix.NFTA_DATA_VALUE)
	return v, ok
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// decodeCmp interprets one load (meta or payload, optionally masked) and its compare.
func decodeCmp(fam Family, s *xtSpec, isMeta bool, key, base, off, n uint32, mask, v []byte, neq bool, srcOff, dstOff uint32, alen int) bool {
	switch {
	case isMeta && key == unix.NFT_META_IIFNAME && mask == nil && s.in == "":
		if len(v) > 0 && v[len(v)-1] == 0 {
			s.in = string(v[:len(v)-1])
		} else {
			s.in = string(v) + "+"
		}
		s.notIn = neq
		return s.in != "" && s.in != "+" && !strings.ContainsRune(strings.TrimSuffix(s.in, "+"), 0)
	case isMeta && key == unix.NFT_META_L4PROTO && mask == nil && !neq && len(v) == 1 && s.proto == "":
		return setProto(s, v[0])
	case !isMeta && fam == IPv4 && base == unix.NFT_PAYLOAD_NETWORK_HEADER && off == 9 && n == 1 && mask == nil && !neq && s.proto == "":
		return setProto(s, v[0])
	case isMeta && key == unix.NFT_META_MARK && !neq && len(v) == 4:
		m := xtMatch{kind: "mark", mark: binary.LittleEndian.Uint32(v), mask: 0xffffffff}
		if mask != nil {
			if len(mask) != 4 {
				return false
			}
			m.mask = binary.LittleEndian.Uint32(mask)
		}
		s.matches = append(s.matches, m)
		return true
	case !isMeta && base == unix.NFT_PAYLOAD_NETWORK_HEADER && (off == srcOff || off == dstOff):
		if int(n) != len(v) || int(n) > alen {
			return false
		}
		full := make([]byte, alen)
		copy(full, v)
		bits := int(n) * 8
		if mask != nil {
			if len(mask) != len(v) {
				return false
			}
			bits = 0
			for _, c := range mask {
				for c&0x80 != 0 {
					bits++
					c <<= 1
				}
				if c != 0 {
					return false // not a prefix mask
				}
			}
		}
		addr, ok := netip.AddrFromSlice(full)
		if !ok {
			return false
		}
		p := netip.PrefixFrom(addr, bits)
		if p.Masked() != p {
			return false
		}
		if off == srcOff && !s.src.IsValid() {
			s.src, s.notSrc = p, neq
		} else if off == dstOff && !s.dst.IsValid() {
			s.dst, s.notDst = p, neq
		} else {
			return false
		}
		return true
	case !isMeta && base == unix.NFT_PAYLOAD_TRANSPORT_HEADER && off == 2 && n == 2 && mask == nil && !neq && s.proto != "":
		s.matches = append(s.matches, xtMatch{kind: s.proto, port: binary.BigEndian.Uint16(v)})
		return true
	}
	return false
}

func setProto(s *xtSpec, p uint8) bool {
	for name, n := range xtProtoNums {
		if n == p {
			s.proto = name
			return true
		}
	}
	return false
}

// decodeMatch reads an xt match (compat expression).
func decodeMatch(s *xtSpec, name string, rev uint32, info []byte) bool {
	switch {
	case name == "comment" && rev == 0 && len(info) == 256:
		c := cstr(info)
		s.matches = append(s.matches, xtMatch{kind: "comment", comment: c})
		return true
	case name == "multiport" && rev == 1 && len(info) == 48 && s.proto != "":
		if info[0] != multiportDst || info[1] == 0 || info[1] > multiportMax || info[47] != 0 {
			return false
		}
		m := xtMatch{kind: "multiport"}
		for i := 0; i < int(info[1]); i++ {
			if info[32+i] != 0 { // a port range
				return false
			}
			m.ports = append(m.ports, binary.LittleEndian.Uint16(info[2+2*i:]))
		}
		s.matches = append(s.matches, m)
		return true
	case name == "addrtype" && rev == 1 && len(info) == 8:
		if binary.LittleEndian.Uint16(info) != 0 || binary.LittleEndian.Uint16(info[2:]) != addrTypeLocal || binary.LittleEndian.Uint32(info[4:]) != 0 {
			return false
		}
		s.matches = append(s.matches, xtMatch{kind: "addrtype"})
		return true
	case (name == "tcp" || name == "udp") && rev == 0 && len(info) >= 9 && name == s.proto:
		// struct xt_tcp / xt_udp: spts[2], dpts[2], then flags; only a single
		// destination port, nothing else.
		le := binary.LittleEndian
		if le.Uint16(info) != 0 || le.Uint16(info[2:]) != 0xffff || le.Uint16(info[4:]) != le.Uint16(info[6:]) || !allZero(info[8:]) {
			return false
		}
		s.matches = append(s.matches, xtMatch{kind: name, port: le.Uint16(info[4:])})
		return true
	case name == "mark" && rev == 1 && len(info) >= 9:
		if !allZero(info[8:]) { // inverted
			return false
		}
		s.matches = append(s.matches, xtMatch{kind: "mark", mark: binary.LittleEndian.Uint32(info), mask: binary.LittleEndian.Uint32(info[4:])})
		return true
	}
	return false
}

// decodeTarget reads an xt target (compat expression).
func decodeTarget(fam Family, s *xtSpec, name string, rev uint32, info []byte) bool {
	le := binary.LittleEndian
	switch {
	case name == "MARK" && rev == 2 && len(info) == 8:
		s.target = xtTarget{valid: true, kind: "MARK", name: name, mark: le.Uint32(info), mask: le.Uint32(info[4:])}
		return true
	case name == "MASQUERADE" && rev == 0 && fam == IPv4 && len(info) == 24:
		if le.Uint32(info) != 1 || !allZero(info[4:]) {
			return false
		}
		s.target = xtTarget{valid: true, kind: "MASQUERADE", name: name}
		return true
	case name == "MASQUERADE" && rev == 0 && fam == IPv6 && len(info) == 40:
		if !allZero(info) {
			return false
		}
		s.target = xtTarget{valid: true, kind: "MASQUERADE", name: name}
		return true
	case name == "DNAT" && rev == 2 && len(info) == 48:
		flags := le.Uint32(info)
		alen := 4
		if fam == IPv6 {
			alen = 16
		}
		if flags&^(natMapIPs|natProto) != 0 || flags&natMapIPs == 0 ||
			string(info[4:20]) != string(info[20:36]) || !allZero(info[4+alen:20]) || !allZero(info[40:]) {
			return false
		}
		addr, _ := netip.AddrFromSlice(info[4 : 4+alen])
		t := xtTarget{valid: true, kind: "DNAT", name: name, addr: addr}
		if flags&natProto != 0 {
			if string(info[36:38]) != string(info[38:40]) {
				return false
			}
			t.port = binary.BigEndian.Uint16(info[36:])
			if t.port == 0 {
				return false
			}
		} else if !allZero(info[36:40]) {
			return false
		}
		s.target = t
		return true
	}
	return false
}
