// SPDX-License-Identifier: Apache-2.0

package netfilter

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// The seam between podwire's iptables layouts and the iptables tools, what the layouts
// share, and the parsing of `iptables -S <chain>` listings. Pure: the exec side is
// xtables_linux.go, the in-memory one package fake.

// XTables is everything the iptables layouts do with iptables. They list only chains
// they own or the built-in chains they hang off, never a whole table, so their cost
// stays flat however many rules other programs keep.
type XTables interface {
	// Installed reports whether fam's iptables and iptables-restore are there.
	Installed(fam Family) bool
	// List returns the lines of `iptables -t table -S chain`; exists is false (and err
	// nil) when the chain does not exist.
	List(ctx context.Context, fam Family, table, chain string) (lines []string, exists bool, err error)
	// Has is `iptables -t table -C chain rule...`: whether that exact rule exists.
	Has(ctx context.Context, fam Family, table, chain string, rule []string) (bool, error)
	// Restore runs script through `iptables-restore --noflush`: all of it or nothing.
	Restore(ctx context.Context, fam Family, script string) error
}

// xtLayout is what both iptables layouts (host ports, ipMasq; both in the nat table)
// stand on: the seam and the lock serializing podwire's read-modify-write cycles.
type xtLayout struct {
	xt   XTables
	lock func() (func(), error)
}

// chainListing is one listed chain; exists is false when it is absent.
type chainListing struct {
	exists bool
	rules  []xtRule
}

// has reports whether the listing holds the rule line (compared by arguments).
func (l chainListing) has(line string) bool { return containsRule(l.rules, line) }

func (b xtLayout) list(ctx context.Context, fam Family, chain string) (chainListing, error) {
	lines, exists, err := b.xt.List(ctx, fam, "nat", chain)
	return chainListing{exists: exists, rules: parseXTRules(lines)}, err
}

// restore runs lines as one `iptables-restore --noflush` transaction of the nat table;
// no lines is nothing to do.
func (b xtLayout) restore(ctx context.Context, fam Family, lines []string) error {
	if len(lines) == 0 {
		return nil
	}
	return b.xt.Restore(ctx, fam, "*nat\n"+strings.Join(lines, "\n")+"\nCOMMIT\n")
}

// forFamilies runs fn under the lock for each family of fams. ADD stops at the first
// error. DEL and GC (cleanup) skip a family whose tools are missing (nothing made
// rules there, or can remove them; with none, no lock is taken) and go on after an
// error: they are best-effort and report every failure.
func (b xtLayout) forFamilies(fams Families, cleanup bool, fn func(Family) error) error {
	var todo []Family
	for _, fam := range fams.list() {
		if !cleanup || b.xt.Installed(fam) {
			todo = append(todo, fam)
		}
	}
	if len(todo) == 0 {
		return nil
	}
	unlock, err := b.lock()
	if err != nil {
		return err
	}
	defer unlock()
	var errs []error
	for _, fam := range todo {
		if errs = append(errs, fn(fam)); !cleanup && errs[len(errs)-1] != nil {
			break
		}
	}
	return errors.Join(errs...)
}

// maxChainName is iptables' limit on chain names (XT_EXTENSION_MAXNAMELEN - 1).
const maxChainName = 28

// maxXTComment is the longest comment the comment match takes (XT_MAX_COMMENT_LEN-1).
const maxXTComment = 255

// xtRule is one "-A" line of a listing, with the parts the layouts read.
type xtRule struct {
	line    string   // as listed
	args    []string // line split as iptables-restore splits it
	chain   string
	src     netip.Prefix // -s (not negated); invalid when absent
	target  string       // -j
	comment string
	tag     Tag  // podwire's tag, when ours
	ours    bool // the comment is a podwire tag
}

func parseXTRule(line string) xtRule {
	r := xtRule{line: line, args: SplitRuleArgs(line)}
	if len(r.args) > 1 {
		r.chain = r.args[1]
	}
	for i := 2; i+1 < len(r.args); i++ {
		switch v := r.args[i+1]; r.args[i] {
		case "-s":
			if r.args[i-1] != "!" {
				if p, err := netip.ParsePrefix(v); err == nil {
					r.src = p
				} else if a, err := netip.ParseAddr(v); err == nil {
					r.src = hostPrefix(a)
				}
			}
		case "-j":
			r.target = v
		case "--comment":
			r.comment = v
		}
	}
	r.tag, r.ours = ParseTag(r.comment)
	return r
}

