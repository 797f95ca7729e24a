package netfilter

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// nfnl is a minimal nf_tables netlink client for the objects iptables-nft keeps:
// single-object reads (never a dump of a whole table: a node with kube-proxy has tens
// of thousands of chains), rule dumps of one chain, and batches checked against the
// ruleset generation they were planned from. google/nftables cannot send the latter
// two (a generation ID in the batch, a rule's compat protocol for xt matches).
type nfnl struct {
	c *netlink.Conn
}

func dialNFNL() (*nfnl, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return nil, fmt.Errorf("opening an nf_tables netlink socket: %w", err)
	}
	return &nfnl{c: c}, nil
}

func (n *nfnl) close() error { return n.c.Close() }

// conn returns the socket (for netfilter.DetachSockets-style hand-offs).
func (n *nfnl) conn() *netlink.Conn { return n.c }

// nfMsg is one nf_tables message: type, family and attributes.
type nfMsg struct {
	typ   uint16 // NFT_MSG_*
	fam   byte
	flags netlink.HeaderFlags
	attrs []byte
}

func (m nfMsg) netlink() netlink.Message {
	data := make([]byte, 4, 4+len(m.attrs))
	data[0] = m.fam
	return netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | int(m.typ)), Flags: m.flags},
		Data:   append(data, m.attrs...),
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

// decodeAttrs splits b into attribute type → payload (nesting flags cleared).
func decodeAttrs(b []byte) (map[uint16][]byte, error) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return nil, err
	}
	out := map[uint16][]byte{}
	for ad.Next() {
		out[ad.Type()] = ad.Bytes()
	}
	return out, ad.Err()
}

