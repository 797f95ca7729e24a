package netfilter

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/podwire/podwire/pkg/cniplumb"
)

// The direct iptables-nft path. Every iptables backend operation is an `iptables -S`
// of a few chains, an `iptables -C`, or an `iptables-restore --noflush` script (see
// IPTables.run). Where the node's iptables is iptables-nft, those tools only translate
// the rules into nf_tables netlink messages, and each costs a process start (about
// 3 ms on a small VM, paid several times per ADD and DEL). xtDirect answers the same
// commands itself over one netlink socket, with the same effect: the same tables,
// chains and rule expressions iptables-nft would store, one atomic batch per restore
// script, checked against the ruleset generation it was planned from (a concurrent
// change makes the kernel refuse it, and the script is planned again, as
// iptables-nft-restore does).
//
// It is used for a family only when the installed iptables was seen doing exactly
// that: once per boot and iptables binary (cached in cniplumb.RunDir), a self-check in
// two scratch network namespaces runs a restore script covering every rule shape the
// backends write through the installed iptables-restore and through xtDirect, and
// requires identical kernel state (chains, hooks, every rule's expressions) and the
// script's own text back from xtDirect's listing. On any difference, on legacy
// iptables, or when PODWIRE_IPTABLES_DIRECT=0, the binaries run as before. A command
// or rule it does not know (errXTUnsupported) also runs the binary.
type xtDirect struct {
	fam   Family
	mu    sync.Mutex
	nl    *nfnl
	netns uint64 // inode of the network namespace nl was opened in
}

// DirectIPTablesEnv, set to 0, makes the iptables backends always run the iptables
// binaries.
const DirectIPTablesEnv = "PODWIRE_IPTABLES_DIRECT"

var (
	directOnce [2]sync.Once
	directFor  [2]*xtDirect
)

// xtDirectFor returns the direct path for fam, or nil when the binaries must run.
func xtDirectFor(fam Family) *xtDirect {
	i := 0
	if fam == IPv6 {
		i = 1
	}
	directOnce[i].Do(func() {
		if os.Getenv(DirectIPTablesEnv) == "0" {
			return
		}
		_, restore := binaries(fam)
		path, err := exec.LookPath(restore)
		if err != nil {
			return
		}
		// The verdict is keyed by the file path resolves to (an alternatives switch to
		// iptables-legacy is another file), the kernel and the codec.
		var uts unix.Utsname
		_ = unix.Uname(&uts)
		extra := fmt.Sprintf("%s %s xtcodec-%d", fam, unix.ByteSliceToString(uts.Release[:]), xtCodecVersion)
		name := "iptables-direct-" + fam.String()
		yes, found := cniplumb.CachedVerdict(name, path, extra)
		if !found {
			// Plugins starting together after a boot wait for the first one's
			// verdict instead of all running the check.
			_ = os.MkdirAll(cniplumb.RunDir, 0o700)
			if unlock, err := LockFile(filepath.Join(cniplumb.RunDir, "iptables-direct.lock")); err == nil {
				defer unlock()
			}
			yes = cniplumb.FileVerdict(name, path, extra, func() bool { return xtSelfCheck(fam, restore) == nil })
		}
		if yes {
			directFor[i] = &xtDirect{fam: fam}
		}
	})
	return directFor[i]
}

// xtCodecVersion changes whenever the codec's encodings change, so cached verdicts
// are checked again.
const xtCodecVersion = 1

func (d *xtDirect) nfFamily() byte {
	if d.fam == IPv6 {
		return unix.NFPROTO_IPV6
	}
	return unix.NFPROTO_IPV4
}

// conn returns the process's socket, opened on first use and kept until the process
// exits.
// A socket belongs to the network namespace it was opened in: a caller that moved to
// another one (a test, a plugin working inside a pod's) gets a new socket.
func (d *xtDirect) conn() (*nfnl, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		return nil, fmt.Errorf("identifying the network namespace: %w", err)
	}
	if d.nl != nil && d.netns == st.Ino && !d.nl.broken {
		return d.nl, nil
	}
	d.drop()
	n, err := dialNFNL()
	if err != nil {
		return nil, err
	}
	d.nl, d.netns = n, st.Ino
	return n, nil
}

