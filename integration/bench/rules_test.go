// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/podwire/podwire/integration/nstest"
)

// kubeProxyRules renders an iptables-restore file for the nat table holding exactly n
// rules shaped like kube-proxy's (iptables mode) for ClusterIP services with two
// endpoints each: a KUBE-SERVICES match per service jumping to its KUBE-SVC-* chain,
// which masquerades off-cluster sources and picks a KUBE-SEP-* chain at random; each
// KUBE-SEP-* marks hairpin traffic and DNATs to its endpoint. Every rule has a
// comment, as kube-proxy's do. Eight rules and three chains per service.
func kubeProxyRules(n int) string {
	var chains, rules []string
	add := func(format string, a ...any) bool {
		if len(rules) >= n {
			return false
		}
		rules = append(rules, fmt.Sprintf(format, a...))
		return true
	}
	chains = append(chains, ":KUBE-SERVICES - [0:0]", ":KUBE-MARK-MASQ - [0:0]", ":KUBE-POSTROUTING - [0:0]")
	add(`-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`)
	add(`-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`)
	add(`-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING`)
	add(`-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000`)
	add(`-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN`)
	add(`-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000`)
	add(`-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully`)
	for s := 0; len(rules) < n; s++ {
		svc := fmt.Sprintf("KUBE-SVC-%016X", uint64(s)*0x9E3779B97F4A7C15>>8)
		ip := fmt.Sprintf("10.96.%d.%d", s/250, s%250+1)
		name := fmt.Sprintf("ns%d/svc-%d:http", s%97, s)
		chains = append(chains, ":"+svc+" - [0:0]")
		add(`-A KUBE-SERVICES -d %s/32 -p tcp -m comment --comment "%s cluster IP" -m tcp --dport 80 -j %s`, ip, name, svc)
		add(`-A %s ! -s 10.244.0.0/16 -d %s/32 -p tcp -m comment --comment "%s cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ`, svc, ip, name)
		for ep := 0; ep < 2; ep++ {
			k := 2*s + ep
			sep := fmt.Sprintf("KUBE-SEP-%016X", uint64(k)*0xC2B2AE3D27D4EB4F>>8)
			epIP := fmt.Sprintf("10.244.%d.%d", k/250, k%250+1)
			chains = append(chains, ":"+sep+" - [0:0]")
			if ep == 0 {
				add(`-A %s -m comment --comment "%s -> %s:8080" -m statistic --mode random --probability 0.50000000000 -j %s`, svc, name, epIP, sep)
			} else {
				add(`-A %s -m comment --comment "%s -> %s:8080" -j %s`, svc, name, epIP, sep)
			}
			add(`-A %s -s %s/32 -m comment --comment "%s" -j KUBE-MARK-MASQ`, sep, epIP, name)
			add(`-A %s -p tcp -m comment --comment "%s" -m tcp -j DNAT --to-destination %s:8080`, sep, name, epIP)
		}
	}
	return "*nat\n" + strings.Join(chains, "\n") + "\n" + strings.Join(rules, "\n") + "\nCOMMIT\n"
}

// loadRules loads a ruleset into the host netns of h with one iptables-restore.
func loadRules(t *testing.T, h *nstest.H, file string) {
	if out, err := nstest.RunIn(h.HostNS, "iptables-restore", "-w", file); err != nil {
		t.Fatalf("loading foreign rules: %v\n%s", err, out)
	}
}