// parseXTRules parses the "-A" lines of `iptables -S` output.
func parseXTRules(lines []string) []xtRule {
	var out []xtRule
	for _, line := range lines {
		if line = strings.TrimSpace(line); strings.HasPrefix(line, "-A ") {
			out = append(out, parseXTRule(line))
		}
	}
	return out
}

func (r xtRule) deleteLine() string { return "-D" + strings.TrimPrefix(r.line, "-A") }

// SplitRuleArgs splits an iptables rule line into arguments as iptables-restore does:
// spaces separate, double quotes group, a backslash escapes the next character.
func SplitRuleArgs(line string) []string {
	var out []string
	var cur strings.Builder
	inQ, have, esc := false, false, false
	for _, r := range line {
		switch {
		case esc:
			cur.WriteRune(r)
			esc = false
		case r == '\\':
			esc, have = true, true
		case r == '"':
			inQ, have = !inQ, true
		case r == ' ' && !inQ:
			if have {
				out = append(out, cur.String())
				cur.Reset()
				have = false
			}
		default:
			cur.WriteRune(r)
			have = true
		}
	}
	if have {
		out = append(out, cur.String())
	}
	return out
}

// xtQuote quotes s for an iptables-restore line the way `iptables -S` prints
// comments: in double quotes, with `"` and `\` escaped. Whatever s holds, it stays one
// argument: no input can end the comment and add matches or a target.
func xtQuote(s string) string { return `"` + xtEscaper.Replace(s) + `"` }

var xtEscaper = strings.NewReplacer(`"`, `\"`, `\`, `\\`)

// FormatRuleArgs prints rule arguments as `iptables -S` does: comments (and anything
// with a space, quote or backslash) quoted.
func FormatRuleArgs(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		if (i > 0 && args[i-1] == "--comment") || strings.ContainsAny(a, " \"\\") {
			a = xtQuote(a)
		}
		out[i] = a
	}
	return strings.Join(out, " ")
}

// containsRule reports whether have holds the rule line want, compared by arguments
// so quoting does not matter.
func containsRule(have []xtRule, want string) bool {
	w := SplitRuleArgs(want)
	return slices.ContainsFunc(have, func(r xtRule) bool { return slices.Equal(r.args, w) })
}

// ruleArgs renders r with comment as iptables rule arguments, in the order
// `iptables -S` prints them.
func ruleArgs(r Rule, comment string) (string, error) {
	if r.Family != IPv4 && r.Family != IPv6 {
		return "", fmt.Errorf("rule %q: iptables rules need an IP family", r)
	}
	a := matchArgs(r.Match)
	if comment != "" {
		a = append(a, "-m", "comment", "--comment", xtQuote(comment))
	}
	switch act := r.Action; act.Kind {
	case Accept:
		a = append(a, "-j", "ACCEPT")
	case Masquerade:
		a = append(a, "-j", "MASQUERADE")
	case DNAT:
		a = append(a, "-j", "DNAT", "--to-destination", act.dnatTo())
	case SetMark:
		a = append(a, "-j", "MARK", "--set-xmark", fmt.Sprintf("%#x/%#x", act.Mark, act.Mark))
	case Jump:
		a = append(a, "-j", act.Chain)
	default:
		return "", fmt.Errorf("rule %q: no iptables target for action %d", r, act.Kind)
	}
	return strings.Join(a, " "), nil
}

// matchArgs renders m as iptables match arguments (portmap's conditions are a Match
// too), in the order `iptables -S` prints them.
func matchArgs(m Match) []string {
	var a []string
	addr := func(flag string, p netip.Prefix, not bool) {
		if !p.IsValid() {
			return
		}
		if not {
			a = append(a, "!")
		}
		a = append(a, flag, p.Masked().String())
	}
	addr("-s", m.Src, m.NotSrc)
	addr("-d", m.Dst, m.NotDst)
	if m.InIface != "" {
		a = append(a, "-i", m.InIface)
	}
	if m.Proto != "" {
		a = append(a, "-p", string(m.Proto))
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
	return a
}

// validChainName reports whether s can be written into an iptables-restore line as a
// chain name without changing the line's meaning.
func validChainName(s string) bool {
	bad := func(c rune) bool {
		return !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.ContainsRune("_-.", c))
	}
	return s != "" && len(s) <= maxChainName && s[0] != '-' && !strings.ContainsFunc(s, bad)
}