// drop forgets the socket after a failed batch (acknowledgements may still be queued
// on it).
func (d *xtDirect) drop() {
	if d.nl != nil {
		_ = d.nl.close()
		d.nl = nil
	}
}

// run answers one iptables command line; errXTUnsupported means "run the binary".
func (d *xtDirect) run(stdin string, restore bool, args []string) (string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if restore {
		if len(args) != 1 || args[0] != "--noflush" {
			return "", unsupported("restore arguments %q", args)
		}
		return "", d.restore(stdin)
	}
	if len(args) < 4 || args[0] != "-t" {
		return "", unsupported("arguments %q", args)
	}
	table, cmd, chain := args[1], args[2], args[3]
	if _, ok := xtBaseChains[table]; !ok {
		return "", unsupported("table %q", table)
	}
	switch {
	case cmd == "-S" && len(args) == 4:
		return d.list(table, chain)
	case cmd == "-C":
		return "", d.check(table, chain, args[4:])
	}
	return "", unsupported("command %q", cmd)
}

// xtBaseChains are the built-in chains iptables-nft creates per table: hook and
// priority.
var xtBaseChains = map[string]map[string][2]int32{
	"nat": {
		"PREROUTING":  {unix.NF_INET_PRE_ROUTING, -100},
		"INPUT":       {unix.NF_INET_LOCAL_IN, 100},
		"OUTPUT":      {unix.NF_INET_LOCAL_OUT, -100},
		"POSTROUTING": {unix.NF_INET_POST_ROUTING, 100},
	},
	"filter": {
		"INPUT":   {unix.NF_INET_LOCAL_IN, 0},
		"FORWARD": {unix.NF_INET_FORWARD, 0},
		"OUTPUT":  {unix.NF_INET_LOCAL_OUT, 0},
	},
}

func isBase(table, chain string) bool {
	_, ok := xtBaseChains[table][chain]
	return ok
}

// listed is a chain's rules with their text as `iptables -S` prints it.
type listed struct {
	handle uint64
	text   string
	opaque bool
}

// is reports whether the rule is the one a -C or -D names: canonical is the text the
// listing would print for it (one renderer made both, so equal rules have equal
// text); without one (a spec the codec cannot parse, such as an opaque listing's
// text) the tokens are compared, as iptables compares arguments.
func (r listed) is(canonical string, tokens []string) bool {
	if canonical != "" {
		return r.text == canonical
	}
	return sameRule(xtTokens(r.text), tokens)
}

// readChain lists a chain; ok is false when it does not exist.
func (d *xtDirect) readChain(n *nfnl, table, chain string) (rules []listed, ok bool, err error) {
	var rs []nfRule
	for attempt := 0; ; attempt++ {
		_, rs, ok, err = n.chainRules(d.nfFamily(), table, chain)
		if !errors.Is(err, errDumpInterrupted) || attempt == 5 {
			break
		}
	}
	if err != nil || !ok {
		return nil, ok, err
	}
	for _, r := range rs {
		l := listed{handle: r.handle}
		if s, good := decodeXTSpec(d.fam, r.exprs); good && len(r.udata) == 0 {
			l.text = s.text()
		} else {
			l.text, l.opaque = opaqueText(d.fam, r), true
		}
		rules = append(rules, l)
	}
	return rules, true, nil
}

// opaqueText stands for a rule the codec does not know: unique (its handle), with its
// comment and jump when it has them, so owners are still recognized.
func opaqueText(fam Family, r nfRule) string {
	b := []string{"-m", "podwire-undecoded", "--handle", strconv.FormatUint(r.handle, 10)}
	for _, e := range r.exprs {
		a, err := decodeAttrs(e.data)
		if err != nil {
			continue
		}
		switch e.name {
		case "match":
			if cstr(a.get(1)) == "comment" {
				b = append(b, "-m", "comment", "--comment", xtSaveString(cstr(a.get(3))))
			}
		case "immediate":
			if s, ok := decodeXTSpec(fam, []nfExpr{e}); ok && s.target.kind == "jump" {
				b = append(b, "-j", s.target.name)
			}
		}
	}
	return strings.Join(b, " ")
}