func benchForeignRules(e *env, t *testing.T) {
	tbl := e.rep.section("3. Chain with foreign iptables nat rules",
		"chain", "foreign nat rules", "op", "floor", "reference (iptables)", "podwire iptables", "reference nftables", "podwire nftables",
		"reference Δ vs 0 rules", "podwire iptables Δ vs 0 rules", "podwire nftables Δ vs 0 rules", "podwire iptables / reference",
		"podwire nftables / reference nftables, above the floor")
	tbl.intro = "The host netns of every column but the floor's first gets a kube-proxy-like nat table loaded with one " +
		"iptables-restore (ClusterIP services with two endpoints: KUBE-SERVICES → KUBE-SVC-* → KUBE-SEP-* with comments, " +
		"`statistic` and DNAT rules; eight rules and three chains per service). Both netfilter users are set to " +
		"the backend named by the column (bridge `ipMasqBackend` and portmap `backend`; \"reference\" alone is iptables). " +
		"The bridge-only and portmap-alone rows (portmap after `bench-noop`, as in section 2) tell which plugin a change comes from. " +
		"Each (column, rule count) has its own host netns, all loaded before timing; one interleave runs them all, " +
		"after one untimed ADD/DEL each. " +
		"Milliseconds, median / p95; Δ columns compare medians with the same column at 0 rules, ± the standard error of " +
		"that difference (from the interquartile ranges: differences inside it are noise); the last column is " +
		"podwire's iptables median over the reference's (0.33 = a third), then podwire's nftables cost above the floor " +
		"over the reference's nftables cost above the floor (medians)."
	counts := []int{0, 20_000, 60_000}
	iters := 20
	if e.quick {
		counts, iters = []int{0, 60_000}, 6
		tbl.note("bench-quick runs only the floor and both nftables columns, at 0 and 60,000 rules")
	}
	tbl.note("the floor touches no netfilter, so its netns gets no foreign rules")
	type variant struct {
		label string
		set   *set
		masq  string
		pm    string
	}
	ipt, nft := `,"ipMasqBackend":"iptables"`, `,"ipMasqBackend":"nftables"`
	variants := []variant{
		{"floor", e.floor, ipt, `,"backend":"iptables"`},
		{"reference", e.ref, ipt, `,"backend":"iptables"`},
		{"podwire iptables", e.ours, ipt, `,"backend":"iptables"`},
		{"reference nftables", e.ref, nft, `,"backend":"nftables"`},
		{"podwire nftables", e.ours, nft, `,"backend":"nftables"`},
	}
	confs := []struct {
		name, text string
		types      []string
		veth       bool // run on the runner's veth pod (see vethPod)
	}{
		{"full chain", chainConf("@MASQ@", "@PMB@"), chainTypes, false},
		{"bridge(ipMasq)+host-local", `{"cniVersion":"1.1.0","name":"@NAME@","plugins":[
			{"type":"bridge","bridge":"cnibench2","isGateway":true,"ipMasq":true@MASQ@,
			 "ipam":{"type":"host-local","ranges":[[{"subnet":"10.93.0.0/16"}]],"dataDir":"@DATADIR@"}}]}`,
			[]string{"bridge", "host-local"}, false},
		{"portmap alone (after bench-noop)", `{"cniVersion":"1.1.0","name":"@NAME@","plugins":[
			{"type":"bench-noop","result":` + vethPodResult + `},
			{"type":"portmap","capabilities":{"portMappings":true}@PMB@}]}`, []string{"portmap"}, true},
	}
	// Every (rule count, variant) gets its own host netns, all made and loaded before
	// timing, and one interleave runs them all, so drift cancels across rule counts too
	// and the Δ columns compare like with like.
	type key struct {
		n     int
		label string
	}
	var runners []*runner
	keys := map[*runner]key{}
	for _, n := range counts {
		file := filepath.Join(t.TempDir(), "rules")
		must(t, os.WriteFile(file, []byte(kubeProxyRules(n)), 0o600), "writing rules")
		for _, v := range variants {
			if e.quick && v.label != "floor" && v.label != "podwire nftables" && v.label != "reference nftables" {
				continue
			}
			h := nstest.New(t)
			if n > 0 && v.set != e.floor {
				loadRules(t, h, file)
			}
			r := &runner{label: fmt.Sprintf("%s at %d rules", v.label, n), set: v.set, h: h, pod: h.NewPod(),
				subst: map[string]string{"@MASQ@": v.masq, "@PMB@": v.pm}}
			runners = append(runners, r)
			keys[r] = key{n, v.label}
		}
	}
	// results[conf][count][variant label]
	results := map[string]map[int]map[string]*pair{}
	for _, c := range confs {
		results[c.name] = map[int]map[string]*pair{}
		for _, n := range counts {
			results[c.name][n] = map[string]*pair{}
		}
		rs, ks := runners, keys
		if c.veth {
			rs, ks = nil, map[*runner]key{}
			for _, r := range runners {
				v := vethPod(t, r, false)
				v.label, v.subst = r.label, r.subst
				rs = append(rs, v)
				ks[v] = keys[r]
			}
		}
		for r, p := range e.timed(tbl, rs, iters, c.text, "eth0", chainCaps, c.types...) {
			k := ks[r]
			results[c.name][k.n][k.label] = p
		}
	}
	for _, c := range confs {
		for _, n := range counts {
			for _, op := range []string{"ADD", "DEL"} {
				get := func(label string, n int) sample {
					p := results[c.name][n][label]
					if p == nil {
						return nil
					}
					if op == "DEL" {
						return p.del
					}
					return p.add
				}
				d0 := func(label string) string {
					if n == 0 {
						return "—"
					}
					return deltaPM(get(label, n), get(label, 0))
				}
				tbl.row(c.name, fmt.Sprintf("%d", n), op,
					cell(get("floor", n)), cell(get("reference", n)), cell(get("podwire iptables", n)),
					cell(get("reference nftables", n)), cell(get("podwire nftables", n)),
					d0("reference"), d0("podwire iptables"), d0("podwire nftables"),
					fraction(get("podwire iptables", n), get("reference", n)),
					overFloor(get("podwire nftables", n), get("reference nftables", n), get("floor", n)))
			}
		}
	}
	e.rulesTargets(results["full chain"])
}

