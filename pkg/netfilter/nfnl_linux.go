package netfilter

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// nfnl is a minimal nf_tables netlink client for the objects iptables-nft keeps:
// single-object reads (never a dump of a whole table: a node with kube-proxy has tens
// of thousands of chains), rule dumps of one chain, and batches checked against the
// ruleset generation they were planned from. google/nftables cannot send the latter
// two (a generation ID in the batch, a rule's compat protocol for xt matches). It is a
// blocking socket driven by plain system calls: several requests go out in one
// sendmsg and their replies are matched by sequence number, so a whole read of what
// a script depends on is one round trip, without the Go scheduler in between.
type nfnl struct {
	fd  int
	seq uint32
	buf []byte
	// broken: an exchange ended early, and replies (or a dump in progress) may still be
	// queued on the socket; it is not used again.
	broken bool
}

// errDumpInterrupted is a dump the ruleset changed under (NLM_F_DUMP_INTR): read again.
var errDumpInterrupted = errors.New("the nf_tables ruleset changed during a listing")

func dialNFNL() (*nfnl, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("opening an nf_tables netlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("binding an nf_tables netlink socket: %w", err)
	}
	// A reply never waits forever (the kernel answers at once; this only bounds a bug).
	tv := unix.Timeval{Sec: 30}
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	// Room for every acknowledgement of a large batch: the kernel queues them all
	// before the first read (as iptables-nft and nft size theirs).
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 4<<20) != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
	}
	return &nfnl{fd: fd, seq: uint32(time.Now().UnixNano()), buf: make([]byte, 256<<10)}, nil
}

func (n *nfnl) close() error { return unix.Close(n.fd) }

// nfMsg is one nf_tables message: type, family and attributes.
type nfMsg struct {
	typ   uint16 // NFT_MSG_*
	fam   byte
	flags netlink.HeaderFlags
	attrs []byte
}

// raw appends the message, with sequence number seq, to b. A zero typ with sub set
// sends a bare nfnetlink message (batch begin and end).
func appendNLMsg(b []byte, typ uint16, flags uint16, seq uint32, fam byte, resID uint16, attrs []byte) []byte {
	l := unix.NLMSG_HDRLEN + 4 + len(attrs)
	h := make([]byte, unix.NLMSG_HDRLEN+4)
	binary.NativeEndian.PutUint32(h[0:], uint32(l))
	binary.NativeEndian.PutUint16(h[4:], typ)
	binary.NativeEndian.PutUint16(h[6:], flags)
	binary.NativeEndian.PutUint32(h[8:], seq)
	h[16] = fam
	binary.BigEndian.PutUint16(h[18:], resID)
	b = append(b, h...)
	b = append(b, attrs...)
	for len(b)%unix.NLMSG_ALIGNTO != 0 {
		b = append(b, 0)
	}
	return b
}

func (m nfMsg) nlType() uint16 { return uint16(unix.NFNL_SUBSYS_NFTABLES<<8) | m.typ }

// nfReply is what one request got back: data messages' attributes, or an error.
type nfReply struct {
	msgs []nlAttrs
	err  error
}