func (d *xtDirect) list(table, chain string) (string, error) {
	n, err := d.conn()
	if err != nil {
		return "", err
	}
	rules, ok, err := d.readChain(n, table, chain)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	switch {
	case isBase(table, chain):
		b.WriteString("-P " + chain + " ACCEPT\n")
	case !ok:
		return "", notFound("%s -t %s -S %s: chain `%s' does not exist", d.tool(), table, chain, chain)
	default:
		b.WriteString("-N " + chain + "\n")
	}
	for _, r := range rules {
		b.WriteString("-A " + chain + " " + r.text + "\n")
	}
	return b.String(), nil
}

func (d *xtDirect) tool() string {
	bin, _ := binaries(d.fam)
	return bin + " (nf_tables, direct)"
}

func (d *xtDirect) check(table, chain string, spec []string) error {
	want, err := canonicalText(d.fam, spec)
	if err != nil {
		return err
	}
	n, err := d.conn()
	if err != nil {
		return err
	}
	rules, _, err := d.readChain(n, table, chain)
	if err != nil {
		return err
	}
	for _, r := range rules {
		if r.is(want, nil) {
			return nil
		}
	}
	return fmt.Errorf("%s -t %s -C %s %s: no such rule", d.tool(), table, chain, strings.Join(spec, " "))
}

// canonicalText returns spec as the listing prints it.
func canonicalText(fam Family, spec []string) (string, error) {
	s, err := parseXTSpec(fam, spec)
	if err != nil {
		return "", err
	}
	return s.text(), nil
}

// xtOp is one line of a restore script.
type xtOp struct {
	line  int
	op    string // ":" declare (create, or flush if it exists), -A, -I, -D, -F, -X
	chain string
	spec  xtSpec
	del   []string // -D: the rule's tokens as the script gives them
	// delText is the -D rule as the listing prints it, when the codec parses it.
	delText string
}

// parseXTScript parses an iptables-restore script of one table.
func parseXTScript(fam Family, script string) (table string, ops []xtOp, err error) {
	committed := false
	for i, raw := range strings.Split(script, "\n") {
		line := strings.TrimSpace(raw)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if committed {
			return "", nil, unsupported("more than one table")
		}
		switch {
		case strings.HasPrefix(line, "*"):
			if table != "" {
				return "", nil, unsupported("more than one table")
			}
			table = line[1:]
			if _, ok := xtBaseChains[table]; !ok {
				return "", nil, unsupported("table %q", table)
			}
			continue
		case line == "COMMIT":
			committed = true
			continue
		case table == "":
			return "", nil, unsupported("line outside a table")
		case strings.HasPrefix(line, ":"):
			f := strings.Fields(line[1:])
			if len(f) != 3 || f[1] != "-" || isBase(table, f[0]) || !validChainName(f[0]) {
				return "", nil, unsupported("declaration %q", line)
			}
			ops = append(ops, xtOp{line: i + 1, op: ":", chain: f[0]})
			continue
		}
		tok := xtTokens(line)
		if len(tok) < 2 || !validChainName(tok[1]) {
			return "", nil, unsupported("line %q", line)
		}
		op := xtOp{line: i + 1, op: tok[0], chain: tok[1]}
		rest := tok[2:]
		switch op.op {
		case "-A":
			op.spec, err = parseXTSpec(fam, rest)
		case "-I":
			if len(rest) > 0 && rest[0] == "1" {
				rest = rest[1:]
			}
			op.spec, err = parseXTSpec(fam, rest)
		case "-D":
			op.del = rest
			if op.delText, err = canonicalText(fam, rest); err != nil {
				// A listed rule the codec could not decode: its opaque text names it.
				err = nil
			}
		case "-F", "-X":
			if len(rest) != 0 {
				return "", nil, unsupported("line %q", line)
			}
		default:
			return "", nil, unsupported("command %q", op.op)
		}
		if err != nil {
			return "", nil, err
		}
		ops = append(ops, op)
	}
	if table == "" || !committed {
		return "", nil, unsupported("script without a table or COMMIT")
	}
	return table, ops, nil
}

