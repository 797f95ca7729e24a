// SPDX-License-Identifier: Apache-2.0

// Package nodestate takes a text snapshot of everything podwire may touch on a node
// (links, addresses, routes, sysctls, iptables and nftables rules, qdiscs and filters,
// lease files) inside one network namespace, so a test can assert that DEL or GC
// returned the node to exactly its previous state; and lists the test process's
// descendants (Descendants), so a test can assert that nothing it started is left.
package nodestate

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

// Snapshot is the node state as sections of normalized text, keyed by section name.
type Snapshot map[string]string

// Take snapshots the netns at nsPath ("" for the caller's own) and the lease files
// under dataDirs.
func Take(nsPath string, dataDirs ...string) (Snapshot, error) {
	s := Snapshot{}
	run := func(name string, args ...string) (string, error) {
		cmd := exec.Command(name, args...)
		if nsPath != "" {
			cmd = exec.Command("nsenter", append([]string{"--net=" + nsPath, name}, args...)...)
		}
		out, err := cmd.CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
		}
		return string(out), nil
	}
	var err error
	// A veth whose peer's namespace is being destroyed shows "Peer netns reference is
	// invalid" until the kernel's asynchronous namespace cleanup deletes the pair (a
	// pod netns the test has just removed): wait for it to settle.
	for i := 0; ; i++ {
		if s["links"], err = run("ip", "-d", "-o", "link", "show"); err != nil {
			return nil, err
		}
		if !strings.Contains(s["links"], "Peer netns reference is invalid") || i == 40 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	s["links"] = normLinks(s["links"])
	if s["addrs"], err = run("ip", "-o", "addr", "show"); err != nil {
		return nil, err
	}
	s["addrs"] = dropLifetimes(s["addrs"])
	if s["routes4"], err = run("ip", "-4", "route", "show", "table", "all"); err != nil {
		return nil, err
	}
	if s["routes6"], err = run("ip", "-6", "route", "show", "table", "all"); err != nil {
		return nil, err
	}
	for _, tool := range []string{"iptables-save", "ip6tables-save"} {
		out, err := run(tool)
		if err != nil {
			return nil, err
		}
		s[tool] = normIptables(out)
	}
	nftJSON, err := run("nft", "-j", "list", "ruleset")
	if err != nil {
		return nil, err
	}
	if s["nft"], err = normNft(nftJSON); err != nil {
		return nil, err
	}
	if s["qdiscs"], err = run("tc", "qdisc", "show"); err != nil {
		return nil, err
	}
	if s["filters"], err = tcFilters(run); err != nil {
		return nil, err
	}
	if s["sysctls"], err = sysctls(run); err != nil {
		return nil, err
	}
	s["leases"], err = leases(dataDirs)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// Diff describes how b differs from a, section by section; "" when equal.
func Diff(a, b Snapshot) string {
	var keys []string
	for k := range a {
		keys = append(keys, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var out strings.Builder
	for _, k := range keys {
		if a[k] == b[k] {
			continue
		}
		before, after := lineSet(a[k]), lineSet(b[k])
		fmt.Fprintf(&out, "== %s\n", k)
		for _, l := range sortedKeys(before) {
			if !after[l] {
				fmt.Fprintf(&out, "- %s\n", l)
			}
		}
		for _, l := range sortedKeys(after) {
			if !before[l] {
				fmt.Fprintf(&out, "+ %s\n", l)
			}
		}
	}
	return out.String()
}

func lineSet(s string) map[string]bool {
	m := map[string]bool{}
	for _, l := range strings.Split(s, "\n") {
		// iproute2 ends some lines with a space depending on attribute order.
		if l = strings.TrimSpace(l); l != "" {
			m[l] = true
		}
	}
	return m
}

func sortedKeys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

var (
	ifindexRe = regexp.MustCompile(`^\d+: `)
	// Bridge and bridge port timers count down on their own; they are not state anyone
	// set (the port timers matter when a snapshot is taken with a pod running).
	brTimerRe  = regexp.MustCompile(`(hello_timer|tcn_timer|topology_change_timer|gc_timer|message_age_timer|forward_delay_timer|hold_timer)\s+[\d.]+`)
	lifetimeRe = regexp.MustCompile(`\\\s+valid_lft.*$`)
	// Rule counters count traffic, not configuration (iptables-nft adds one to each rule).
	nftCounterRe = regexp.MustCompile(`"counter":\s*\{"packets":\s*\d+,\s*"bytes":\s*\d+\}`)
)

// normLinks drops interface indexes, which change as links come and go.
func normLinks(s string) string {
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		out = append(out, brTimerRe.ReplaceAllString(ifindexRe.ReplaceAllString(l, ""), "$1"))
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}

func dropLifetimes(s string) string {
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		out = append(out, ifindexRe.ReplaceAllString(lifetimeRe.ReplaceAllString(l, ""), ""))
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}

// normIptables keeps rules and non-builtin chains, prefixed by their table; it drops
// comments, counters and the empty built-in chains iptables-nft creates on first use.
func normIptables(s string) string {
	var out []string
	table := ""
	for _, l := range strings.Split(s, "\n") {
		switch {
		case strings.HasPrefix(l, "*"):
			table = l[1:]
		case strings.HasPrefix(l, ":"):
			f := strings.Fields(l)
			if len(f) >= 2 && f[1] == "-" { // user-defined chain
				out = append(out, table+" chain "+f[0][1:])
			} else if len(f) >= 2 && f[1] != "ACCEPT" {
				out = append(out, table+" policy "+f[0][1:]+" "+f[1])
			}
		case strings.HasPrefix(l, "-A"):
			out = append(out, table+" "+l)
		}
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}

// xtablesTables are the tables iptables-nft creates; empty ones are not state.
var xtablesTables = map[string]bool{"filter": true, "nat": true, "mangle": true, "raw": true, "security": true}

// normNft lists tables, chains, sets and rules; it drops empty base chains with policy
// accept and empty xtables tables, which iptables-nft leaves behind and which change
// nothing.
func normNft(js string) (string, error) {
	var doc struct {
		Nftables []map[string]json.RawMessage `json:"nftables"`
	}
	if err := json.Unmarshal([]byte(js), &doc); err != nil {
		return "", fmt.Errorf("parsing nft -j output: %w", err)
	}
	type obj struct {
		Family string          `json:"family"`
		Table  string          `json:"table"`
		Name   string          `json:"name"`
		Chain  string          `json:"chain"`
		Hook   string          `json:"hook"`
		Policy string          `json:"policy"`
		Type   string          `json:"type"`
		Prio   *int            `json:"prio"`
		Expr   json.RawMessage `json:"expr"`
	}
	var tables []string
	chains := map[string]obj{}
	rules := map[string][]string{} // chain key -> rules
	other := map[string][]string{} // table key -> sets, maps
	for _, e := range doc.Nftables {
		for kind, raw := range e {
			var o obj
			_ = json.Unmarshal(raw, &o)
			switch kind {
			case "table":
				tables = append(tables, o.Family+" "+o.Name)
			case "chain":
				chains[o.Family+" "+o.Table+" "+o.Name] = o
			case "rule":
				k := o.Family + " " + o.Table + " " + o.Chain
				rules[k] = append(rules[k], nftCounterRe.ReplaceAllString(string(o.Expr), `"counter": {}`))
			case "set", "map", "flowtable", "ct helper", "limit", "counter", "quota":
				k := o.Family + " " + o.Table
				other[k] = append(other[k], kind+" "+o.Name)
			}
		}
	}
	var out []string
	for _, t := range tables {
		var lines []string
		for k, c := range chains {
			if !strings.HasPrefix(k, t+" ") {
				continue
			}
			if c.Hook != "" && len(rules[k]) == 0 && (c.Policy == "" || c.Policy == "accept") {
				continue
			}
			desc := "chain " + k
			if c.Hook != "" {
				desc += fmt.Sprintf(" hook=%s type=%s policy=%s", c.Hook, c.Type, c.Policy)
			}
			lines = append(lines, desc)
			for _, r := range rules[k] {
				lines = append(lines, "rule "+k+" "+r)
			}
		}
		lines = append(lines, other[t]...)
		name := strings.SplitN(t, " ", 2)[1]
		if len(lines) == 0 && xtablesTables[name] {
			continue
		}
		out = append(out, "table "+t)
		out = append(out, lines...)
	}
	sort.Strings(out)
	return strings.Join(out, "\n"), nil
}

func tcFilters(run func(string, ...string) (string, error)) (string, error) {
	links, err := run("ip", "-o", "link", "show")
	if err != nil {
		return "", err
	}
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(links), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		dev := strings.SplitN(strings.TrimSuffix(f[1], ":"), "@", 2)[0]
		for _, parent := range []string{"ingress", "egress"} {
			o, err := run("tc", "filter", "show", "dev", dev, parent)
			if err != nil {
				continue // no clsact/ingress qdisc: nothing to list
			}
			if s := strings.TrimSpace(o); s != "" {
				out = append(out, dev+" "+parent+": "+strings.ReplaceAll(s, "\n", " | "))
			}
		}
	}
	sort.Strings(out)
	return strings.Join(out, "\n"), nil
}

// sysctls reads the forwarding, bridge-netfilter and route_localnet knobs podwire sets.
func sysctls(run func(string, ...string) (string, error)) (string, error) {
	out, err := run("sh", "-c", `for f in /proc/sys/net/ipv4/ip_forward /proc/sys/net/ipv6/conf/all/forwarding /proc/sys/net/bridge/bridge-nf-call-iptables /proc/sys/net/bridge/bridge-nf-call-ip6tables /proc/sys/net/ipv4/conf/*/route_localnet; do [ -e "$f" ] && echo "$f=$(cat $f)"; done; true`)
	return strings.TrimSpace(out), err
}

// Leases is the lease-file section of a snapshot: every address file under dirs with
// its content.
func Leases(dirs ...string) (string, error) { return leases(dirs) }

func leases(dirs []string) (string, error) {
	var out []string
	for _, d := range dirs {
		err := filepath.Walk(d, func(p string, fi os.FileInfo, err error) error {
			if err != nil {
				if os.IsNotExist(err) {
					return nil
				}
				return err
			}
			// Only address files are leases; last_reserved_ip.*, the lock and any index
			// are bookkeeping that legitimately outlives the pods.
			if fi.IsDir() || net.ParseIP(strings.ReplaceAll(fi.Name(), "_", ":")) == nil {
				return nil
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(d, p)
			out = append(out, rel+": "+strings.ReplaceAll(string(b), "\n", `\n`))
			return nil
		})
		if err != nil {
			return "", fmt.Errorf("listing leases under %s: %w", d, err)
		}
	}
	sort.Strings(out)
	return strings.Join(out, "\n"), nil
}