// overFloor is ours' median above the floor's over ref's above the floor's, "n/a"
// when a sample is missing or the reference is not above the floor.
func overFloor(ours, ref, floor sample) string {
	if v, ok := overFloorRatio(ours, ref, floor); ok {
		return fmt.Sprintf("%.2f", v)
	}
	return "n/a"
}

func overFloorRatio(ours, ref, floor sample) (float64, bool) {
	if len(ours) == 0 || len(ref) == 0 || len(floor) == 0 {
		return 0, false
	}
	f := floor.median().Seconds()
	r := ref.median().Seconds() - f
	if r <= 0 {
		return 0, false
	}
	return (ours.median().Seconds() - f) / r, true
}

// rulesTargets fills section 3's targets from the full chain's samples, by rule count
// and column label.
func (e *env) rulesTargets(full map[int]map[string]*pair) {
	get := func(label string, n int, op string) sample {
		p := full[n][label]
		if p == nil {
			return nil
		}
		if op == "DEL" {
			return p.del
		}
		return p.add
	}
	const many = 60_000
	ipt, nft, ref, refNFT, floor := "podwire iptables", "podwire nftables", "reference", "reference nftables", "floor"
	// nftables: podwire's cost above the floor against the reference's on nftables.
	for _, c := range []struct {
		id, op string
		limit  float64
	}{{"nft-add", "ADD", 0.25}, {"nft-del", "DEL", 0.6}} {
		o, r, f := get(nft, 0, c.op), get(refNFT, 0, c.op), get(floor, 0, c.op)
		v, ok := overFloorRatio(o, r, f)
		if !ok {
			e.target(c.id, "n/a", "n/a", nil)
			continue
		}
		e.target(c.id, fmt.Sprintf("%.2f (%s ms above the floor)", v, deltaPM(o, f)),
			withUnit(deltaPM(r, f), " ms above the floor"), boolp(v <= c.limit))
	}
	// iptables: podwire's wall over the reference's, at 0 and 60,000 rules.
	frac := func(n int, op string) string {
		o, r := get(ipt, n, op), get(ref, n, op)
		if len(o) == 0 || len(r) == 0 {
			return "n/a"
		}
		return fmt.Sprintf("%s (%s / %s ms)", fraction(o, r), ms(o.median()), ms(r.median()))
	}
	medOf := func(s sample) string {
		if len(s) == 0 {
			return "n/a"
		}
		return ms(s.median()) + " ms"
	}
	for _, op := range []string{"ADD", "DEL"} {
		id := "ipt-" + strings.ToLower(op)
		e.target(id+"-0", frac(0, op), medOf(get(ref, 0, op)), fractionAtMost(get(ipt, 0, op), get(ref, 0, op), 0.6))
		e.target(id+"-60k", frac(many, op), medOf(get(ref, many, op)), fractionAtMost(get(ipt, many, op), get(ref, many, op), 0.6))
		// Flat: podwire iptables at 60,000 rules within ±10 % of itself at 0.
		o0, o60 := get(ipt, 0, op), get(ipt, many, op)
		r0, r60 := get(ref, 0, op), get(ref, many, op)
		rel := func(a, b sample) (float64, bool) {
			if len(a) == 0 || len(b) == 0 {
				return 0, false
			}
			return b.median().Seconds()/a.median().Seconds() - 1, true
		}
		ro, ok := rel(o0, o60)
		if !ok {
			e.target("flat-"+id, "n/a", "n/a", nil)
			continue
		}
		rr := "n/a"
		if v, ok := rel(r0, r60); ok {
			rr = fmt.Sprintf("%+.0f %%", 100*v)
		}
		e.target("flat-"+id, fmt.Sprintf("%+.0f %% (%s)", 100*ro, withUnit(deltaPM(o60, o0), " ms")), rr, boolp(math.Abs(ro) <= 0.10))
	}
}

// withUnit appends unit unless v is n/a.
func withUnit(v, unit string) string {
	if v == "n/a" {
		return v
	}
	return v + unit
}
