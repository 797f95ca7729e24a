// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/podwire/podwire/integration/crio"
	"github.com/podwire/podwire/integration/nstest"
)

// TestCRIOStatus shows how CRI-O uses STATUS (cniVersion 1.1.0): it polls the chain
// every 500 ms until STATUS passes and then never asks again. The conflist's range has
// one address. A pod takes it and NetworkReady stays true (no new STATUS reaches the
// plugins); the next pod fails in ADD. After a CRI-O restart, STATUS fails for the
// exhausted range and `crictl info` reports NetworkReady false with host-local's
// message; once the pod is gone and its lease released, the next poll passes and
// NetworkReady is true again.
func TestCRIOStatus(t *testing.T) {
	h := nstest.New(t)
	repo, err := nstest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	conf := crioKubenet(t, h, repo, "1.1.0", func(list map[string]any) {
		for _, p := range list["plugins"].([]any) {
			if ipam, ok := p.(map[string]any)["ipam"].(map[string]any); ok {
				r := ipam["ranges"].([]any)[0].([]any)[0].(map[string]any)
				r["rangeStart"], r["rangeEnd"] = statusPodIP, statusPodIP
			}
		}
	})
	d := startCRIO(t, h, repo, conf, crio.Options{})
	crioWaitNetwork(t, d, true, 30*time.Second)
	statuses := func() int {
		n := 0
		for _, c := range cniCalls(t, conf) {
			if c.verb == "STATUS" && c.plugin == "bridge" {
				n++
			}
		}
		return n
	}
	id := crioRun(t, d, "only", nil)
	if p, _ := crioPodNS(t, d, id); p.Status.Network.IP != statusPodIP {
		t.Fatalf("pod %s has IP %q, want the range's only address %s", short(id), p.Status.Network.IP, statusPodIP)
	}
	n := statuses()
	time.Sleep(2 * time.Second) // four of CRI-O's poll periods
	if c := crioCondition(t, d, "NetworkReady"); !c.Status || statuses() != n {
		t.Fatalf("range exhausted while CRI-O runs: NetworkReady %v (%s), STATUS calls %d -> %d; want true and no new STATUS (CRI-O caches the first success)", c.Status, c.Message, n, statuses())
	}
	t.Logf("check: pod %s took the range's only address %s; NetworkReady stays true and no STATUS reaches the plugins (%d STATUS to bridge so far): CRI-O asked only until the first success", short(id), statusPodIP, n)
	if _, err := d.RunPod("second", crioPod("second", d, nil)); err == nil || !strings.Contains(err.Error(), "no free address") {
		t.Fatalf("second pod on an exhausted range: %v; want ADD to fail with host-local's exhaustion error", err)
	} else {
		t.Logf("check: the next pod fails only in ADD: %s", crioCNIError(err.Error()))
	}

	d.Restart()
	// Until its first poll CRI-O says "plugin status uninitialized"; then STATUS's error.
	var c criCondition
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if c = crioCondition(t, d, "NetworkReady"); !c.Status && !strings.Contains(c.Message, "uninitialized") {
			break
		}
	}
	if c.Reason != "NetworkPluginNotReady" || !strings.Contains(c.Message, "range set 0") || !strings.Contains(c.Message, "is exhausted") || !strings.Contains(c.Message, conf.network) {
		t.Fatalf("NetworkReady false with reason %q message %q: want NetworkPluginNotReady and host-local's \"range set 0 (...) of network %s is exhausted\"", c.Reason, c.Message, conf.network)
	}
	t.Logf("check: after a restart CRI-O's STATUS fails: NetworkReady false, reason %s, message %q", c.Reason, c.Message)
	d.MustCrictl("stopp", id)
	d.MustCrictl("rmp", id)
	if _, err := os.Stat(filepath.Join(h.DataDir, conf.network, statusPodIP)); !os.IsNotExist(err) {
		t.Fatalf("lease of %s still there after rmp: %v", statusPodIP, err)
	}
	crioWaitNetwork(t, d, true, 30*time.Second)
	t.Logf("check: pod removed, lease released: CRI-O's next STATUS poll passes and NetworkReady is true again")
}

// crioCNIError cuts CRI-O's error down to the plugin's message.
func crioCNIError(s string) string {
	if i := strings.Index(s, "plugin type="); i >= 0 {
		return s[i:]
	}
	return s
}

// TestCRIOCheckFailure makes podwire's CHECK fail under CRI-O and records what CRI-O
// does with it: a running pod's host veth is deleted (so the pod loses eth0 too), and
// CRI-O is restarted, which re-CHECKs every pod. bridge's CHECK fails, naming the
// missing pod interface; CRI-O logs that it could not restore the pod's IP, keeps the pod
// SANDBOX_READY but reports no IP for it (it has no other source than CHECK's
// result), and DEL still tears the pod down cleanly.
func TestCRIOCheckFailure(t *testing.T) {
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

	id := crioRun(t, d, "broken", nil)
	p, podNS := crioPodNS(t, d, id)
	hostVeth := checkHostVeth(t, h, checkPodInterfaces(t, podNS, net.ParseIP(p.Status.Network.IP)), conf.bridge)
	if err := h.HostNS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(hostVeth)
		if err != nil {
			return err
		}
		return netlink.LinkDel(l)
	}); err != nil {
		t.Fatal(err)
	}
	n := len(cniCalls(t, conf))
	d.Restart()
	crioWaitNetwork(t, d, true, 30*time.Second)
	var failed *cniCall
	var got []string
	for _, c := range cniCalls(t, conf)[n:] {
		if c.container != id {
			continue
		}
		got = append(got, c.plugin+" "+c.verb+" "+c.msg)
		if c.verb == "CHECK" && c.msg == "failed" && failed == nil {
			c := c
			failed = &c
		}
	}
	if failed == nil || failed.plugin != "bridge" || !strings.Contains(failed.err, "eth0") || !strings.Contains(failed.err, "does not exist") {
		t.Fatalf("after deleting host veth %s and restarting CRI-O, the pod's CNI calls were %v (%+v); want bridge's CHECK to fail on the missing eth0", hostVeth, got, failed)
	}
	t.Logf("check: CRI-O's restart re-CHECKed the pod: %s; bridge's CHECK failed: %q", strings.Join(got, ", "), failed.err)

	log := d.Log()
	want := "Could not restore sandbox IP for " + id
	if !strings.Contains(log, want) {
		t.Errorf("CRI-O's log does not say %q", want)
	}
	var line string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, want) {
			line = l
		}
	}
	p2, err := d.InspectPod(id)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("recorded: CRI-O does with the failing CHECK: logs %q; keeps the pod (state %s) and reports IP %q for it",
		strings.TrimSpace(line[strings.Index(line, "msg="):]), p2.Status.State, p2.Status.Network.IP)
	if p2.Status.State != "SANDBOX_READY" {
		t.Errorf("pod state %s after the failed CHECK; this test records SANDBOX_READY (CRI-O does not act on it)", p2.Status.State)
	}
	if p2.Status.Network.IP != "" {
		t.Errorf("pod IP %q after the failed CHECK; this test records none (CRI-O takes the IP from CHECK's result)", p2.Status.Network.IP)
	}

	d.MustCrictl("stopp", id)
	d.MustCrictl("rmp", id)
	requireSettledUnchanged(t, h, before)
	t.Logf("check: DEL of the broken pod succeeded in every plugin; node state as before the pod")
}