// restore applies a script atomically, as iptables-restore --noflush would.
func (d *xtDirect) restore(script string) error {
	table, ops, err := parseXTScript(d.fam, script)
	if err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		n, err := d.conn()
		if err != nil {
			return err
		}
		gen, msgs, err := d.plan(n, table, ops)
		if err != nil {
			return err
		}
		err = n.commit(gen, msgs)
		if err == nil {
			return nil
		}
		if errors.Is(err, errGenChanged) && attempt < 20 {
			continue
		}
		return fmt.Errorf("%s-restore: %w", d.tool(), err)
	}
}

// xtModel is what plan knows of the table while it walks a script.
type xtModel struct {
	table  bool
	chains map[string]bool     // exists (after the ops so far)
	rules  map[string][]listed // chains listed for -D, minus what was deleted
	added  map[string]bool     // chains this script appended or inserted into
}

// plan reads what the script depends on at one generation and turns it into nf_tables
// messages.
func (d *xtDirect) plan(n *nfnl, table string, ops []xtOp) (uint32, []nfMsg, error) {
	fam := d.nfFamily()
	// Everything the script names, read in one round trip.
	var names []string
	seen := map[string]bool{}
	for _, op := range ops {
		for _, c := range []string{op.chain, op.spec.target.name} {
			if c != "" && !seen[c] && (c == op.chain || op.spec.target.kind == "jump") {
				seen[c] = true
				names = append(names, c)
			}
		}
	}
	gen, tableOK, exist, err := n.state(fam, table, names)
	if err != nil {
		return 0, nil, err
	}
	m := xtModel{table: tableOK, chains: exist, rules: map[string][]listed{}, added: map[string]bool{}}
	exists := func(c string) (bool, error) {
		if v, ok := m.chains[c]; ok {
			return v, nil
		}
		if !m.table {
			m.chains[c] = false
			return false, nil
		}
		_, ok, err := n.chain(fam, table, c)
		m.chains[c] = ok
		return ok, err
	}
	var msgs []nfMsg
	chainAttrs := func(c string) attrs {
		a := newAttrs()
		a.str(unix.NFTA_CHAIN_TABLE, table)
		a.str(unix.NFTA_CHAIN_NAME, c)
		return a
	}
	needTable := func() {
		if !m.table {
			a := newAttrs()
			a.str(unix.NFTA_TABLE_NAME, table)
			a.u32(unix.NFTA_TABLE_FLAGS, 0)
			msgs = append(msgs, nfMsg{typ: unix.NFT_MSG_NEWTABLE, fam: fam, flags: netlink.Create, attrs: a.bytes()})
			m.table = true
		}
	}
	needChain := func(c string, line int) error {
		ok, err := exists(c)
		if err != nil || ok {
			return err
		}
		hook, base := xtBaseChains[table][c]
		if !base {
			return fmt.Errorf("line %d: chain '%s' does not exist", line, c)
		}
		needTable()
		a := chainAttrs(c)
		a.nest(unix.NFTA_CHAIN_HOOK, func(h attrs) {
			h.u32(unix.NFTA_HOOK_HOOKNUM, uint32(hook[0]))
			h.u32(unix.NFTA_HOOK_PRIORITY, uint32(hook[1]))
		})
		a.u32(unix.NFTA_CHAIN_POLICY, nfAccept)
		a.str(unix.NFTA_CHAIN_TYPE, table)
		msgs = append(msgs, nfMsg{typ: unix.NFT_MSG_NEWCHAIN, fam: fam, flags: netlink.Create, attrs: a.bytes()})
		m.chains[c] = true
		return nil
	}
	flush := func(c string) {
		a := newAttrs()
		a.str(unix.NFTA_RULE_TABLE, table)
		a.str(unix.NFTA_RULE_CHAIN, c)
		msgs = append(msgs, nfMsg{typ: unix.NFT_MSG_DELRULE, fam: fam, attrs: a.bytes()})
		m.rules[c] = []listed{}
	}
	for _, op := range ops {
		switch op.op {
		case ":":
			ok, err := exists(op.chain)
			if err != nil {
				return 0, nil, err
			}
			if ok {
				flush(op.chain)
				continue
			}
			needTable()
			msgs = append(msgs, nfMsg{typ: unix.NFT_MSG_NEWCHAIN, fam: fam, flags: netlink.Create, attrs: chainAttrs(op.chain).bytes()})
			m.chains[op.chain] = true
			m.rules[op.chain] = []listed{}
		case "-A", "-I":
			if err := needChain(op.chain, op.line); err != nil {
				return 0, nil, err
			}
			if op.spec.target.kind == "jump" {
				if ok, err := exists(op.spec.target.name); err != nil || !ok {
					if err == nil {
						err = fmt.Errorf("line %d: chain '%s' does not exist", op.line, op.spec.target.name)
					}
					return 0, nil, err
				}
			}
			enc, err := encodeXTSpec(d.fam, op.spec)
			if err != nil {
				return 0, nil, err
			}
			a := newAttrs()
			a.str(unix.NFTA_RULE_TABLE, table)
			a.str(unix.NFTA_RULE_CHAIN, op.chain)
			a.nest(unix.NFTA_RULE_EXPRESSIONS, func(l attrs) {
				for _, e := range enc.exprs {
					l.nest(unix.NFTA_LIST_ELEM, func(el attrs) {
						el.str(unix.NFTA_EXPR_NAME, e.name)
						el.e.Bytes(unix.NFTA_EXPR_DATA|unix.NLA_F_NESTED, e.data)
					})
				}
			})
			a.nest(unix.NFTA_RULE_COMPAT, func(c attrs) {
				c.u32(unix.NFTA_RULE_COMPAT_PROTO, enc.compatProto)
				c.u32(unix.NFTA_RULE_COMPAT_FLAGS, 0)
			})
			flags := netlink.Create
			if op.op == "-A" {
				flags |= netlink.Append
			}
			msgs = append(msgs, nfMsg{typ: unix.NFT_MSG_NEWRULE, fam: fam, flags: flags, attrs: a.bytes()})
			m.added[op.chain] = true
		case "-D":
			if m.added[op.chain] {
				// The listing below does not hold rules this script added.
				return 0, nil, unsupported("-D after -A/-I in chain %s", op.chain)
			}
			rules, ok := m.rules[op.chain]
			if !ok {
				listedRules, found, err := d.readChain(n, table, op.chain)
				if err != nil {
					return 0, nil, err
				}
				if !found {
					return 0, nil, fmt.Errorf("line %d: chain '%s' does not exist", op.line, op.chain)
				}
				rules = listedRules
			}
			idx := -1
			for i, r := range rules {
				if r.is(op.delText, op.del) {
					idx = i
					break
				}
			}
			if idx < 0 {
				for _, r := range rules {
					if r.opaque {
						// iptables might take an undecoded rule for this one.
						return 0, nil, unsupported("chain %s has rules the codec does not know", op.chain)
					}
				}
				return 0, nil, fmt.Errorf("line %d: no rule %q in chain %s (does a matching rule exist in that chain?)", op.line, strings.Join(op.del, " "), op.chain)
			}
			a := newAttrs()
			a.str(unix.NFTA_RULE_TABLE, table)
			a.str(unix.NFTA_RULE_CHAIN, op.chain)
			a.u64(unix.NFTA_RULE_HANDLE, rules[idx].handle)
			msgs = append(msgs, nfMsg{typ: unix.NFT_MSG_DELRULE, fam: fam, attrs: a.bytes()})
			m.rules[op.chain] = append(rules[:idx:idx], rules[idx+1:]...)
		case "-F":
			if ok, err := exists(op.chain); err != nil || !ok {
				if err == nil && !isBase(table, op.chain) {
					err = fmt.Errorf("line %d: chain '%s' does not exist", op.line, op.chain)
				}
				if err != nil {
					return 0, nil, err
				}
				continue
			}
			flush(op.chain)
		case "-X":
			if isBase(table, op.chain) {
				return 0, nil, unsupported("deleting built-in chain %s", op.chain)
			}
			if ok, err := exists(op.chain); err != nil || !ok {
				if err == nil {
					err = fmt.Errorf("line %d: chain '%s' does not exist", op.line, op.chain)
				}
				return 0, nil, err
			}
			// NLM_F_NONREC: a chain that still has rules is an error, as in iptables.
			msgs = append(msgs, nfMsg{typ: unix.NFT_MSG_DELCHAIN, fam: fam, flags: unix.NLM_F_NONREC, attrs: chainAttrs(op.chain).bytes()})
			m.chains[op.chain] = false
			delete(m.rules, op.chain)
		}
	}
	return gen, msgs, nil
}

