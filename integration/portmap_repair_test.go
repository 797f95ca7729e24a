// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/podwire/podwire/integration/nstest"
	"github.com/podwire/podwire/pkg/netfilter"
)

// Issue 14's acceptance for portmap: many host ports on one pod, ADD repairing what a
// foreign tool flushed, and DEL and GC finding a pod's rules when the shared
// CNI-HOSTPORT-DNAT chain no longer leads to them.

// pmForgetMarkers removes, at cleanup, the portmap markers of network that a failed
// test left in the node-wide marker directory (the netns holding their rules is gone by
// then). The test has reported them already; this only keeps the directory tidy.
func pmForgetMarkers(t *testing.T, network string) {
	t.Cleanup(func() {
		for _, m := range pmMarkers(t, network) {
			_ = os.Remove(filepath.Join(pmStateDir, m))
		}
	})
}

// TestPortmapThousandPorts gives one pod 1,000 TCP and 100 UDP host ports (dual
// stack: each forwards IPv4 and IPv6) on both backends: ADD and CHECK succeed, a
// sample of the ports carries traffic from an external client to the right container
// port, and DEL leaves the node as it was.
func TestPortmapThousandPorts(t *testing.T) {
	for _, kind := range pmBackends {
		t.Run(string(kind), func(t *testing.T) { pmThousandPorts(t, kind) })
	}
}

func pmThousandPorts(t *testing.T, kind netfilter.Kind) {
	const (
		nTCP, nUDP = 1000, 100
		hostBase   = 20000 // host port hostBase+i forwards to container port podBase+i
		podBase    = 30000
	)
	h := nstest.New(t)
	client := pmNode(t, h)
	list := pmConf(h, pmBackend(kind))
	pmForgetMarkers(t, list.Name)
	pmWarmUp(t, h, list)
	before := h.Snapshot()

	var specs []string
	for i := 0; i < nTCP; i++ {
		specs = append(specs, fmt.Sprintf("tcp:%d:%d", hostBase+i, podBase+i))
	}
	for i := 0; i < nUDP; i++ {
		specs = append(specs, fmt.Sprintf("udp:%d:%d", hostBase+i, podBase+i))
	}
	// The sample: both ends, both sides of a 15-port multiport boundary, the middle.
	sampleTCP := []int{0, 1, 14, 15, 499, 500, 998, nTCP - 1}
	sampleUDP := []int{0, nUDP - 1}
	pod := h.NewPod()
	served := map[int]bool{}
	for _, i := range append(append([]int{}, sampleTCP...), sampleUDP...) {
		if !served[i] {
			served[i] = true
			pmServe(t, pod, fmt.Sprintf("p%d", podBase+i), podBase+i)
		}
	}
	rt := h.RT(pod, "eth0", pmMap(specs...))
	start := time.Now()
	_, err := h.Add(list, rt)
	t.Logf("ADD of %d mappings took %v", len(specs), time.Since(start).Round(time.Millisecond))
	if err != nil {
		t.Errorf("ADD with %d TCP and %d UDP host ports: %v", nTCP, nUDP, err)
		// As a runtime does after a failed ADD; a failed ADD must leave nothing.
		if err := h.Del(list, rt); err != nil {
			t.Errorf("DEL after the failed ADD: %v", err)
		}
		if m := pmMarkers(t, list.Name); len(m) != 0 {
			t.Errorf("markers left after the failed ADD and its DEL: %v", m)
		}
		pmSettle(t, h)
		h.RequireUnchanged(before)
		return
	}
	for _, i := range sampleTCP {
		pmExpect(t, fmt.Sprintf("tcp host port %d", hostBase+i), client, "tcp", fmt.Sprintf("%s:%d", pmNode4, hostBase+i), fmt.Sprintf("p%d", podBase+i), pmClient4)
	}
	for _, i := range sampleUDP {
		pmExpect(t, fmt.Sprintf("udp host port %d", hostBase+i), client, "udp", fmt.Sprintf("%s:%d", pmNode4, hostBase+i), fmt.Sprintf("p%d", podBase+i), pmClient4)
	}
	pmExpect(t, "last tcp host port, ipv6", client, "tcp", fmt.Sprintf("[%s]:%d", pmNode6, hostBase+nTCP-1), fmt.Sprintf("p%d", podBase+nTCP-1), pmClient6)
	pmExpect(t, "last udp host port, ipv6", client, "udp", fmt.Sprintf("[%s]:%d", pmNode6, hostBase+nUDP-1), fmt.Sprintf("p%d", podBase+nUDP-1), pmClient6)
	if got, err := pmDialOnce(client, "tcp", fmt.Sprintf("%s:%d", pmNode4, hostBase+nTCP), nil); err == nil {
		t.Errorf("host port %d, one past the mapped ones, answered: %q", hostBase+nTCP, got)
	}
	if err := h.Check(list, rt); err != nil {
		t.Errorf("CHECK: %v", err)
	}

	start = time.Now()
	err = h.Del(list, rt)
	t.Logf("DEL took %v", time.Since(start).Round(time.Millisecond))
	if err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if rules := pmRules(t, h); rules != "" {
		t.Errorf("rules left after DEL (%d lines):\n%.3000s", strings.Count(rules, "\n"), rules)
	}
	if m := pmMarkers(t, list.Name); len(m) != 0 {
		t.Errorf("markers left after DEL: %v", m)
	}
	pmSettle(t, h)
	h.RequireUnchanged(before)
}

