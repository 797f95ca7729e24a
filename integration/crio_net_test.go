// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/podwire/podwire/integration/crio"
	"github.com/podwire/podwire/integration/nstest"
)

// crioBurst is the burst CRI-O passes with the bandwidth annotations, in bits: its
// ocicni sends 2^35-9 (just under the reference bandwidth plugin's limit), 8 times
// containerd's 2^32-1.
const crioBurst = 34_359_738_359

// crioLocalhostPrereqs are crio.LocalhostHostPorts (docs/crio.md shows them).
var crioLocalhostPrereqs = crio.LocalhostHostPorts

// TestCRIOHostPort: a pod with a hostPort through CRI-O answers on the node's address
// (from an outside client) and on 127.0.0.1 (from the node), through CRI-O's own
// nftables table crio-hostports; CRI-O never passes portMappings to CNI, so podwire's
// portmap runs (ADD, CHECK, DEL) and installs nothing.
func TestCRIOHostPort(t *testing.T) {
	h := nstest.New(t)
	repo, err := nstest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	conf := crioKubenet(t, h, repo, "1.1.0", nil)
	client := h.NewPod()
	addUplink(t, h, client)
	for _, args := range crioLocalhostPrereqs {
		h.Run(h.HostNS, args[0], args[1:]...)
	}
	t.Logf("node prerequisites for hostPorts on 127.0.0.1: %q", crioLocalhostPrereqs)
	d := startCRIO(t, h, repo, conf, crio.Options{})
	crioWaitNetwork(t, d, true, 30*time.Second)
	// The warm-up pod has a hostPort too: CRI-O creates its table crio-hostports with the
	// first one and keeps it, as the bridge outlives pods.
	warm := crioRun(t, d, "warm", map[string]any{
		"port_mappings": []map[string]any{{"protocol": 0, "container_port": e2eContainerPort, "host_port": e2eHostPort + 1}},
	})
	waitNoTentative(t, h)
	d.MustCrictl("stopp", warm)
	d.MustCrictl("rmp", warm)
	before := settledSnapshot(t, h)

	id := crioRun(t, d, "web", map[string]any{
		"port_mappings": []map[string]any{{"protocol": 0, "container_port": e2eContainerPort, "host_port": e2eHostPort}},
	})
	_, podNS := crioPodNS(t, d, id)
	l := serveIn(t, podNS, fmt.Sprintf(":%d", e2eContainerPort), "pod "+short(id))
	defer l.Close()
	for _, tc := range []struct {
		from      ns.NetNS
		who, addr string
	}{
		{client, "outside client " + e2eClientIP, net.JoinHostPort(e2eNodeUplinkIP, strconv.Itoa(e2eHostPort))},
		{h.HostNS, "the node itself", net.JoinHostPort("127.0.0.1", strconv.Itoa(e2eHostPort))},
	} {
		reply, err := dialIn(tc.from, tc.addr)
		if err != nil || !strings.HasPrefix(reply, "pod "+short(id)+" ") {
			t.Fatalf("hostPort: %s connecting to %s: %q, %v; want the pod to answer\nnft:\n%s", tc.who, tc.addr, reply, err, h.Run(h.HostNS, "nft", "list", "ruleset"))
		}
		t.Logf("check: hostPort %d -> pod:%d from %s via %s: %q", e2eHostPort, e2eContainerPort, tc.who, tc.addr, reply)
	}

	port := strconv.Itoa(e2eHostPort)
	crioTable := h.Run(h.HostNS, "nft", "list", "table", "ip", "crio-hostports")
	if !strings.Contains(crioTable, port) {
		t.Fatalf("CRI-O's table crio-hostports has no rule for port %s:\n%s", port, crioTable)
	}
	for _, tool := range []string{"iptables-save", "ip6tables-save"} {
		if out := h.Run(h.HostNS, tool); strings.Contains(out, port) || strings.Contains(out, "CNI-HOSTPORT") || strings.Contains(out, "CNI-DN-") {
			t.Errorf("%s shows hostPort rules besides CRI-O's (portmap installed something):\n%s", tool, out)
		}
	}
	for _, table := range strings.Split(h.Run(h.HostNS, "nft", "list", "tables"), "\n") {
		f := strings.Fields(table)
		if len(f) != 3 || f[2] == "crio-hostports" {
			continue
		}
		if out := h.Run(h.HostNS, "nft", "list", "table", f[1], f[2]); strings.Contains(out, port) {
			t.Errorf("nft table %s %s mentions port %s (only CRI-O's crio-hostports may):\n%s", f[1], f[2], port, out)
		}
	}
	var cache struct {
		CapabilityArgs map[string]json.RawMessage `json:"capabilityArgs"`
	}
	if b, err := os.ReadFile(filepath.Join(e2eLibcniCache, "results", conf.network+"-"+id+"-eth0")); err != nil {
		t.Fatal(err)
	} else if err := json.Unmarshal(b, &cache); err != nil {
		t.Fatal(err)
	}
	if pm, ok := cache.CapabilityArgs["portMappings"]; ok && string(pm) != "null" && string(pm) != "[]" {
		t.Errorf("CRI-O passed portMappings %s to CNI", pm)
	}
	got := verbs(cniCalls(t, conf), id)
	if !strings.Contains(strings.Join(got, ","), "portmap ADD,bandwidth ADD") || !strings.Contains(strings.Join(got, ","), "portmap CHECK") {
		t.Errorf("portmap was not run for the pod: %v", got)
	}
	t.Logf("check: CRI-O's own table crio-hostports maps %s; CRI-O passed no portMappings (capabilityArgs %v), portmap ran (%s) and no iptables rule or other nft table has the port",
		port, keys(cache.CapabilityArgs), strings.Join(got, ", "))

	d.MustCrictl("stopp", id)
	d.MustCrictl("rmp", id)
	if strings.Contains(h.Run(h.HostNS, "nft", "list", "table", "ip", "crio-hostports"), port) {
		t.Errorf("CRI-O's hostPort rule for %s outlived the pod", port)
	}
	requireSettledUnchanged(t, h, before)
	t.Logf("check: pod removed: CRI-O's mapping gone, node state as before the pod")
}