// xtSelfCheck compares, in scratch network namespaces, what the installed restore
// binary and xtDirect make of the same scripts.
func xtSelfCheck(fam Family, restore string) error {
	scripts := xtSelfCheckScripts(fam)
	var theirs, ours []string
	var err error
	if theirs, err = inScratchNetns(func() ([]string, error) {
		var all []string
		for _, s := range scripts {
			cmd := exec.Command(restore, "--noflush")
			cmd.Stdin = strings.NewReader(s)
			if out, err := cmd.CombinedOutput(); err != nil {
				return nil, fmt.Errorf("%s: %v: %s", restore, err, out)
			}
			snap, err := xtSnapshot(fam)
			if err != nil {
				return nil, err
			}
			if err := xtSameListing(fam, snap); err != nil {
				return nil, err
			}
			all = append(all, snap...)
		}
		return all, nil
	}); err != nil {
		return err
	}
	if ours, err = inScratchNetns(func() ([]string, error) {
		d := &xtDirect{fam: fam}
		defer d.drop()
		var all []string
		for _, s := range scripts {
			if err := d.restore(s); err != nil {
				return nil, err
			}
			snap, err := xtSnapshot(fam)
			if err != nil {
				return nil, err
			}
			all = append(all, snap...)
		}
		return all, nil
	}); err != nil {
		return err
	}
	if strings.Join(theirs, "\n") != strings.Join(ours, "\n") {
		return fmt.Errorf("the installed %s stores these rules differently:\n%s\nvs\n%s", restore, strings.Join(theirs, "\n"), strings.Join(ours, "\n"))
	}
	return nil
}

