// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/podwire/podwire/integration/nstest"
)

// refNFTConf is a network the reference plugins serve as well as podwire's: portmap
// on nftables, the reference's cni_hostport layout.
const refNFTConf = `{"cniVersion":"1.1.0","name":"@PREFIX@net","plugins":[
 {"type":"bridge","bridge":"@PREFIX@br","isGateway":true,
  "ipam":{"type":"host-local","ranges":[[{"subnet":"10.58.0.0/24"}]],"dataDir":"@DATADIR@"}},
 {"type":"portmap","backend":"nftables","capabilities":{"portMappings":true}}]}`

// TestPodwireReferenceNFTHostPorts: a node swapped from the reference plugins v1.10.0
// (portmap on nftables) to podwire, with a pod the reference made whose sandbox died
// without a DEL. podwire inspect shows the reference's cni_hostport rules as that
// container's, gc --dry-run lists them (libcni's GC DELs the cached attachment, and
// podwire portmap's DEL removes them by container), and the real GC removes exactly
// them: the node ends as before the pod, but for what the reference leaves behind
// whoever DELs its pods (its own DEL too): empty tables and chains, route_localnet.
func TestPodwireReferenceNFTHostPorts(t *testing.T) {
	refDir := referenceDir(t, "bridge", "host-local", "portmap")
	h := nstest.New(t)
	n := newCLINode(t, h, refNFTConf)
	cacheDir := n.args[slices.Index(n.args, "--cache-dir")+1]
	ref := libcni.NewCNIConfigWithCacheDir([]string{refDir}, cacheDir, nil)
	id := func(s string) string { return h.Prefix + "-" + s }
	t.Cleanup(func() {
		for _, fam := range []string{"ip", "ip6"} {
			_, _ = nstest.RunIn(h.HostNS, "nft", "delete", "table", fam, "cni_hostport")
		}
	})

	// A live pod of podwire's makes the bridge; the snapshot is taken with it.
	n.add(t, id("live"))
	for i := 0; strings.TrimSpace(h.Run(h.HostNS, "ip", "-6", "-o", "addr", "show", "tentative")) != ""; i++ {
		if i == 100 {
			t.Fatal("IPv6 addresses still tentative after 10 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	before := h.Snapshot()

	pod := h.NewPod()
	rt := h.RT(pod, "eth0", pmMap("tcp:18090:80"), nstest.WithContainerID(id("ref")))
	if _, err := h.AddWith(ref, n.list, rt); err != nil {
		t.Fatalf("reference ADD: %v", err)
	}
	ruleset := func() string { out, _ := nstest.RunIn(h.HostNS, "nft", "list", "ruleset"); return out }
	if rs := ruleset(); !strings.Contains(rs, "table ip cni_hostport") || !strings.Contains(rs, `comment "`+rt.ContainerID+`"`) {
		t.Fatalf("the reference portmap made no cni_hostport rules commented with the container ID:\n%s", rs)
	}
	h.DeletePod(pod) // the sandbox dies without a DEL

	inv := n.inspect(t)
	row := findRow(inv, rt.ContainerID)
	if row == nil {
		t.Fatalf("inspect lists no row for the reference's pod:\n%+v", inv)
	}
	var keys []string
	for _, r := range row.HostPorts {
		keys = append(keys, r.Backend+" "+r.Key)
		if !strings.Contains(strings.Join(r.Rules, "\n"), "18090") {
			t.Errorf("inspect: %s's rules do not show its port: %v", r.Backend, r.Rules)
		}
	}
	if !slices.Contains(keys, "nftables ip cni_hostport "+rt.ContainerID) {
		t.Errorf("inspect: hostPorts of the reference's pod are %v, want its cni_hostport rules", keys)
	}

	valid := []string{"--valid", id("live") + "/eth0"}
	var plan cliPlan
	cliJSON(t, h.HostNS.Path(), &plan, append(append([]string{"gc", "--dry-run", "--json"}, n.args...), valid...)...)
	want := cliRemoval{Network: n.list.Name, Plugin: "portmap", Kind: "hostports",
		Name: "nftables ip cni_hostport " + rt.ContainerID, Owner: n.list.Name + "/" + rt.ContainerID + "/eth0"}
	if !slices.Contains(plan.Removals, want) {
		t.Errorf("dry run lists no %+v:\n%+v", want, plan.Removals)
	}
	for _, r := range plan.Removals {
		if !strings.Contains(r.Owner, rt.ContainerID) {
			t.Errorf("dry run removes %+v, not of the leaked pod", r)
		}
	}

	if out, errs, code := runCLI(t, h.HostNS.Path(), append(append([]string{"gc"}, n.args...), valid...)...); code != 0 {
		t.Fatalf("podwire gc: exit %d\n%s\n%s", code, out, errs)
	}
	if rs := ruleset(); strings.Contains(rs, rt.ContainerID) {
		t.Errorf("podwire's GC left the reference's rules of %s:\n%s", rt.ContainerID, rs)
	}
	var again cliPlan
	cliJSON(t, h.HostNS.Path(), &again, append(append([]string{"gc", "--dry-run", "--json"}, n.args...), valid...)...)
	if len(again.Removals) != 0 {
		t.Errorf("after GC, a dry run still lists %+v", again.Removals)
	}
	// What the reference leaves whoever removes its pod: its empty tables and chains,
	// and route_localnet on the bridge, which it turns on and never off (podwire
	// turns off only what it turned on). Everything else is as before the pod.
	h.Run(h.HostNS, "nft", "delete", "table", "ip", "cni_hostport") // the pod had IPv4 only
	h.Run(h.HostNS, "sysctl", "-qw", "net.ipv4.conf."+h.Name("br")+".route_localnet=0")
	h.RequireUnchanged(before)
}
