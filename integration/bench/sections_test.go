// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"fmt"
	"testing"

	"github.com/podwire/podwire/integration/nstest"
)

// A section is one group of rows in BENCHMARKS.md. quick sections also run in
// `make bench-quick` (each decides what subset of itself to run when e.quick).
type section struct {
	name  string
	quick bool
	run   func(e *env, t *testing.T)
}

var sections = []section{
	{"Full chain, sequential", true, benchChain},
	{"Each plugin alone", true, benchAlone},
	{"Kernel operations alone", true, benchKernel},
	{"Chain with foreign iptables rules", true, benchForeignRules},
	{"Concurrent pods", true, benchConcurrent},
	{"host-local with existing leases", true, benchLeases},
	{"Shaping accuracy", true, benchShaping},
}

// chainConf is the full chain every set runs: bridge with ipMasq and host-local,
// portmap, bandwidth. masq and pm are extra keys for bridge and portmap (e.g. a
// backend choice), each empty or starting with a comma.
func chainConf(masq, pm string) string {
	return `{"cniVersion":"1.1.0","name":"@NAME@","plugins":[
 {"type":"bridge","bridge":"cnibench0","isGateway":true,"ipMasq":true` + masq + `,
  "ipam":{"type":"host-local","ranges":[[{"subnet":"10.88.0.0/16"}]],"dataDir":"@DATADIR@"}},
 {"type":"portmap","capabilities":{"portMappings":true}` + pm + `},
 {"type":"bandwidth","capabilities":{"bandwidth":true}}]}`
}

var chainTypes = []string{"bridge", "host-local", "portmap", "bandwidth"}

// containerdBurst is what containerd and CRI-O pass as burst for every annotated pod.
const containerdBurst = 4294967295

// chainCaps is what a runtime passes for a pod with one hostPort and bandwidth
// annotations.
func chainCaps(i int) map[string]any {
	return map[string]any{
		"portMappings": []map[string]any{{"hostPort": 20000 + i, "containerPort": 80, "protocol": "tcp"}},
		"bandwidth": map[string]any{"ingressRate": 10_000_000, "ingressBurst": containerdBurst,
			"egressRate": 10_000_000, "egressBurst": containerdBurst},
	}
}

const defaultBackends = "Both suites run with their default netfilter backend, as a drop-in conflist gets it: " +
	"the reference picks iptables when the iptables binary exists (it does here); podwire's portmap does the same (so the reference's DEL finds its rules after a switch back), " +
	"podwire's bridge picks nftables for ipMasq when the kernel has it and `nft` ≥ 1.0.1 is installed (the reference then removes those rules too), iptables otherwise. " +
	"Section 3 compares the backends one to one."

func benchChain(e *env, t *testing.T) {
	tbl := e.rep.section("1. Full chain, sequential", timingHeader...)
	tbl.intro = "bridge (isGateway, ipMasq) + host-local, portmap with one hostPort, bandwidth at 10 Mbit/s in and out with " +
		"containerd's burst; one ADD then its DEL per round, on one pod netns. " + defaultBackends
	e.timedRows(tbl, "full chain", chainConf("", ""), "eth0", chainCaps, chainTypes...)
}

// vethPodResult is the result bench-noop hands to a plugin measured alone: the pod
// interface and its host peer (made before timing by vethPod), with an address.
const vethPodResult = `{"cniVersion":"1.1.0","interfaces":[{"name":"bwb0"},{"name":"eth0","sandbox":"@PODNS@"}],
  "ips":[{"address":"10.91.0.2/24","gateway":"10.91.0.1","interface":1}]}`

// vethPod gives runner r a second pod netns joined to its host netns by a veth (bwb0 on
// the host, 10.91.0.1/24; eth0 in the pod, 10.91.0.2/24): what a main plugin would
// have made, so a chained plugin can run on its own. With fresh, the veth is made
// again before every ADD, untimed: the reference bandwidth's DEL leaves its qdiscs on
// the host veth (bridge's DEL normally deletes the veth), so its next ADD on the same
// veth would fail with "file exists".
func vethPod(t *testing.T, r *runner, fresh bool) *runner {
	pod := r.h.NewPod()
	mk := func() error {
		_, _ = nstest.RunIn(r.h.HostNS, "ip", "link", "del", "bwb0")
		for _, c := range [][]string{
			{"ip", "link", "add", "bwb0", "type", "veth", "peer", "name", "eth0", "netns", pod.Path()},
			{"ip", "addr", "add", "10.91.0.1/24", "dev", "bwb0"},
			{"ip", "link", "set", "bwb0", "up"},
		} {
			if out, err := nstest.RunIn(r.h.HostNS, c[0], c[1:]...); err != nil {
				return fmt.Errorf("%v: %w: %s", c, err, out)
			}
		}
		for _, c := range [][]string{{"ip", "addr", "add", "10.91.0.2/24", "dev", "eth0"}, {"ip", "link", "set", "eth0", "up"}} {
			if out, err := nstest.RunIn(pod, c[0], c[1:]...); err != nil {
				return fmt.Errorf("%v: %w: %s", c, err, out)
			}
		}
		return nil
	}
	must(t, mk(), "making the veth for %s", r.label)
	t.Cleanup(func() { _, _ = nstest.RunIn(r.h.HostNS, "ip", "link", "del", "bwb0") })
	out := &runner{label: r.label, set: r.set, h: r.h, pod: pod}
	if fresh {
		out.prep = mk
	}
	return out
}

