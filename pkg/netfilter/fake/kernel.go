// SPDX-License-Identifier: Apache-2.0

// Package fake is an in-memory kernel for the netfilter layer's unit tests.
package fake

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/podwire/podwire/pkg/netfilter"
)

// Kernel implements both seams netfilter's layouts run on, the iptables tools
// (netfilter.XTables) and the nf_tables connection (netfilter.NFTConn), with the
// kernel's rules for what the layouts do. An iptables-restore script and an nftables
// batch apply all or nothing; a -D or DelRule of something absent, a rule jumping to
// a missing chain, a -X of a chain that is referenced or not empty all fail the whole
// change. Every backend of package netfilter can run on a Kernel (NewHostPortsOn,
// NewMasqOn, NewNFTablesOn), so unit tests exercise the real layouts and planners,
// and Dump shows the state as `iptables -S` lines and nft-like text.
type Kernel struct {
	mu sync.Mutex
	xt map[Family]map[string]*xtChain // family -> "table/chain" -> chain
	nt map[tableKey]*nftTable
	// pending is the nftables batch being built; nextHandle numbers rules.
	pending    []func(map[tableKey]*nftTable) error
	nextHandle uint64
	fail       map[string]error
	// NoIPv6Tables makes ip6tables look not installed.
	NoIPv6Tables bool
}

type xtChain struct {
	builtin bool
	rules   [][]string
}

type tableKey struct {
	fam  nftables.TableFamily
	name string
}

type nftTable struct {
	chains map[string]*nftChain
}

type nftChain struct {
	chain *nftables.Chain
	rules []*nftables.Rule
}

var (
	_ netfilter.XTables = (*Kernel)(nil)
	_ netfilter.NFTConn = (*Kernel)(nil)
)

// Family is netfilter's address family.
type Family = netfilter.Family

const (
	IPv4 = netfilter.IPv4
	IPv6 = netfilter.IPv6
)

// New returns an empty kernel: the nat table's built-in chains in both families and
// no nftables table.
func New() *Kernel {
	f := &Kernel{xt: map[Family]map[string]*xtChain{}, nt: map[tableKey]*nftTable{}, fail: map[string]error{}}
	for _, fam := range []Family{IPv4, IPv6} {
		f.xt[fam] = map[string]*xtChain{}
		for _, c := range []string{"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"} {
			f.xt[fam]["nat/"+c] = &xtChain{builtin: true}
		}
	}
	return f
}

// FailNext makes the next call of op ("restore", "list", "flush") fail with err,
// changing nothing.
func (f *Kernel) FailNext(op string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail[op] = err
}

func (f *Kernel) failing(op string) error {
	err := f.fail[op]
	delete(f.fail, op)
	return err
}

// Installed implements netfilter.XTables.
func (f *Kernel) Installed(fam Family) bool { return fam != IPv6 || !f.NoIPv6Tables }

// List implements netfilter.XTables.
func (f *Kernel) List(_ context.Context, fam Family, table, chain string) ([]string, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.failing("list"); err != nil {
		return nil, false, err
	}
	c := f.xt[fam][table+"/"+chain]
	if c == nil {
		return nil, false, nil
	}
	var lines []string
	for _, r := range c.rules {
		lines = append(lines, "-A "+chain+" "+netfilter.FormatRuleArgs(r))
	}
	return lines, true, nil
}

// Has implements netfilter.XTables.
func (f *Kernel) Has(_ context.Context, fam Family, table, chain string, rule []string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.xt[fam][table+"/"+chain]
	return c != nil && slices.ContainsFunc(c.rules, func(r []string) bool { return slices.Equal(r, rule) }), nil
}

// xtTargets are the targets that are not chains.
var xtTargets = map[string]bool{"ACCEPT": true, "DROP": true, "RETURN": true, "MASQUERADE": true, "DNAT": true, "SNAT": true, "MARK": true}

