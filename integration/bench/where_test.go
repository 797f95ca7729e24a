// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"

	"github.com/podwire/podwire/integration/nstest"
	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/netfilter"
)

// This file is the table "Where the time above the floor goes": per plugin, podwire's
// section 2 median over the floor's, next to the section 2b operations its verb waits
// for and the processes it starts (counted in an untimed pass of section 2).

var whereHeader = []string{"plugin (section 2)", "verb", "podwire − floor ms", "kernel operations it waits for (section 2b medians, ms)",
	"processes it starts (untimed pass)", "rest ms", "the rest, where over 3 ms: what it is, and can it go"}

const whereIntro = "From the sections below, podwire with its default backends (as section 2 runs it). \"podwire − floor\" is " +
	"section 2's median difference, the time the plugin adds to the runtime's own process start. Next to it, the section " +
	"2b operations the verb waits for (what an exit costs is given over a bare exit), and the processes the plugin starts " +
	"from PATH, logged by wrappers in one untimed ADD/DEL after the timing. \"rest\" is what remains: podwire − floor − " +
	"those operations − the processes at 2b's one-process cost (`iptables --version`: a restore that changes rules " +
	"costs more, so the rest is an upper bound of the plugin's own work, and noise can make it negative). " +
	"Every wait is the plugin's own: bridge's and bandwidth's DEL wait for the link deletion to return (the kernel's " +
	"wait to free the link included), and a DEL whose nf_tables socket deleted rules waits in its exit for the kernel " +
	"to free them; no plugin starts a process of its own binary."

// whereRows are the plugins of the table, by their key in env.alone.
var whereRows = []string{"loopback", "host-local", "bridge(ipMasq)+host-local", "portmap", "bandwidth"}

// backendKinds is what podwire's plugins pick with no backend configured: "nftables",
// "iptables" or "unknown"; xtNFT says the iptables tools are iptables-nft.
type backendKinds struct {
	masq, portmap string
	xtNFT         bool
}

func (k *backendKinds) String() string {
	return fmt.Sprintf("bridge ipMasq on %s, portmap on %s", k.masq, k.portmap)
}

// defaultKinds finds podwire's default backends on this machine from what an untimed
// full-chain ADD (in a host netns of its own) leaves: the reference's nftables
// masquerade table or podwire's hostport table, or the iptables chains of either.
func (e *env) defaultKinds(t *testing.T) *backendKinds {
	if e.defaults != nil {
		return e.defaults
	}
	k := &backendKinds{masq: "unknown", portmap: "unknown"}
	e.defaults = k
	if !e.ours.Has(chainTypes...) {
		return k
	}
	h := nstest.New(t)
	r := &runner{label: "podwire", set: e.ours, h: h, pod: h.NewPod()}
	list, err := e.conflist(r, "bench", chainConf("", ""))
	must(t, err, "conflist")
	rt := rtFor(r, "bench-backends", "eth0", chainCaps(0))
	c := e.cni(r.set)
	var tables []string
	var nat string
	err = h.InHost(func() error {
		if _, err := c.AddNetworkList(ctxBG(), list, rt); err != nil {
			_ = c.DelNetworkList(ctxBG(), list, rt)
			return err
		}
		defer func() { _ = c.DelNetworkList(ctxBG(), list, rt) }()
		nat, _ = nstest.RunIn(h.HostNS, "iptables", "-w", "-t", "nat", "-S")
		conn, err := nftables.New()
		if err != nil {
			return err
		}
		ts, err := conn.ListTables()
		if err != nil {
			return err
		}
		for _, tb := range ts {
			tables = append(tables, tb.Name)
		}
		return nil
	})
	if err != nil {
		t.Logf("finding podwire's default backends: %v", err)
		return k
	}
	has := func(name string) bool {
		for _, n := range tables {
			if n == name {
				return true
			}
		}
		return false
	}
	pick := func(nft, ipt bool) string {
		switch {
		case nft:
			return "nftables"
		case ipt:
			return "iptables"
		}
		return "unknown"
	}
	k.masq = pick(has("cni_plugins_masquerade"),
		strings.Contains(nat, netfilter.MasqChain(cniplumb.Owner{Network: "bench", ContainerID: rt.ContainerID})))
	k.portmap = pick(has(netfilter.TableName(netfilter.HostPortFeature)), strings.Contains(nat, "CNI-HOSTPORT-DNAT"))
	if out, err := exec.Command("iptables", "--version").Output(); err == nil {
		k.xtNFT = strings.Contains(string(out), "nf_tables")
	}
	t.Logf("podwire's default backends: %s", k)
	return k
}