func benchAlone(e *env, t *testing.T) {
	tbl := e.rep.section("2. Each plugin alone", timingHeader...)
	tbl.intro = "Each row runs one plugin (bridge with its host-local delegate) as the only real work in the chain. " +
		"portmap and bandwidth are chained after `bench-noop`, the floor's no-op binary, whose config `result` names a veth " +
		"made before timing (bwb0 ↔ eth0, 10.91.0.2/24): every set runs that same binary first, so the row differs from " +
		"the floor's only by the plugin itself (chaining after bridge would add bridge's cost, which differs by set). " +
		"For bandwidth the veth is made again, untimed, before every ADD: the reference's DEL leaves its qdiscs on the " +
		"host veth (it relies on bridge's DEL deleting the veth), so its next ADD on that veth would fail. " +
		defaultBackends
	// Each plugin is timed, then run once more, untimed, for podwire with its processes
	// logged (the table "Where the time above the floor goes").
	ours := e.base[e.ours.Name]
	plain := func(key, text, ifName string, types ...string) {
		e.alone[key] = e.timedRows(tbl, key, text, ifName, nil, types...)
		if e.ours.Has(types...) {
			e.countExecs(t, key, ours, text, ifName, nil)
		}
	}
	plain("loopback", `{"cniVersion":"1.1.0","name":"@NAME@","plugins":[{"type":"loopback"}]}`, "lo", "loopback")
	plain("host-local", `{"cniVersion":"1.1.0","name":"@NAME@","plugins":[
		{"type":"host-local","ipam":{"type":"host-local","ranges":[[{"subnet":"10.89.0.0/16"}]],"dataDir":"@DATADIR@"}}]}`, "eth0", "host-local")
	plain("bridge(ipMasq)+host-local", `{"cniVersion":"1.1.0","name":"@NAME@","plugins":[
		{"type":"bridge","bridge":"cnibench1","isGateway":true,"ipMasq":true,
		 "ipam":{"type":"host-local","ranges":[[{"subnet":"10.90.0.0/16"}]],"dataDir":"@DATADIR@"}}]}`,
		"eth0", "bridge", "host-local")

	alone := func(name, plugin string, caps func(int) map[string]any) {
		var veth []*runner
		for _, r := range e.baseRunners() {
			veth = append(veth, vethPod(t, r, plugin == "bandwidth"))
		}
		text := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"@NAME@","plugins":[
			{"type":"bench-noop","result":%s},
			{"type":%q,"capabilities":{%q:true}}]}`, vethPodResult, plugin, map[string]string{"portmap": "portMappings", "bandwidth": "bandwidth"}[plugin])
		res := e.timed(tbl, veth, e.iters, text, "eth0", caps, plugin)
		col := func(i int, del bool) sample {
			p := res[veth[i]]
			if p == nil {
				return nil
			}
			if del {
				return p.del
			}
			return p.add
		}
		tbl.timingRow(name+" ADD", col(0, false), col(1, false), col(2, false))
		tbl.timingRow(name+" DEL", col(0, true), col(1, true), col(2, true))
		e.alone[plugin] = map[string]*pair{}
		for i, s := range e.sets() { // baseRunners' order
			e.alone[plugin][s.Name] = &pair{add: col(i, false), del: col(i, true)}
		}
		if e.ours.Has(plugin) {
			e.countExecs(t, plugin, veth[2], text, "eth0", caps(0))
		}
	}
	alone("portmap (1 mapping, after bench-noop)", "portmap", func(i int) map[string]any {
		return map[string]any{"portMappings": []map[string]any{{"hostPort": 21000 + i, "containerPort": 80, "protocol": "tcp"}}}
	})
	alone("bandwidth (10 Mbit/s both ways, after bench-noop)", "bandwidth", func(int) map[string]any {
		return map[string]any{"bandwidth": map[string]any{"ingressRate": 10_000_000, "ingressBurst": containerdBurst,
			"egressRate": 10_000_000, "egressBurst": containerdBurst}}
	})
	if e.ours.Has(chainTypes...) {
		tbl.note("podwire's default backends here: %s (from the tables an untimed full-chain ADD made)", e.defaultKinds(t))
	}
}