// Restore implements netfilter.XTables.
func (f *Kernel) Restore(_ context.Context, fam Family, script string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.failing("restore"); err != nil {
		return err
	}
	next := map[string]*xtChain{}
	for k, c := range f.xt[fam] {
		next[k] = &xtChain{builtin: c.builtin, rules: slices.Clone(c.rules)}
	}
	table := ""
	for n, line := range strings.Split(strings.TrimSpace(script), "\n") {
		if err := restoreLine(next, &table, line); err != nil {
			return fmt.Errorf("iptables-restore: line %d failed (%q): %w", n+1, line, err)
		}
	}
	f.xt[fam] = next
	return nil
}

// restoreLine applies one line of an iptables-restore --noflush script.
func restoreLine(st map[string]*xtChain, table *string, line string) error {
	a := netfilter.SplitRuleArgs(line)
	switch {
	case len(a) == 0 || a[0] == "COMMIT":
		return nil
	case strings.HasPrefix(a[0], "*"):
		*table = a[0][1:]
		return nil
	case strings.HasPrefix(a[0], ":"):
		k := *table + "/" + a[0][1:]
		if c := st[k]; c != nil && !c.builtin {
			c.rules = nil // --noflush still flushes a declared user chain
		} else if c == nil {
			st[k] = &xtChain{}
		}
		return nil
	case len(a) < 2:
		return fmt.Errorf("no chain")
	}
	k := *table + "/" + a[1]
	c := st[k]
	if c == nil {
		return fmt.Errorf("chain %s does not exist", a[1])
	}
	switch a[0] {
	case "-A", "-I":
		rule, pos := a[2:], len(c.rules)
		if a[0] == "-I" {
			pos = 0
			if len(rule) > 0 {
				if n, err := strconv.Atoi(rule[0]); err == nil {
					pos, rule = min(n-1, len(c.rules)), rule[1:]
				}
			}
		}
		if i := slices.Index(rule, "-j"); i >= 0 && i+1 < len(rule) && !xtTargets[rule[i+1]] && st[*table+"/"+rule[i+1]] == nil {
			return fmt.Errorf("jump to missing chain %s", rule[i+1])
		}
		c.rules = slices.Insert(c.rules, pos, rule)
	case "-D":
		i := slices.IndexFunc(c.rules, func(r []string) bool { return slices.Equal(r, a[2:]) })
		if i < 0 {
			return fmt.Errorf("bad rule (does a matching rule exist in that chain?)")
		}
		c.rules = slices.Delete(c.rules, i, i+1)
	case "-F":
		c.rules = nil
	case "-X":
		if c.builtin || len(c.rules) > 0 {
			return fmt.Errorf("chain %s is built in or not empty", a[1])
		}
		for _, o := range st {
			for _, r := range o.rules {
				if i := slices.Index(r, "-j"); i >= 0 && i+1 < len(r) && r[i+1] == a[1] {
					return fmt.Errorf("chain %s is still referenced", a[1])
				}
			}
		}
		delete(st, k)
	default:
		return fmt.Errorf("unknown command %s", a[0])
	}
	return nil
}

// nftNotFound is the kernel's answer for a missing table, chain or rule.
func nftNotFound(what string) error { return fmt.Errorf("%s: %w", what, unix.ENOENT) }

// ListTableOfFamily implements netfilter.NFTConn.
func (f *Kernel) ListTableOfFamily(name string, fam nftables.TableFamily) (*nftables.Table, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.nt[tableKey{fam, name}]
	if t == nil {
		return nil, nftNotFound("table " + name)
	}
	return &nftables.Table{Name: name, Family: fam, Use: uint32(len(t.chains))}, nil
}

// ListChain implements netfilter.NFTConn.
func (f *Kernel) ListChain(t *nftables.Table, name string) (*nftables.Chain, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, fc, err := chainIn(f.nt, t, name)
	if err != nil {
		return nil, err
	}
	return fc.chain, nil
}

