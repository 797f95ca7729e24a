package netfilter

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// This file renders plans as iptables-restore input and parses `iptables -S <chain>`
// listings. It is pure: the exec side is in iptables_linux.go.

// maxChainName is iptables' limit on chain names (XT_EXTENSION_MAXNAMELEN - 1).
const maxChainName = 28

// ChainName is the iptables chain holding f's rules for hook h: PW-<FEATURE>-<HOOK>.
func ChainName(f Feature, h Hook) (string, error) {
	n := "PW-" + strings.ToUpper(f.Name) + "-" + strings.ToUpper(h.Name)
	if len(n) > maxChainName {
		return "", fmt.Errorf("iptables chain name %q for feature %s is longer than %d bytes; use a shorter feature name", n, f.Name, maxChainName)
	}
	return n, nil
}

// builtinChain is the built-in chain a hook's entry jump goes into.
func builtinChain(h Hook) string { return strings.ToUpper(h.Name) }

// entryComment tags the one jump from the built-in chain, so operators see who put it
// there.
func entryComment(f Feature) string { return "podwire " + f.Name }

// entryRule is the jump from h's built-in chain to the feature chain, without the
// leading -A/-D.
func entryRule(f Feature, h Hook, chain string) string {
	return builtinChain(h) + ` -m comment --comment "` + entryComment(f) + `" -j ` + chain
}

func prefixArg(p netip.Prefix) string { return p.Masked().String() }

// ruleArgs renders r (with its tag) as iptables rule arguments, in the order
// `iptables -S` prints them.
func ruleArgs(r Rule, t Tag) (string, error) {
	if r.Family != IPv4 && r.Family != IPv6 {
		return "", fmt.Errorf("rule %q: iptables rules need an IP family", r)
	}
	var a []string
	m := r.Match
	neg := func(n bool) {
		if n {
			a = append(a, "!")
		}
	}
	if m.Src.IsValid() {
		neg(m.NotSrc)
		a = append(a, "-s", prefixArg(m.Src))
	}
	if m.Dst.IsValid() {
		neg(m.NotDst)
		a = append(a, "-d", prefixArg(m.Dst))
	}
	if m.InIface != "" {
		a = append(a, "-i", m.InIface)
	}
	if m.Proto != "" {
		a = append(a, "-p", string(m.Proto))
	}
	if m.SrcMAC != nil {
		a = append(a, "-m", "mac")
		neg(m.NotSrcMAC)
		a = append(a, "--mac-source", strings.ToUpper(m.SrcMAC.String()))
	}
	if m.DstPort != 0 {
		a = append(a, "-m", string(m.Proto), "--dport", strconv.Itoa(int(m.DstPort)))
	}
	if m.DstLocal {
		a = append(a, "-m", "addrtype", "--dst-type", "LOCAL")
	}
	if m.Mark != 0 {
		a = append(a, "-m", "mark", "--mark", fmt.Sprintf("%#x/%#x", m.Mark, m.Mark))
	}
	a = append(a, "-m", "comment", "--comment", `"`+t.String()+`"`)
	switch act := r.Action; act.Kind {
	case Return:
		a = append(a, "-j", "RETURN")
	case Accept:
		a = append(a, "-j", "ACCEPT")
	case Drop:
		a = append(a, "-j", "DROP")
	case Masquerade:
		a = append(a, "-j", "MASQUERADE")
	case DNAT:
		to := act.Addr.String()
		if act.Port != 0 {
			to = netip.AddrPortFrom(act.Addr, act.Port).String()
		}
		a = append(a, "-j", "DNAT", "--to-destination", to)
	case SetMark:
		a = append(a, "-j", "MARK", "--set-xmark", fmt.Sprintf("%#x/%#x", act.Mark, act.Mark))
	case Jump:
		a = append(a, "-j", act.Chain)
	default:
		return "", fmt.Errorf("rule %q: no iptables target for action %d", r, act.Kind)
	}
	return strings.Join(a, " "), nil
}