// execTools are the programs whose runs countExecs logs (those found in PATH). nft is
// left out: podwire runs it only for its version check, whose verdict is cached per
// nft binary (cniplumb.FileVerdict), and a wrapper in its place would defeat the cache
// (the timed runs start no nft).
var execTools = []string{"iptables", "ip6tables", "iptables-restore", "ip6tables-restore", "iptables-save",
	"ip6tables-save", "iptables-legacy", "iptables-nft", "ip", "tc", "sysctl", "conntrack", "modprobe"}

// countExecs runs one untimed ADD and DEL of text on runner r with logging wrappers for
// execTools first in PATH (which libcni passes to plugins) and records what plugin's
// verbs started in env.execs. Each wrapper is reached through a symlink named like the
// tool and is itself named like the file the tool resolves to (xtables-nft-multi), so
// a plugin that tells iptables-nft from iptables-legacy by that name still can.
func (e *env) countExecs(t *testing.T, plugin string, r *runner, text, ifName string, caps map[string]any) {
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	bin := filepath.Join(dir, "bin")
	must(t, os.Mkdir(bin, 0o755), "making the wrapper dir")
	for _, tool := range execTools {
		real, err := exec.LookPath(tool)
		if err != nil {
			continue
		}
		resolved, err := filepath.EvalSymlinks(real)
		if err != nil {
			continue
		}
		wrapper := filepath.Join(dir, "x", tool, filepath.Base(resolved))
		must(t, os.MkdirAll(filepath.Dir(wrapper), 0o755), "making the wrapper dir")
		script := fmt.Sprintf("#!/bin/sh\necho \"%s $*\" >> %s\nexec %s \"$@\"\n", tool, log, real)
		must(t, os.WriteFile(wrapper, []byte(script), 0o755), "writing a wrapper")
		must(t, os.Symlink(wrapper, filepath.Join(bin, tool)), "linking a wrapper")
	}
	read := func() []string {
		b, _ := os.ReadFile(log)
		_ = os.Remove(log)
		var out []string
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if l != "" {
				out = append(out, l)
			}
		}
		return out
	}
	list, err := e.conflist(r, "bench", text)
	must(t, err, "conflist")
	if r.prep != nil {
		must(t, r.prep(), "preparing %s", r.label)
	}
	old := os.Getenv("PATH")
	must(t, os.Setenv("PATH", bin+":"+old), "setting PATH")
	defer os.Setenv("PATH", old)
	c := e.cni(r.set)
	rt := rtFor(r, "bench-execs", ifName, caps)
	got := map[string][]string{}
	err = r.h.InHost(func() error {
		if _, err := c.AddNetworkList(ctxBG(), list, rt); err != nil {
			_ = c.DelNetworkList(ctxBG(), list, rt)
			return fmt.Errorf("ADD: %w", err)
		}
		got["ADD"] = read()
		if err := c.DelNetworkList(ctxBG(), list, rt); err != nil {
			return fmt.Errorf("DEL: %w", err)
		}
		got["DEL"] = read()
		return nil
	})
	if err != nil {
		t.Errorf("counting %s's processes: %v", plugin, err)
		return
	}
	for verb, l := range got {
		t.Logf("%s %s started: %s", plugin, verb, strings.Join(l, " | "))
	}
	e.execs[plugin] = got
}