// xtSameListing compares the rules of a snapshot, as xtDirect lists them, with the
// installed iptables' own listing.
func xtSameListing(fam Family, snap []string) error {
	bin, _ := binaries(fam)
	out, err := exec.Command(bin, "-t", "nat", "-S").Output()
	if err != nil {
		return fmt.Errorf("%s -t nat -S: %w", bin, err)
	}
	var want, got []string
	for _, c := range xtSelfCheckChains {
		for _, l := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(l, "-A "+c+" ") {
				want = append(want, "  "+l)
			}
		}
	}
	for _, l := range snap {
		if strings.HasPrefix(l, "  -A ") {
			got = append(got, l)
		}
	}
	if strings.Join(want, "\n") != strings.Join(got, "\n") {
		return fmt.Errorf("%s lists these rules differently:\n%s\nvs\n%s", bin, strings.Join(want, "\n"), strings.Join(got, "\n"))
	}
	return nil
}

// inScratchNetns runs f on a thread in a new, empty network namespace; the thread ends
// with f (it is never returned to the Go scheduler).
func inScratchNetns(f func() ([]string, error)) ([]string, error) {
	type result struct {
		out []string
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ch <- result{err: fmt.Errorf("creating a scratch network namespace: %w", err)}
			return
		}
		out, err := f()
		ch <- result{out, err}
	}()
	r := <-ch
	return r.out, r.err
}

// xtSelfCheckChains are the chains the self-check scripts use.
var xtSelfCheckChains = []string{"PREROUTING", "OUTPUT", "POSTROUTING", "PW-SELFCHECK-A", "PW-SELFCHECK-B", "PW-SELFCHECK-C", "PW-SELFCHECK-D"}

// xtSnapshot renders the nat table of the current network namespace: each chain's
// kernel attributes (hook, priority, policy, type), each rule's expressions byte for
// byte, and each rule's text as xtDirect lists it. (Chain attributes 10 and 13 are
// NFTA_CHAIN_FLAGS and NFTA_CHAIN_USERDATA.)
func xtSnapshot(fam Family) ([]string, error) {
	d := &xtDirect{fam: fam}
	n, err := d.conn()
	if err != nil {
		return nil, err
	}
	defer d.drop()
	var out []string
	for _, c := range xtSelfCheckChains {
		ch, ok, err := n.chain(d.nfFamily(), "nat", c)
		if err != nil {
			return nil, err
		}
		if !ok {
			out = append(out, "no chain "+c)
			continue
		}
		out = append(out, fmt.Sprintf("chain %s hooked=%v hook=%d prio=%d policy=%d type=%q flags=%x udata=%x",
			c, ch.hooked, ch.hook, ch.prio, ch.policy, ch.typ, ch.attrs.get(10), ch.attrs.get(13)))
		rs, err := n.rules(d.nfFamily(), "nat", c)
		if err != nil {
			return nil, err
		}
		listing, _, err := d.readChain(n, "nat", c)
		if err != nil {
			return nil, err
		}
		for i, r := range rs {
			line := fmt.Sprintf("  rule udata=%x", r.udata)
			for _, e := range r.exprs {
				line += fmt.Sprintf(" %s:%x", e.name, e.data)
			}
			out = append(out, line, "  -A "+c+" "+listing[i].text)
		}
	}
	return out, nil
}