// decodeList returns the payloads of a NLA list (NFTA_LIST_ELEM entries).
func decodeList(b []byte) ([][]byte, error) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return nil, err
	}
	var out [][]byte
	for ad.Next() {
		out = append(out, ad.Bytes())
	}
	return out, ad.Err()
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
func (n *nfnl) get(m nfMsg) ([]map[uint16][]byte, error) {
	replies, err := n.c.Execute(m.netlink())
	if err != nil {
		return nil, err
	}
	var out []map[uint16][]byte
	for _, r := range replies {
		if len(r.Data) < 4 {
			continue
		}
		a, err := decodeAttrs(r.Data[4:])
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, nil
}

// genID returns the ruleset generation.
func (n *nfnl) genID() (uint32, error) {
	rs, err := n.get(nfMsg{typ: unix.NFT_MSG_GETGEN, flags: netlink.Request})
	if err != nil {
		return 0, fmt.Errorf("reading the nf_tables generation: %w", err)
	}
	if len(rs) != 1 || len(rs[0][unix.NFTA_GEN_ID]) != 4 {
		return 0, errors.New("reading the nf_tables generation: malformed reply")
	}
	return binary.BigEndian.Uint32(rs[0][unix.NFTA_GEN_ID]), nil
}

// tableExists reports whether table (of family fam) exists.
func (n *nfnl) tableExists(fam byte, table string) (bool, error) {
	a := newAttrs()
	a.str(unix.NFTA_TABLE_NAME, table)
	_, err := n.get(nfMsg{typ: unix.NFT_MSG_GETTABLE, fam: fam, flags: netlink.Request, attrs: a.bytes()})
	if isNoEnt(err) {
		return false, nil
	}
	return err == nil, err
}

// nfChain is a chain as the kernel reports it.
type nfChain struct {
	name   string
	hooked bool
	hook   uint32
	prio   int32
	typ    string
	policy uint32
	attrs  map[uint16][]byte
}

// chain returns the chain table/name, or ok false when it does not exist (also when
// the table does not).
func (n *nfnl) chain(fam byte, table, name string) (nfChain, bool, error) {
	a := newAttrs()
	a.str(unix.NFTA_CHAIN_TABLE, table)
	a.str(unix.NFTA_CHAIN_NAME, name)
	rs, err := n.get(nfMsg{typ: unix.NFT_MSG_GETCHAIN, fam: fam, flags: netlink.Request, attrs: a.bytes()})
	if isNoEnt(err) {
		return nfChain{}, false, nil
	}
	if err != nil {
		return nfChain{}, false, fmt.Errorf("reading chain %s of table %s: %w", name, table, err)
	}
	if len(rs) != 1 {
		return nfChain{}, false, fmt.Errorf("reading chain %s of table %s: %d replies", name, table, len(rs))
	}
	c := nfChain{name: cstr(rs[0][unix.NFTA_CHAIN_NAME]), attrs: rs[0], typ: cstr(rs[0][unix.NFTA_CHAIN_TYPE])}
	if h, ok := rs[0][unix.NFTA_CHAIN_HOOK]; ok {
		ha, err := decodeAttrs(h)
		if err != nil {
			return c, false, err
		}
		c.hooked = true
		if v := ha[unix.NFTA_HOOK_HOOKNUM]; len(v) == 4 {
			c.hook = binary.BigEndian.Uint32(v)
		}
		if v := ha[unix.NFTA_HOOK_PRIORITY]; len(v) == 4 {
			c.prio = int32(binary.BigEndian.Uint32(v))
		}
	}
	if v := rs[0][unix.NFTA_CHAIN_POLICY]; len(v) == 4 {
		c.policy = binary.BigEndian.Uint32(v)
	}
	return c, true, nil
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
	a := newAttrs()
	a.str(unix.NFTA_RULE_TABLE, table)
	a.str(unix.NFTA_RULE_CHAIN, chain)
	rs, err := n.get(nfMsg{typ: unix.NFT_MSG_GETRULE, fam: fam, flags: netlink.Request | netlink.Dump, attrs: a.bytes()})
	if err != nil {
		return nil, fmt.Errorf("listing the rules of chain %s of table %s: %w", chain, table, err)
	}
	var out []nfRule
	for _, r := range rs {
		// Kernels without dump filtering return every rule of the family.
		if cstr(r[unix.NFTA_RULE_TABLE]) != table || cstr(r[unix.NFTA_RULE_CHAIN]) != chain {
			continue
		}
		rule, err := parseNFRule(r)
		if err != nil {
			return nil, fmt.Errorf("chain %s of table %s: %w", chain, table, err)
		}
		out = append(out, rule)
	}
	return out, nil
}

func parseNFRule(r map[uint16][]byte) (nfRule, error) {
	var rule nfRule
	if v := r[unix.NFTA_RULE_HANDLE]; len(v) == 8 {
		rule.handle = binary.BigEndian.Uint64(v)
	}
	rule.udata = r[unix.NFTA_RULE_USERDATA]
	elems, err := decodeList(r[unix.NFTA_RULE_EXPRESSIONS])
	if err != nil {
		return rule, fmt.Errorf("rule %d: %w", rule.handle, err)
	}
	for _, el := range elems {
		ea, err := decodeAttrs(el)
		if err != nil {
			return rule, fmt.Errorf("rule %d: %w", rule.handle, err)
		}
		rule.exprs = append(rule.exprs, nfExpr{name: cstr(ea[unix.NFTA_EXPR_NAME]), data: ea[unix.NFTA_EXPR_DATA]})
	}
	return rule, nil
}

// errGenChanged is a batch refused because the ruleset changed after it was planned.
var errGenChanged = errors.New("the nf_tables ruleset changed while the change was planned")

// commit sends msgs as one batch, applied only if the ruleset is still at generation
// gen (the kernel refuses it with ERESTART otherwise: errGenChanged). It returns the
// first error the kernel reports; the batch is then not applied at all.
func (n *nfnl) commit(gen uint32, msgs []nfMsg) error {
	if len(msgs) == 0 {
		return nil
	}
	begin := newAttrs()
	begin.u32(unix.NFNL_BATCH_GENID, gen)
	batch := []netlink.Message{{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_MSG_BATCH_BEGIN), Flags: netlink.Request},
		Data:   append([]byte{unix.AF_UNSPEC, 0, 0, unix.NFNL_SUBSYS_NFTABLES}, begin.bytes()...),
	}}
	for _, m := range msgs {
		m.flags |= netlink.Request | netlink.Acknowledge
		batch = append(batch, m.netlink())
	}
	batch = append(batch, netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_MSG_BATCH_END), Flags: netlink.Request},
		Data:   []byte{unix.AF_UNSPEC, 0, 0, unix.NFNL_SUBSYS_NFTABLES},
	})
	sent, err := n.c.SendMessages(batch)
	if err != nil {
		return fmt.Errorf("sending an nf_tables batch: %w", err)
	}
	// One acknowledgement per message (the kernel processes the whole batch and reports
	// every message's outcome), or a single error for the batch itself.
	first := sent[0].Header.Sequence
	want := map[uint32]bool{}
	for _, m := range sent[1 : len(sent)-1] {
		want[m.Header.Sequence] = true
	}
	if err := n.c.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
		return err
	}
	defer n.c.SetReadDeadline(time.Time{})
	var firstErr error
	for len(want) > 0 {
		replies, err := n.c.Receive()
		if err != nil {
			var oe *netlink.OpError
			if errors.As(err, &oe) {
				// mdlayher/netlink turns an error reply into an OpError and drops the
				// message: we cannot tell which message failed, only that the batch did.
				if errors.Is(oe.Err, unix.ERESTART) {
					return errGenChanged
				}
				if firstErr == nil {
					firstErr = oe.Err
				}
				// The remaining acknowledgements may still come; the batch failed
				// anyway, and the socket is not reused after a failure.
				return firstErr
			}
			return fmt.Errorf("reading the nf_tables batch result: %w", err)
		}
		for _, r := range replies {
			if r.Header.Sequence == first {
				continue
			}
			delete(want, r.Header.Sequence)
		}
	}
	return firstErr
}