// GetRules implements netfilter.NFTConn.
func (f *Kernel) GetRules(t *nftables.Table, c *nftables.Chain) ([]*nftables.Rule, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, fc, err := chainIn(f.nt, t, c.Name)
	if err != nil {
		return nil, err
	}
	var out []*nftables.Rule
	for _, r := range fc.rules {
		cp := *r
		out = append(out, &cp)
	}
	return out, nil
}

func (f *Kernel) queue(op func(map[tableKey]*nftTable) error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pending = append(f.pending, op)
}

// AddTable implements netfilter.NFTConn.
func (f *Kernel) AddTable(t *nftables.Table) *nftables.Table {
	f.queue(func(st map[tableKey]*nftTable) error {
		if k := (tableKey{t.Family, t.Name}); st[k] == nil {
			st[k] = &nftTable{chains: map[string]*nftChain{}}
		}
		return nil
	})
	return t
}

// AddChain implements netfilter.NFTConn.
func (f *Kernel) AddChain(c *nftables.Chain) *nftables.Chain {
	f.queue(func(st map[tableKey]*nftTable) error {
		t := st[tableKey{c.Table.Family, c.Table.Name}]
		if t == nil {
			return nftNotFound("table " + c.Table.Name)
		}
		if t.chains[c.Name] == nil {
			t.chains[c.Name] = &nftChain{chain: c}
		}
		return nil
	})
	return c
}

// chainIn returns table t's chain name in st, or the kernel's ENOENT.
func chainIn(st map[tableKey]*nftTable, t *nftables.Table, name string) (*nftTable, *nftChain, error) {
	ft := st[tableKey{t.Family, t.Name}]
	if ft == nil || ft.chains[name] == nil {
		return nil, nil, nftNotFound("chain " + name)
	}
	return ft, ft.chains[name], nil
}

// chainOp queues op on chain c, failing the batch when c is missing.
func (f *Kernel) chainOp(c *nftables.Chain, op func(*nftTable, *nftChain) error) {
	f.queue(func(st map[tableKey]*nftTable) error {
		t, fc, err := chainIn(st, c.Table, c.Name)
		if err != nil {
			return err
		}
		return op(t, fc)
	})
}

// FlushChain implements netfilter.NFTConn.
func (f *Kernel) FlushChain(c *nftables.Chain) {
	f.chainOp(c, func(_ *nftTable, fc *nftChain) error { fc.rules = nil; return nil })
}

// DelChain implements netfilter.NFTConn: as the kernel, it deletes the chain with its
// rules, and fails when the chain is missing or a rule elsewhere jumps to it.
func (f *Kernel) DelChain(c *nftables.Chain) {
	f.chainOp(c, func(t *nftTable, _ *nftChain) error {
		for name, o := range t.chains {
			if name == c.Name {
				continue
			}
			for _, r := range o.rules {
				if jumpTarget(r) == c.Name {
					return fmt.Errorf("chain %s is still jumped to from chain %s: %w", c.Name, name, unix.EBUSY)
				}
			}
		}
		delete(t.chains, c.Name)
		return nil
	})
}

// jumpTarget is the chain a rule jumps or goes to, "" for none.
func jumpTarget(r *nftables.Rule) string {
	for _, e := range r.Exprs {
		if v, ok := e.(*expr.Verdict); ok && (v.Kind == expr.VerdictJump || v.Kind == expr.VerdictGoto) {
			return v.Chain
		}
	}
	return ""
}

// AddRule implements netfilter.NFTConn. As the kernel, it refuses a jump to a chain
// missing from the table.
func (f *Kernel) AddRule(r *nftables.Rule) *nftables.Rule {
	f.queue(func(st map[tableKey]*nftTable) error {
		t, fc, err := chainIn(st, r.Table, r.Chain.Name)
		if err != nil {
			return err
		}
		if to := jumpTarget(r); to != "" && t.chains[to] == nil {
			return nftNotFound("jump target chain " + to)
		}
		f.nextHandle++
		cp := *r
		cp.Handle = f.nextHandle
		fc.rules = append(fc.rules, &cp)
		return nil
	})
	return r
}