// xtSelfCheckScripts cover every rule shape the iptables backends write (host ports,
// masquerade) and every script operation (declare, append, insert, delete, flush,
// delete chain); the second script edits what the first made.
func xtSelfCheckScripts(fam Family) []string {
	a, b, c := "10.88.0.0/16", "10.88.0.5/32", "10.80.0.0/12"
	to, toNoPort := "10.88.0.5:80", "10.88.0.6"
	if fam == IPv6 {
		a, b, c = "fd00:88::/64", "fd00:88::5/128", "fd00:80::/60"
		to, toNoPort = "[fd00:88::5]:80", "fd00:88::6"
	}
	one := fmt.Sprintf(`*nat
:PW-SELFCHECK-A - [0:0]
:PW-SELFCHECK-B - [0:0]
:PW-SELFCHECK-C - [0:0]
:PW-SELFCHECK-D - [0:0]
-A PREROUTING -m addrtype --dst-type LOCAL -j PW-SELFCHECK-A
-A OUTPUT -m addrtype --dst-type LOCAL -j PW-SELFCHECK-A
-I POSTROUTING 1 -m comment --comment "CNI portfwd requiring masquerade" -j PW-SELFCHECK-C
-A PW-SELFCHECK-C -m mark --mark 0x2000/0x2000 -j MASQUERADE
-A PW-SELFCHECK-C -m mark --mark 0x4000 -j RETURN
-A PW-SELFCHECK-C -s %[3]s ! -d %[1]s -m comment --comment "podwire masq" -j ACCEPT
-A PW-SELFCHECK-C ! -s %[2]s -j MASQUERADE
-A PW-SELFCHECK-A -p tcp -m multiport --dports 8080,8443 -m comment --comment "pw:1:abc" -j PW-SELFCHECK-B
-A PW-SELFCHECK-A -s %[1]s ! -d %[2]s ! -i eth0 -p udp -m multiport --dports 53 -m comment --comment "pw: \"q\" \\ x'" -j PW-SELFCHECK-B
-A PW-SELFCHECK-A -i veth+ -p tcp -m comment --comment "dnat name: \"net1\" id: \"c1\"" -m multiport --dports 9090 -j PW-SELFCHECK-B
-A PW-SELFCHECK-B -s %[1]s -p tcp -m tcp --dport 8080 -m comment --comment "pw:1:abc" -j MARK --set-xmark 0x2000/0x2000
-A PW-SELFCHECK-B -p tcp -m tcp --dport 8080 -m comment --comment "pw:1:abc" -j DNAT --to-destination %[4]s
-A PW-SELFCHECK-B -p udp -m udp --dport 53 -m comment --comment pw-x -j PW-SELFCHECK-D
-A PW-SELFCHECK-B -d %[3]s -j DNAT --to-destination %[5]s
COMMIT
`, a, b, c, to, toNoPort)
	two := fmt.Sprintf(`*nat
:PW-SELFCHECK-C - [0:0]
-D PW-SELFCHECK-B -p tcp -m tcp --dport 8080 -m comment --comment "pw:1:abc" -j DNAT --to-destination %[2]s
-D OUTPUT -m addrtype --dst-type LOCAL -j PW-SELFCHECK-A
-F PW-SELFCHECK-A
-I PW-SELFCHECK-B 1 -s %[1]s -p udp -m udp --dport 5353 -j RETURN
-A PW-SELFCHECK-C -j ACCEPT
COMMIT
`, a, to)
	return []string{one, two}
}