// listedRule is one "-A" line of a chain listing.
type listedRule struct {
	line string // as printed, starting with "-A "
	tag  Tag
	ours bool // carries a podwire tag
}

// chainListing is `iptables -S <chain>` parsed; exists is false when the chain is
// absent.
type chainListing struct {
	exists bool
	rules  []listedRule
}

// parseListing parses `iptables -S <chain>` output.
func parseListing(out string) chainListing {
	l := chainListing{exists: true}
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "-A ") {
			continue
		}
		lr := listedRule{line: line}
		if i := strings.Index(line, "--comment "); i >= 0 {
			c := line[i+len("--comment "):]
			if strings.HasPrefix(c, `"`) {
				if j := strings.Index(c[1:], `"`); j >= 0 {
					c = c[1 : j+1]
				}
			} else if j := strings.IndexByte(c, ' '); j >= 0 {
				c = c[:j]
			}
			lr.tag, lr.ours = ParseTag(c)
		}
		l.rules = append(l.rules, lr)
	}
	return l
}

// restoreScript accumulates iptables-restore --noflush input, grouped by table.
type restoreScript struct {
	order  []string
	tables map[string][]string
}

func (s *restoreScript) add(table, line string) {
	if s.tables == nil {
		s.tables = map[string][]string{}
	}
	if _, ok := s.tables[table]; !ok {
		s.order = append(s.order, table)
	}
	s.tables[table] = append(s.tables[table], line)
}

func (s *restoreScript) empty() bool { return len(s.order) == 0 }

func (s *restoreScript) String() string {
	var b strings.Builder
	for _, t := range s.order {
		fmt.Fprintf(&b, "*%s\n", t)
		for _, l := range s.tables[t] {
			b.WriteString(l)
			b.WriteByte('\n')
		}
		b.WriteString("COMMIT\n")
	}
	return b.String()
}

// planIPTables computes the one restore transaction that takes family fam of feature
// f from the listed state to: no rules of id, then (when p is non-nil) p's rules of
// fam appended. A chain left without rules is removed with its entry jump (unless
// keepChains); a chain that gains its first rules is created with its entry jump.
// listings holds the current state of every hook of f. The result is empty when
// nothing changes.
func planIPTables(fam Family, f Feature, id OwnerID, p *Plan, listings map[Hook]chainListing, keepChains bool) (*restoreScript, error) {
	var s restoreScript
	for _, h := range f.Hooks {
		chain, err := ChainName(f, h)
		if err != nil {
			return nil, err
		}
		var add []string
		if p != nil {
			for _, r := range p.Rules {
				if r.Hook != h || r.Family != fam {
					continue
				}
				args, err := ruleArgs(r, tagFor(p.Owner, r))
				if err != nil {
					return nil, err
				}
				add = append(add, "-A "+chain+" "+args)
			}
		}
		l := listings[h]
		var del []string
		kept := 0
		for _, r := range l.rules {
			if r.ours && r.tag.ID == id {
				del = append(del, "-D"+strings.TrimPrefix(r.line, "-A"))
			} else {
				kept++
			}
		}
		table := h.Type
		switch {
		case !l.exists && len(add) == 0:
			// Nothing there, nothing wanted.
		case !l.exists:
			s.add(table, ":"+chain+" - [0:0]")
			s.add(table, "-A "+entryRule(f, h, chain))
			for _, a := range add {
				s.add(table, a)
			}
		case kept == 0 && len(add) == 0 && !keepChains:
			if len(l.rules) == 0 && len(del) == 0 {
				// An empty chain we own: left over by an interrupted removal. Drop it
				// only together with a real change, so a no-op stays a no-op.
				continue
			}
			// The last rules go: remove the chain and its jump too, so a node
			// without pods carries nothing of ours.
			s.add(table, "-D "+entryRule(f, h, chain))
			s.add(table, "-F "+chain)
			s.add(table, "-X "+chain)
		default:
			for _, d := range del {
				s.add(table, d)
			}
			for _, a := range add {
				s.add(table, a)
			}
		}
	}
	return &s, nil
}