// DelRule implements netfilter.NFTConn.
func (f *Kernel) DelRule(r *nftables.Rule) error {
	if r.Handle == 0 {
		return fmt.Errorf("rule's handle cannot be 0")
	}
	f.chainOp(r.Chain, func(_ *nftTable, fc *nftChain) error {
		i := slices.IndexFunc(fc.rules, func(x *nftables.Rule) bool { return x.Handle == r.Handle })
		if i < 0 {
			return nftNotFound(fmt.Sprintf("rule handle %d", r.Handle))
		}
		fc.rules = slices.Delete(fc.rules, i, i+1)
		return nil
	})
	return nil
}

// DelTable implements netfilter.NFTConn.
func (f *Kernel) DelTable(t *nftables.Table) {
	f.queue(func(st map[tableKey]*nftTable) error {
		k := tableKey{t.Family, t.Name}
		if st[k] == nil {
			return nftNotFound("table " + t.Name)
		}
		delete(st, k)
		return nil
	})
}

// Flush applies the batch built since the last Flush, all or nothing.
func (f *Kernel) Flush() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	ops := f.pending
	f.pending = nil
	if err := f.failing("flush"); err != nil {
		return err
	}
	next := map[tableKey]*nftTable{}
	for k, t := range f.nt {
		nt := &nftTable{chains: map[string]*nftChain{}}
		for n, c := range t.chains {
			nt.chains[n] = &nftChain{chain: c.chain, rules: slices.Clone(c.rules)}
		}
		next[k] = nt
	}
	for _, op := range ops {
		if err := op(next); err != nil {
			return err
		}
	}
	f.nt = next
	return nil
}

// Dump renders the whole state, sorted: every iptables chain that is not an empty
// built-in one, as `iptables -S` lines per family, then every nftables table with its
// chains and rules (expressions in a compact text form, then the comment).
func (f *Kernel) Dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, fam := range []Family{IPv4, IPv6} {
		for _, k := range slices.Sorted(maps.Keys(f.xt[fam])) {
			c := f.xt[fam][k]
			table, name, _ := strings.Cut(k, "/")
			if !c.builtin {
				out = append(out, fmt.Sprintf("%s %s -N %s", fam, table, name))
			}
			for _, r := range c.rules {
				out = append(out, fmt.Sprintf("%s %s -A %s %s", fam, table, name, netfilter.FormatRuleArgs(r)))
			}
		}
	}
	tkeys := slices.SortedFunc(maps.Keys(f.nt), func(a, b tableKey) int {
		return cmp.Or(cmp.Compare(a.fam, b.fam), strings.Compare(a.name, b.name))
	})
	for _, k := range tkeys {
		t := f.nt[k]
		out = append(out, fmt.Sprintf("nft table %s %s", netfilter.NFTFamily(k.fam), k.name))
		for _, n := range slices.Sorted(maps.Keys(t.chains)) {
			c := t.chains[n]
			out = append(out, fmt.Sprintf("nft   chain %s%s", n, describeChain(c.chain)))
			for _, r := range c.rules {
				out = append(out, "nft     "+netfilter.DescribeRule(r))
			}
		}
	}
	if len(out) == 0 {
		return ""
	}
	return strings.Join(out, "\n") + "\n"
}

func describeChain(c *nftables.Chain) string {
	if c.Hooknum == nil {
		return ""
	}
	prio := 0
	if c.Priority != nil {
		prio = int(*c.Priority)
	}
	return fmt.Sprintf(" (type %s hook %d priority %d)", c.Type, *c.Hooknum, prio)
}