// pmDamage is what a foreign tool does to the netfilter objects portmap's ADDs share.
type pmDamage struct {
	name string
	kind netfilter.Kind
	do   func(t *testing.T, h *nstest.H)
}

// pmFlushNATBuiltins flushes the nat table's built-in chains, as a careless firewall
// script or `iptables -t nat -F <chain>` does, in both families.
func pmFlushNATBuiltins(t *testing.T, h *nstest.H) {
	for _, ipt := range []string{"iptables", "ip6tables"} {
		for _, chain := range []string{"PREROUTING", "OUTPUT", "POSTROUTING"} {
			h.Run(h.HostNS, ipt, "-w", "-t", "nat", "-F", chain)
		}
	}
}

// pmNFTBaseChain is one base chain of a podwire nftables table.
type pmNFTBaseChain struct{ family, table, name string }

// pmNFTBaseChains lists the base chains (those on a hook) of every podwire_ table in
// the host netns. It finds them by listing rather than by name, so a renamed table or
// chain is still what the damage hits.
func pmNFTBaseChains(t *testing.T, h *nstest.H) []pmNFTBaseChain {
	t.Helper()
	var doc struct {
		Nftables []map[string]json.RawMessage `json:"nftables"`
	}
	out := h.Run(h.HostNS, "nft", "-j", "list", "chains")
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("parsing nft -j list chains: %v\n%s", err, out)
	}
	var chains []pmNFTBaseChain
	for _, e := range doc.Nftables {
		raw, ok := e["chain"]
		if !ok {
			continue
		}
		var c struct{ Family, Table, Name, Hook string }
		if err := json.Unmarshal(raw, &c); err != nil {
			t.Fatalf("parsing nft chain %s: %v", raw, err)
		}
		if strings.HasPrefix(c.Table, "podwire_") && c.Hook != "" {
			chains = append(chains, pmNFTBaseChain{c.Family, c.Table, c.Name})
		}
	}
	if len(chains) == 0 {
		t.Fatalf("no base chain of a podwire_ nftables table while a pod has host ports:\n%s", out)
	}
	return chains
}

// pmNFTDamage flushes (and, when del, deletes) every base chain of podwire's nftables
// tables.
func pmNFTDamage(del bool) func(t *testing.T, h *nstest.H) {
	return func(t *testing.T, h *nstest.H) {
		for _, c := range pmNFTBaseChains(t, h) {
			h.Run(h.HostNS, "nft", "flush", "chain", c.family, c.table, c.name)
			if del {
				h.Run(h.HostNS, "nft", "delete", "chain", c.family, c.table, c.name)
			}
		}
	}
}

// TestPortmapRepairsForeignDamage: with one pod's host ports in place (so the shared
// chains exist), a foreign tool flushes the nat built-in chains (iptables backend) or
// flushes or deletes podwire's nftables base chains. The next pod's ADD must still make
// its host port work from every path: an external client, the node by its address and
// by 127.0.0.1, and the pod itself through the node (hairpin). CHECK passes for it, and
// removing both pods leaves the node as it was.
func TestPortmapRepairsForeignDamage(t *testing.T) {
	for _, d := range []pmDamage{
		{"iptables flush nat PREROUTING OUTPUT POSTROUTING", netfilter.KindIPTables, func(t *testing.T, h *nstest.H) { pmFlushNATBuiltins(t, h) }},
		{"nftables flush base chains", netfilter.KindNFTables, pmNFTDamage(false)},
		{"nftables delete base chains", netfilter.KindNFTables, pmNFTDamage(true)},
	} {
		t.Run(d.name, func(t *testing.T) { pmRepair(t, d) })
	}
}