func keys(m map[string]json.RawMessage) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestCRIOBandwidth: the bandwidth annotations through CRI-O arrive with CRI-O's burst
// (2^35-9 bits), and the shaping is still accurate from the first second: iperf3
// between the shaped pod and an unshaped one on the same bridge, both directions,
// every 1-second interval within ±10 % of 10 Mbit/s and the average within ±5 %.
// Then the shaped pod's netns is removed behind CRI-O's back (as when a node's netns
// mounts are lost) and its DEL, which still carries the stale CNI_NETNS path, must
// succeed in every plugin and leave nothing: no lease, IFB or cache entry.
func TestCRIOBandwidth(t *testing.T) {
	h := nstest.New(t)
	repo, err := nstest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	conf := crioKubenet(t, h, repo, "1.1.0", nil)
	d := startCRIO(t, h, repo, conf, crio.Options{})
	crioWaitNetwork(t, d, true, 30*time.Second)
	warm := crioRun(t, d, "warm", nil)
	waitNoTentative(t, h)
	d.MustCrictl("stopp", warm)
	d.MustCrictl("rmp", warm)
	before := settledSnapshot(t, h)

	peerID := crioRun(t, d, "peer", nil)
	peer, peerNS := crioPodNS(t, d, peerID)
	id := crioRun(t, d, "shaped", map[string]any{"annotations": map[string]string{
		"kubernetes.io/ingress-bandwidth": e2eBandwidth, "kubernetes.io/egress-bandwidth": e2eBandwidth,
	}})
	pod, podNS := crioPodNS(t, d, id)
	var cache struct {
		CapabilityArgs struct {
			Bandwidth *struct {
				IngressRate, IngressBurst, EgressRate, EgressBurst uint64
			} `json:"bandwidth"`
		} `json:"capabilityArgs"`
	}
	b, err := os.ReadFile(filepath.Join(e2eLibcniCache, "results", conf.network+"-"+id+"-eth0"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &cache); err != nil {
		t.Fatal(err)
	}
	bw := cache.CapabilityArgs.Bandwidth
	if bw == nil || bw.IngressRate != 10_000_000 || bw.EgressRate != 10_000_000 || bw.IngressBurst != crioBurst || bw.EgressBurst != crioBurst {
		t.Fatalf("bandwidth capability CRI-O passed: %+v, want rates 10000000 and bursts %d", bw, uint64(crioBurst))
	}
	t.Logf("check: CRI-O passed bandwidth %+v (burst %d bits, 8x containerd's)", *bw, uint64(crioBurst))
	hostVeth := checkHostVeth(t, h, checkPodInterfaces(t, podNS, net.ParseIP(pod.Status.Network.IP)), conf.bridge)
	checkShaping(t, h, hostVeth)

	want := 10e6
	var in, out throughput
	rtts, sent := pingDuring(t, peerNS, pod.Status.Network.IP, 10, func() {
		in = iperf(t, h, podNS, peerNS, peer.Status.Network.IP, true, 4)
	})
	t.Logf("into the pod:   %s; ping under load %v ms", in, rtts)
	requireRate(t, "into the pod", in, want)
	requirePing(t, "into the pod", rtts, sent, 30)
	out = iperf(t, h, podNS, peerNS, peer.Status.Network.IP, false, 4)
	t.Logf("out of the pod: %s", out)
	requireRate(t, "out of the pod", out, want)

	// The netns goes behind CRI-O's back: pinns' bind mount in CRI-O's mount namespace
	// is detached and its file removed, as when a node loses its netns mounts. CRI-O
	// itself keeps the namespace open (so the veth pair lives on until CRI-O lets go);
	// what the plugins get on DEL is a CNI_NETNS path that no longer exists.
	stale := pod.NetNS()
	podNS.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, args := range [][]string{{"umount", "--lazy", stale}, {"rm", "-f", stale}} {
		if out, err := d.InMountNS(ctx, args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v in CRI-O's mount namespace: %v %s", args, err, out)
		}
	}
	if err := d.InMountNS(ctx, "test", "-e", stale).Run(); err == nil {
		t.Fatalf("netns file %s still there", stale)
	}
	n := len(cniCalls(t, conf))
	d.MustCrictl("stopp", id)
	d.MustCrictl("rmp", id)
	var dels []string
	for _, c := range cniCalls(t, conf)[n:] {
		if c.container != id {
			continue
		}
		if c.verb != "DEL" || c.msg != "done" || c.netns != stale {
			t.Errorf("after the netns was removed: %s %s %s netns %q (%s); want DEL done with the stale path %s", c.plugin, c.verb, c.msg, c.netns, c.err, stale)
		}
		dels = append(dels, c.plugin+" "+c.verb)
	}
	if len(dels) < 3 {
		t.Fatalf("CRI-O sent %v for the pod whose netns was gone; want DEL to every plugin", dels)
	}
	if _, err := os.Stat(filepath.Join(h.DataDir, conf.network, pod.Status.Network.IP)); !os.IsNotExist(err) {
		t.Errorf("lease of %s still there after DEL (%v)", pod.Status.Network.IP, err)
	}
	if left := libcniCacheFiles(id); len(left) > 0 {
		t.Errorf("libcni cache entries left: %v", left)
	}
	t.Logf("check: pod netns %s unmounted and removed; stopp + rmp sent %s with CNI_NETNS=%s, each done; lease, IFB and cache entry gone",
		stale, strings.Join(dels, ", "), stale)
	d.MustCrictl("stopp", peerID)
	d.MustCrictl("rmp", peerID)
	requireSettledUnchanged(t, h, before)
	t.Logf("check: node state as before the pods")
}