// exchange sends reqs in one sendmsg and collects each one's replies. At most one of
// them may be a dump (the kernel runs one dump at a time per socket).
func (n *nfnl) exchange(reqs []nfMsg) (_ []nfReply, err error) {
	defer func() {
		if err != nil {
			n.broken = true
		}
	}()
	var b []byte
	first := n.seq + 1
	for _, m := range reqs {
		n.seq++
		b = appendNLMsg(b, m.nlType(), uint16(m.flags|netlink.Request), n.seq, m.fam, 0, m.attrs)
	}
	if err := unix.Sendto(n.fd, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("sending to nf_tables: %w", err)
	}
	out := make([]nfReply, len(reqs))
	pending := len(reqs)
	done := make([]bool, len(reqs))
	for pending > 0 {
		msgs, err := n.receive()
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			i := int(m.Header.Seq - first)
			if i < 0 || i >= len(reqs) || done[i] {
				continue // a stale reply of an earlier, failed exchange
			}
			finish := func() { done[i] = true; pending-- }
			switch m.Header.Type {
			case unix.NLMSG_ERROR:
				if len(m.Data) >= 4 {
					if e := -int32(binary.NativeEndian.Uint32(m.Data)); e != 0 {
						out[i].err = unix.Errno(e)
						if unix.Errno(e) == unix.EPERM {
							// Refused before any request was looked at: no other
							// reply comes.
							return nil, fmt.Errorf("nf_tables: %w", unix.EPERM)
						}
					}
				}
				finish()
			case unix.NLMSG_DONE:
				// A dump that stopped early says why in its DONE.
				if len(m.Data) >= 4 && out[i].err == nil {
					if e := -int32(binary.NativeEndian.Uint32(m.Data)); e != 0 {
						out[i].err = unix.Errno(e)
					}
				}
				finish()
			default:
				if m.Header.Flags&unix.NLM_F_DUMP_INTR != 0 && out[i].err == nil {
					out[i].err = errDumpInterrupted
				}
				if len(m.Data) >= 4 {
					a, err := decodeAttrs(m.Data[4:])
					if err != nil {
						return nil, err
					}
					out[i].msgs = append(out[i].msgs, a)
				}
				if m.Header.Flags&unix.NLM_F_MULTI == 0 {
					finish()
				}
			}
		}
	}
	return out, nil
}

func (n *nfnl) receive() ([]syscall.NetlinkMessage, error) {
	for {
		k, _, err := unix.Recvfrom(n.fd, n.buf, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading from nf_tables: %w", err)
		}
		// The buffer is reused for the next read; what is parsed from it is kept (a
		// listing's attributes alias it), so the messages get memory of their own.
		return syscall.ParseNetlinkMessage(bytes.Clone(n.buf[:k]))
	}
}

// attrs encodes netlink attributes (big-endian integers, as nf_tables wants).
type attrs struct{ e *netlink.AttributeEncoder }

func newAttrs() attrs {
	e := netlink.NewAttributeEncoder()
	e.ByteOrder = binary.BigEndian
	return attrs{e}
}

func (a attrs) str(t uint16, s string) { a.e.Bytes(t, append([]byte(s), 0)) }
func (a attrs) u32(t uint16, v uint32) { a.e.Uint32(t, v) }
func (a attrs) u64(t uint16, v uint64) { a.e.Uint64(t, v) }
func (a attrs) raw(t uint16, b []byte) { a.e.Bytes(t, b) }
func (a attrs) nest(t uint16, f func(a attrs)) {
	a.e.Nested(t|unix.NLA_F_NESTED, func(ne *netlink.AttributeEncoder) error {
		ne.ByteOrder = binary.BigEndian
		f(attrs{ne})
		return nil
	})
}
func (a attrs) bytes() []byte {
	b, err := a.e.Encode()
	if err != nil {
		panic(err) // only on attributes too large for netlink, which we never build
	}
	return b
}

// nlAttrs are one message's attributes by type, nesting flags cleared. nf_tables
// types are small, so they index an array of offsets into the message: a rule listing
// decodes thousands of these, and maps of copied payloads made most of its cost.
type nlAttrs struct {
	buf  []byte
	span [nlAttrSlots][2]uint32 // payload of type t: buf[span[t][0]:span[t][1]]
	seen uint32                 // bit t: type t was present (possibly empty)
	more []nlAttrKV             // types ≥ nlAttrSlots; none that podwire reads
}

const nlAttrSlots = 16

type nlAttrKV struct {
	t uint16
	v []byte
}

// lookup returns the payload of type t and whether the message had it.
func (a *nlAttrs) lookup(t uint16) ([]byte, bool) {
	if t < nlAttrSlots {
		if a.seen&(1<<t) == 0 {
			return nil, false
		}
		sp := a.span[t]
		return a.buf[sp[0]:sp[1]:sp[1]], true
	}
	for i := len(a.more) - 1; i >= 0; i-- {
		if a.more[i].t == t {
			return a.more[i].v, true
		}
	}
	return nil, false
}

// get returns the payload of type t (nil when absent).
func (a *nlAttrs) get(t uint16) []byte { v, _ := a.lookup(t); return v }

// has reports whether the message had an attribute of type t.
func (a *nlAttrs) has(t uint16) bool { _, ok := a.lookup(t); return ok }