func pmRepair(t *testing.T, d pmDamage) {
	h := nstest.New(t)
	client := pmNode(t, h)
	list := pmConf(h, pmBackend(d.kind))
	pmForgetMarkers(t, list.Name)
	pmWarmUp(t, h, list)
	before := h.Snapshot()

	first := h.NewPod()
	pmServe(t, first, "first", 80)
	firstRT := h.RT(first, "eth0", pmMap("tcp:8080:80"))
	h.MustAdd(list, firstRT)
	pmExpect(t, "first pod before the damage", client, "tcp", pmNode4+":8080", "first", pmClient4)

	d.do(t, h)
	damaged := pmRules(t, h)

	pod := h.NewPod()
	pmServe(t, pod, "pod", 80)
	rt := h.RT(pod, "eth0", pmMap("tcp:9090:80", "udp:9090:80"))
	if _, err := h.Add(list, rt); err != nil {
		t.Errorf("ADD after the damage: %v", err)
	} else {
		pmExpect(t, "external tcp", client, "tcp", pmNode4+":9090", "pod", pmClient4)
		pmExpect(t, "external udp", client, "udp", pmNode4+":9090", "pod", pmClient4)
		pmExpect(t, "external tcp ipv6", client, "tcp", "["+pmNode6+"]:9090", "pod", pmClient6)
		pmExpect(t, "node address", h.HostNS, "tcp", pmNode4+":9090", "pod", "")
		pmExpect(t, "localhost", h.HostNS, "tcp", "127.0.0.1:9090", "pod", pmGW4)
		pmExpect(t, "hairpin", pod, "tcp", pmNode4+":9090", "pod", pmGW4)
		pmExpect(t, "hairpin ipv6", pod, "tcp", "["+pmNode6+"]:9090", "pod", "fd77::1")
		if err := h.Check(list, rt); err != nil {
			t.Errorf("CHECK of the pod added after the damage: %v", err)
		}
		if t.Failed() {
			t.Logf("rules after the damage:\n%s\nrules after the ADD:\n%s", damaged, pmRules(t, h))
		}
	}

	// The damage is no reason for DEL to fail, nor for the node to keep anything of
	// portmap's once no pod has host ports.
	if err := h.Del(list, rt); err != nil {
		t.Errorf("DEL of the pod added after the damage: %v", err)
	}
	if err := h.Del(list, firstRT); err != nil {
		t.Errorf("DEL of the first pod: %v", err)
	}
	if rules := pmRules(t, h); rules != "" {
		t.Errorf("rules left after both DELs:\n%s", rules)
	}
	if m := pmMarkers(t, list.Name); len(m) != 0 {
		t.Errorf("markers left after both DELs: %v", m)
	}
	pmSettle(t, h)
	h.RequireUnchanged(before)
}

// TestPortmapFlushedHostportDNAT: on the iptables backend a foreign tool flushes
// CNI-HOSTPORT-DNAT (both families), so nothing leads to a pod's CNI-DN-… chain any
// more. Removing the pod, by DEL or by GC of a runtime that no longer lists it, must
// still remove everything of it (its chain, its rules, its marker) and leave the node
// as it was before the pod.
func TestPortmapFlushedHostportDNAT(t *testing.T) {
	for _, how := range []string{"DEL", "GC"} {
		t.Run(how, func(t *testing.T) { pmFlushedDNAT(t, how) })
	}
}

func pmFlushedDNAT(t *testing.T, how string) {
	h := nstest.New(t)
	client := pmNode(t, h)
	list := pmConf(h, pmBackend(netfilter.KindIPTables))
	pmForgetMarkers(t, list.Name)
	pmWarmUp(t, h, list)
	before := h.Snapshot()

	pod := h.NewPod()
	pmServe(t, pod, "pod", 80)
	rt := h.RT(pod, "eth0", pmMap("tcp:8080:80", "udp:8080:80"))
	res := h.MustAdd(list, rt)
	pmExpect(t, "before the flush", client, "tcp", pmNode4+":8080", "pod", pmClient4)
	chain := netfilter.HostPortChain(list.Name, rt.ContainerID)
	if rules := pmRules(t, h); !strings.Contains(rules, chain) {
		t.Fatalf("no chain %s after ADD:\n%s", chain, rules)
	}
	for _, ipt := range []string{"iptables", "ip6tables"} {
		h.Run(h.HostNS, ipt, "-w", "-t", "nat", "-F", netfilter.HostPortDNATChain)
	}

	switch how {
	case "DEL":
		if err := h.Del(list, rt); err != nil {
			t.Errorf("DEL after CNI-HOSTPORT-DNAT was flushed: %v", err)
		}
	case "GC":
		// The sandbox is gone and the runtime has forgotten the attachment: GC,
		// listing only another container, is what must clean up. A client with an
		// empty result cache, so libcni issues no DEL of its own for the cached
		// attachment and the plugins' GC does the work. The pod's interface goes as
		// with its sandbox (the netns itself lives on while the test's servers hold
		// it open).
		h.Run(pod, "ip", "link", "del", "eth0")
		gcClient := libcni.NewCNIConfigWithCacheDir([]string{h.BinDir}, filepath.Join(t.TempDir(), "cache"), nil)
		valid := []types.GCAttachment{{ContainerID: "another-container", IfName: "eth0"}}
		err := h.InHost(func() error {
			return gcClient.GCNetworkList(t.Context(), list, &libcni.GCArgs{ValidAttachments: valid})
		})
		if err != nil {
			t.Errorf("GC after CNI-HOSTPORT-DNAT was flushed: %v", err)
		}
	}
	rules := pmRules(t, h)
	pod4, pod6 := pmAddr(t, res, false), pmAddr(t, res, true)
	for _, left := range []string{chain, pod4, pod6, netfilter.HostPortDNATChain} {
		if strings.Contains(rules, left) {
			t.Errorf("%s left %s in the rules:\n%s", how, left, rules)
			break
		}
	}
	if m := pmMarkers(t, list.Name); len(m) != 0 {
		t.Errorf("%s left markers: %v", how, m)
	}
	pmSettle(t, h)
	h.RequireUnchanged(before)
}