// execSummary renders logged processes as "4: iptables --version, iptables -S ×2,
// iptables-restore", grouping the iptables tools' runs by their command option.
func execSummary(lines []string) string {
	if len(lines) == 0 {
		return "none"
	}
	var order []string
	count := map[string]int{}
	for _, l := range lines {
		f := strings.Fields(l)
		key := f[0]
		if key == "iptables" || key == "ip6tables" {
			for _, a := range f[1:] {
				if a == "--version" || (len(a) == 2 && a[0] == '-' && strings.ContainsRune("SCLNAIDXFEZP", rune(a[1]))) {
					key += " " + a
					break
				}
			}
		} else if len(f) > 1 && (key == "ip" || key == "tc" || key == "nft") {
			key += " " + f[1]
		}
		if count[key] == 0 {
			order = append(order, key)
		}
		count[key]++
	}
	var parts []string
	for _, k := range order {
		if count[k] > 1 {
			k = fmt.Sprintf("%s ×%d", k, count[k])
		}
		parts = append(parts, k)
	}
	return fmt.Sprintf("%d: %s", len(lines), strings.Join(parts, ", "))
}

// waitItem is one section 2b operation a verb waits for: the median of key, less the
// median of over when set (an exit over a bare exit).
type waitItem struct {
	label, key, over string
	// overlapped: the verb waits for it while it waits for an earlier item (bridge's
	// DEL removes its rules while the veth deletion blocks in the kernel), so it is
	// shown but not added up.
	overlapped bool
}

// waits are the section 2b operations plugin's verb waits for, with the backends k.
func waits(plugin, verb string, k *backendKinds) []waitItem {
	nftAdd := []waitItem{{label: "nf_tables add batch", key: "nft-add"}, {label: "exit after it", key: "exit-add", over: "exit-bare"}}
	nftDel := []waitItem{{label: "nf_tables delete batch", key: "nft-del"},
		{label: "exit after it (the socket's release waits for the frees)", key: "exit-del", over: "exit-bare"}}
	// An iptables-nft process that deleted rules waits in its exit as 2b's child does.
	var xtDel []waitItem
	if k.xtNFT {
		xtDel = []waitItem{{label: "≈ iptables-restore's exit after deleting rules (iptables-nft; 2b's exit holding the socket)", key: "exit-del", over: "exit-bare"}}
	}
	var out []waitItem
	switch plugin + " " + verb {
	case "bridge(ipMasq)+host-local ADD":
		out = []waitItem{{label: "veth create", key: "veth-add"}}
		if k.masq == "nftables" {
			out = append(out, nftAdd...)
		}
	case "bridge(ipMasq)+host-local DEL":
		out = []waitItem{{label: "veth delete from the pod's side", key: "veth-poddel"}}
		rules := xtDel
		if k.masq == "nftables" {
			rules = nftDel
		}
		for _, w := range rules {
			w.overlapped = true
			out = append(out, w)
		}
	case "portmap ADD":
		if k.portmap == "nftables" {
			out = nftAdd
		}
	case "portmap DEL":
		switch k.portmap {
		case "nftables":
			out = nftDel
		case "iptables":
			out = xtDel
		}
	case "bandwidth ADD":
		out = []waitItem{{label: "IFB create", key: "ifb-add"}}
	case "bandwidth DEL":
		out = []waitItem{{label: "IFB delete", key: "ifb-del"}}
	}
	return out
}