var errBadAttr = errors.New("malformed netlink attribute")

// decodeAttrs splits b into its attributes. The payloads alias b (receive hands out
// messages in memory of their own). A repeated type keeps its last payload.
func decodeAttrs(b []byte) (nlAttrs, error) {
	a := nlAttrs{buf: b}
	for i := 0; i < len(b); {
		if len(b)-i < unix.SizeofNlAttr {
			return a, errBadAttr
		}
		l := int(binary.NativeEndian.Uint16(b[i:]))
		t := binary.NativeEndian.Uint16(b[i+2:]) &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
		if l < unix.SizeofNlAttr || l > len(b)-i {
			return a, errBadAttr
		}
		if t < nlAttrSlots {
			a.span[t] = [2]uint32{uint32(i + unix.SizeofNlAttr), uint32(i + l)}
			a.seen |= 1 << t
		} else {
			a.more = append(a.more, nlAttrKV{t, b[i+unix.SizeofNlAttr : i+l : i+l]})
		}
		i = min(i+(l+3)&^3, len(b))
	}
	return a, nil
}

// decodeList returns the payloads of a NLA list (NFTA_LIST_ELEM entries); they
// alias b.
func decodeList(b []byte) ([][]byte, error) {
	var out [][]byte
	for len(b) > 0 {
		if len(b) < unix.SizeofNlAttr {
			return nil, errBadAttr
		}
		l := int(binary.NativeEndian.Uint16(b))
		if l < unix.SizeofNlAttr || l > len(b) {
			return nil, errBadAttr
		}
		out = append(out, b[unix.SizeofNlAttr:l:l])
		b = b[min((l+3)&^3, len(b)):]
	}
	return out, nil
}

func cstr(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// get runs one request and returns the replies' attributes (after the nfgenmsg).
func (n *nfnl) get(m nfMsg) ([]nlAttrs, error) {
	r, err := n.exchange([]nfMsg{m})
	if err != nil {
		return nil, err
	}
	return r[0].msgs, r[0].err
}

// nfChain is a chain as the kernel reports it.
type nfChain struct {
	name   string
	hooked bool
	hook   uint32
	prio   int32
	typ    string
	policy uint32
	attrs  nlAttrs
}

func getChainMsg(fam byte, table, name string) nfMsg {
	a := newAttrs()
	a.str(unix.NFTA_CHAIN_TABLE, table)
	a.str(unix.NFTA_CHAIN_NAME, name)
	return nfMsg{typ: unix.NFT_MSG_GETCHAIN, fam: fam, attrs: a.bytes()}
}

func dumpRulesMsg(fam byte, table, chain string) nfMsg {
	a := newAttrs()
	a.str(unix.NFTA_RULE_TABLE, table)
	a.str(unix.NFTA_RULE_CHAIN, chain)
	return nfMsg{typ: unix.NFT_MSG_GETRULE, fam: fam, flags: netlink.Dump, attrs: a.bytes()}
}

// chainFromReply reads a GETCHAIN reply; ok is false when the chain (or its table)
// does not exist.
func chainFromReply(r nfReply, table, name string) (nfChain, bool, error) {
	if isNoEnt(r.err) {
		return nfChain{}, false, nil
	}
	if r.err != nil {
		return nfChain{}, false, fmt.Errorf("reading chain %s of table %s: %w", name, table, r.err)
	}
	if len(r.msgs) != 1 {
		return nfChain{}, false, fmt.Errorf("reading chain %s of table %s: %d replies", name, table, len(r.msgs))
	}
	m := &r.msgs[0]
	c := nfChain{name: cstr(m.get(unix.NFTA_CHAIN_NAME)), attrs: *m, typ: cstr(m.get(unix.NFTA_CHAIN_TYPE))}
	if h, ok := m.lookup(unix.NFTA_CHAIN_HOOK); ok {
		ha, err := decodeAttrs(h)
		if err != nil {
			return c, false, err
		}
		c.hooked = true
		if v := ha.get(unix.NFTA_HOOK_HOOKNUM); len(v) == 4 {
			c.hook = binary.BigEndian.Uint32(v)
		}
		if v := ha.get(unix.NFTA_HOOK_PRIORITY); len(v) == 4 {
			c.prio = int32(binary.BigEndian.Uint32(v))
		}
	}
	if v := m.get(unix.NFTA_CHAIN_POLICY); len(v) == 4 {
		c.policy = binary.BigEndian.Uint32(v)
	}
	return c, true, nil
}

// rulesFromReply reads a rule dump of one chain.
func rulesFromReply(r nfReply, table, chain string) ([]nfRule, error) {
	if r.err != nil {
		return nil, fmt.Errorf("listing the rules of chain %s of table %s: %w", chain, table, r.err)
	}
	var out []nfRule
	for i := range r.msgs {
		m := &r.msgs[i]
		// Kernels without dump filtering return every rule of the family.
		if cstr(m.get(unix.NFTA_RULE_TABLE)) != table || cstr(m.get(unix.NFTA_RULE_CHAIN)) != chain {
			continue
		}
		rule, err := parseNFRule(m)
		if err != nil {
			return nil, fmt.Errorf("chain %s of table %s: %w", chain, table, err)
		}
		out = append(out, rule)
	}
	return out, nil
}

// chain returns the chain table/name, or ok false when it does not exist.
func (n *nfnl) chain(fam byte, table, name string) (nfChain, bool, error) {
	r, err := n.exchange([]nfMsg{getChainMsg(fam, table, name)})
	if err != nil {
		return nfChain{}, false, err
	}
	return chainFromReply(r[0], table, name)
}

// chainRules reads a chain and its rules in one round trip; ok is false when the
// chain does not exist.
func (n *nfnl) chainRules(fam byte, table, name string) (nfChain, []nfRule, bool, error) {
	r, err := n.exchange([]nfMsg{getChainMsg(fam, table, name), dumpRulesMsg(fam, table, name)})
	if err != nil {
		return nfChain{}, nil, false, err
	}
	c, ok, err := chainFromReply(r[0], table, name)
	if err != nil || !ok {
		return c, nil, ok, err
	}
	rules, err := rulesFromReply(r[1], table, name)
	return c, rules, true, err
}

// state reads, in one round trip, the ruleset generation, whether table exists, and
// which of chains exist.
func (n *nfnl) state(fam byte, table string, chains []string) (gen uint32, tableOK bool, exist map[string]bool, err error) {
	ta := newAttrs()
	ta.str(unix.NFTA_TABLE_NAME, table)
	reqs := []nfMsg{{typ: unix.NFT_MSG_GETGEN}, {typ: unix.NFT_MSG_GETTABLE, fam: fam, attrs: ta.bytes()}}
	for _, c := range chains {
		reqs = append(reqs, getChainMsg(fam, table, c))
	}
	r, err := n.exchange(reqs)
	if err != nil {
		return 0, false, nil, err
	}
	if r[0].err != nil || len(r[0].msgs) != 1 || len(r[0].msgs[0].get(unix.NFTA_GEN_ID)) != 4 {
		return 0, false, nil, fmt.Errorf("reading the nf_tables generation: %v", r[0].err)
	}
	gen = binary.BigEndian.Uint32(r[0].msgs[0].get(unix.NFTA_GEN_ID))
	if r[1].err != nil && !isNoEnt(r[1].err) {
		return 0, false, nil, fmt.Errorf("reading table %s: %w", table, r[1].err)
	}
	tableOK = r[1].err == nil
	exist = map[string]bool{}
	for i, c := range chains {
		_, ok, err := chainFromReply(r[2+i], table, c)
		if err != nil {
			return 0, false, nil, err
		}
		exist[c] = ok
	}
	return gen, tableOK, exist, nil
}

// nfRule is a rule as the kernel reports it: its handle, its expressions (name and
// raw NFTA_EXPR_DATA each) and its user data.
type nfRule struct {
	handle uint64
	exprs  []nfExpr
	udata  []byte
}

type nfExpr struct {
	name string
	data []byte
}

// rules dumps the rules of one chain.
func (n *nfnl) rules(fam byte, table, chain string) ([]nfRule, error) {
	r, err := n.exchange([]nfMsg{dumpRulesMsg(fam, table, chain)})
	if err != nil {
		return nil, err
	}
	return rulesFromReply(r[0], table, chain)
}

func parseNFRule(r *nlAttrs) (nfRule, error) {
	var rule nfRule
	if v := r.get(unix.NFTA_RULE_HANDLE); len(v) == 8 {
		rule.handle = binary.BigEndian.Uint64(v)
	}
	rule.udata = r.get(unix.NFTA_RULE_USERDATA)
	elems, err := decodeList(r.get(unix.NFTA_RULE_EXPRESSIONS))
	if err != nil {
		return rule, fmt.Errorf("rule %d: %w", rule.handle, err)
	}
	for _, el := range elems {
		ea, err := decodeAttrs(el)
		if err != nil {
			return rule, fmt.Errorf("rule %d: %w", rule.handle, err)
		}
		rule.exprs = append(rule.exprs, nfExpr{name: cstr(ea.get(unix.NFTA_EXPR_NAME)), data: ea.get(unix.NFTA_EXPR_DATA)})
	}
	return rule, nil
}

// errGenChanged is a batch refused because the ruleset changed after it was planned.
var errGenChanged = errors.New("the nf_tables ruleset changed while the change was planned")

// commit sends msgs as one batch, applied only if the ruleset is still at generation
// gen (the kernel refuses it with ERESTART otherwise: errGenChanged). It returns the
// first error the kernel reports, naming the message; the batch is then not applied
// at all.
func (n *nfnl) commit(gen uint32, msgs []nfMsg) (err error) {
	if len(msgs) == 0 {
		return nil
	}
	defer func() {
		// A refused generation leaves nothing queued; anything else may.
		if err != nil && err != errGenChanged {
			n.broken = true
		}
	}()
	begin := newAttrs()
	begin.u32(unix.NFNL_BATCH_GENID, gen)
	n.seq++
	beginSeq := n.seq
	b := appendNLMsg(nil, unix.NFNL_MSG_BATCH_BEGIN, unix.NLM_F_REQUEST, beginSeq, unix.AF_UNSPEC, unix.NFNL_SUBSYS_NFTABLES, begin.bytes())
	first := n.seq + 1
	for _, m := range msgs {
		n.seq++
		b = appendNLMsg(b, m.nlType(), uint16(m.flags|netlink.Request|netlink.Acknowledge), n.seq, m.fam, 0, m.attrs)
	}
	n.seq++
	b = appendNLMsg(b, unix.NFNL_MSG_BATCH_END, unix.NLM_F_REQUEST, n.seq, unix.AF_UNSPEC, unix.NFNL_SUBSYS_NFTABLES, nil)
	if err := unix.Sendto(n.fd, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("sending an nf_tables batch: %w", err)
	}
	// One acknowledgement per message (the kernel processes the whole batch and reports
	// every message's outcome), or a single error for the batch itself.
	pending := len(msgs)
	var firstErr error
	for pending > 0 {
		replies, err := n.receive()
		if err != nil {
			return err
		}
		for _, r := range replies {
			if r.Header.Type != unix.NLMSG_ERROR || len(r.Data) < 4 {
				continue
			}
			e := unix.Errno(-int32(binary.NativeEndian.Uint32(r.Data)))
			if r.Header.Seq == beginSeq {
				if e == unix.ERESTART {
					return errGenChanged
				}
				return fmt.Errorf("nf_tables refused the batch: %w", e)
			}
			i := int(r.Header.Seq - first)
			if i < 0 || i >= len(msgs) {
				continue
			}
			pending--
			if e != 0 && firstErr == nil {
				firstErr = fmt.Errorf("message %d of the batch (%s): %w", i+1, nftMsgName(msgs[i].typ), e)
			}
		}
	}
	return firstErr
}

func nftMsgName(t uint16) string {
	switch t {
	case unix.NFT_MSG_NEWTABLE:
		return "new table"
	case unix.NFT_MSG_NEWCHAIN:
		return "new chain"
	case unix.NFT_MSG_DELCHAIN:
		return "delete chain"
	case unix.NFT_MSG_NEWRULE:
		return "new rule"
	case unix.NFT_MSG_DELRULE:
		return "delete rule"
	}
	return fmt.Sprintf("type %d", t)
}