// fillWhere writes the table from section 2's and 2b's samples and the exec counts.
func (e *env) fillWhere() {
	k := e.defaults
	if k == nil {
		k = &backendKinds{masq: "unknown", portmap: "unknown"}
	}
	xt := "iptables-legacy or unknown"
	if k.xtNFT {
		xt = "iptables-nft"
	}
	e.where.note("podwire's default backends on this machine: %s (from the tables an untimed ADD made); the iptables tools are %s", k, xt)
	msOf := func(d time.Duration) float64 { return float64(d) / 1e6 }
	proc := e.kernel["proc"]
	for _, plugin := range whereRows {
		for _, verb := range []string{"ADD", "DEL"} {
			get := func(s *set) sample {
				p := e.alone[plugin][s.Name]
				if p == nil {
					return nil
				}
				if verb == "DEL" {
					return p.del
				}
				return p.add
			}
			o, f := get(e.ours), get(e.floor)
			d := delta(o, f)
			rest, known := 0.0, d != "n/a"
			if known {
				rest = msOf(o.median() - f.median())
			}
			var parts, meanwhile []string
			sum := 0.0
			for _, w := range waits(plugin, verb, k) {
				s, base := e.kernel[w.key], e.kernel[w.over]
				if len(s) == 0 || (w.over != "" && len(base) == 0) {
					parts = append(parts, w.label+" n/a")
					known = false
					continue
				}
				v := msOf(s.median())
				text := fmt.Sprintf("%s %.1f", w.label, v)
				if w.over != "" {
					v -= msOf(base.median())
					text = fmt.Sprintf("%s %+.1f", w.label, v)
				}
				if w.overlapped {
					meanwhile = append(meanwhile, text)
					continue
				}
				parts = append(parts, text)
				sum += v
			}
			kern := "— (none in 2b)"
			if len(parts) > 0 {
				kern = strings.Join(parts, " + ")
				if len(parts) > 1 {
					kern += fmt.Sprintf(" = %.1f", sum)
				}
			}
			if len(meanwhile) > 0 {
				kern += "; meanwhile, not added: " + strings.Join(meanwhile, " + ")
			}
			procs := "n/a"
			if l, ok := e.execs[plugin][verb]; ok {
				procs = execSummary(l)
				if n := len(l); n > 0 {
					if len(proc) > 0 {
						c := float64(n) * msOf(proc.median())
						procs += fmt.Sprintf(" (≈ %.1f)", c)
						sum += c
					} else {
						known = false
					}
				}
			} else {
				known = false
			}
			r, why := "n/a", "—"
			if known {
				r = fmt.Sprintf("%+.1f", rest-sum)
				if rest-sum > 3 {
					why = restWhy(plugin, verb, k)
				}
			}
			e.where.row(plugin, verb, d, kern, procs, r, why)
		}
	}
}

// restWhy says what a plugin's own work above 3 ms is, from what the verb does beyond
// 2b's kernel operations and the processes' bare starts (the plugin's code path, read
// against its README), and whether it can go.
func restWhy(plugin, verb string, k *backendKinds) string {
	switch plugin + " " + verb {
	case "bridge(ipMasq)+host-local ADD":
		return "the netlink requests 2b does not time (bridge lookup, port flags, addresses, routes, sysctls, " +
			"the pod's lo and eth0 up, entering the pod netns) and host-local's lease (the data dir's lock, the " +
			"index entry, the lease staged and renamed into place; no fsync): each is part of making the pod, " +
			"none can go without giving up a check or crash safety"
	case "bridge(ipMasq)+host-local DEL":
		return "host-local's lease removal (the data dir's lock, the index entry, the unlink) and the lookups " +
			"that find both layouts' rules and the host veth: needed for a DEL that cleans up after either implementation"
	case "portmap ADD", "portmap DEL":
		if k.portmap == "iptables" {
			return "iptables-restore costs more than 2b's one-process start (`iptables --version`): it parses, " +
				"commits an nf_tables transaction (iptables-nft) and, after deleting rules, waits in its exit " +
				"for the kernel to free them; it is the tool the reference uses too, and only the binary could avoid it"
		}
		return "the marker file (written before the rules, so a crash leaves something DEL finds) and the " +
			"conntrack flush for UDP mappings: both are needed"
	case "bandwidth ADD", "bandwidth DEL":
		return "the qdisc and filter requests 2b does not time (TBF on the host veth, the ingress hook, " +
			"the redirect, TBF on the IFB): each is needed"
	}
	return "not profiled"
}
