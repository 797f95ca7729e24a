// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/podwire/podwire/integration/containerd"
	"github.com/podwire/podwire/integration/kubeapi"
	"github.com/podwire/podwire/integration/nstest"
)

var (
	agentBuild    sync.Once
	agentBinPath  string
	agentBuildErr error
)

// buildAgent builds cmd/podwire-agent once per test binary.
func buildAgent(t *testing.T, repo string) string {
	t.Helper()
	agentBuild.Do(func() {
		dir, err := os.MkdirTemp("", "podwire-agent-")
		if err != nil {
			agentBuildErr = err
			return
		}
		agentBinPath = filepath.Join(dir, "podwire-agent")
		out, err := exec.Command("go", "build", "-o", agentBinPath, filepath.Join(repo, "cmd/podwire-agent")).CombinedOutput()
		if err != nil {
			agentBuildErr = fmt.Errorf("building podwire-agent: %v\n%s", err, out)
		}
	})
	if agentBuildErr != nil {
		t.Fatal(agentBuildErr)
	}
	return agentBinPath
}

// kubeBinaries builds (or finds) etcd and kube-apiserver; without them the test is
// skipped, and fails under CI=true.
func kubeBinaries(t *testing.T, repo string) kubeapi.Binaries {
	t.Helper()
	bins, err := kubeapi.Ensure(repo)
	if err != nil {
		nstest.Missing(t, "no kube-apiserver and etcd: %v", err)
	}
	return bins
}

// TestAgentGCWithContainerd runs the podwire-agent binary as the DaemonSet runs it on a
// containerd node: against a real API server (as deploy/'s ServiceAccount) and the
// node's real containerd over CRI, containerd using the conflist and plugins the agent
// installed. The agent picks the conflist's cniVersion from containerd's CRI version
// (1.0.0 for 1.6, 1.1.0 for 2.x). Its periodic GC leaves live pods alone and, after a
// sandbox leaks without CNI DEL, reclaims the pod's lease, veth, IFB, rules and cache
// entries (the agent's network's and containerd's own cni-loopback's) within one
// --gc-period (plus --gc-grace), counted in its metrics (the rules as the hostPort chain
// they were in), keeping the live pod's.
func TestAgentGCWithContainerd(t *testing.T) {
	nstest.RequireRoot(t)
	forEachContainerd(t, testAgentGCWithContainerd)
}

func testAgentGCWithContainerd(t *testing.T, rt containerd.Runtime) {
	h := nstest.New(t)
	repo, err := nstest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bins := kubeBinaries(t, repo)
	agentBin := buildAgent(t, repo)

	seg := newLAN(t, h)
	cp := newNetNS(t)
	seg.attach(cp, "192.168.51.2/24")
	seg.attach(h.HostNS, "192.168.51.10/24")
	agentUser := kubeapi.ServiceAccount("podwire-system", "podwire-agent")
	api := kubeapi.Start(t, bins, cp, netip.MustParseAddr("192.168.51.2"), agentUser)
	applyDeploy(t, api, filepath.Join(repo, "deploy", "00-rbac.yaml"), false)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	podCIDR := netip.MustParsePrefix("10.245.7.0/24")
	createNode(ctx, t, api.Client(t, kubeapi.Admin), "node-gc", "192.168.51.10", podCIDR)

	n := &clusterNode{name: "node-gc", h: h, lanIP: "192.168.51.10", podCIDR: podCIDR, root: t.TempDir()}
	for _, d := range []string{n.binDir(), n.confDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	d := containerd.Start(t, containerd.Options{
		NetNS: h.HostNS.Path(), CNIBinDir: n.binDir(), CNIConfDir: n.confDir(), Dir: t.TempDir(), Repo: repo, Runtime: rt,
	})
	const period, grace = 8 * time.Second, 2 * time.Second
	args := n.agentArgs(api.Kubeconfig(t, agentUser), "10.245.0.0/16")
	args = append(args, "--cri-socket="+d.Socket, "--cni-version=auto", "--cni-cache-dir="+e2eLibcniCache,
		"--gc-period="+period.String(), "--gc-grace="+grace.String())
	n.agent = startAgent(t, h.HostNS, "agent", agentBin, args...)
	eventually(t, 60*time.Second, "agent ready", func() error {
		code, body, err := nsGet(h.HostNS, "http://127.0.0.1:9309/readyz")
		if err == nil && code != 200 {
			err = fmt.Errorf("/readyz %d %s", code, body)
		}
		return err
	})
	requireCRIReady(t, d)

	raw, err := os.ReadFile(filepath.Join(n.confDir(), "10-podwire.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	list, err := libcni.ConfListFromBytes(raw)
	if err != nil {
		t.Fatal(err)
	}
	wantVersion := "1.1.0"
	if rt.Name == containerd.Debian().Name {
		wantVersion = "1.0.0" // containerd 1.6's libcni 1.1 refuses 1.1.0 for every pod
	}
	if list.CNIVersion != wantVersion {
		t.Errorf("the agent wrote cniVersion %s for %s, want %s", list.CNIVersion, d.Version, wantVersion)
	}
	t.Logf("check: the agent found %s over CRI and wrote cniVersion %s; containerd loaded it (NetworkReady)", d.Version, list.CNIVersion)
	conf := &kubenetConf{source: "the agent's conflist", raw: raw, network: list.Name, bridge: h.Name("br"),
		subnet: &net.IPNet{IP: podCIDR.Addr().AsSlice(), Mask: net.CIDRMask(podCIDR.Bits(), 32)}}
	conf.gateway = podCIDR.Addr().Next().AsSlice()
	for _, p := range list.Plugins {
		conf.plugins = append(conf.plugins, p.Network.Type)
	}
	gcRuns := func() float64 {
		_, body, err := nsGet(h.HostNS, "http://127.0.0.1:9310/metrics")
		if err != nil {
			t.Fatalf("scraping the agent: %v", err)
		}
		v, _ := metricValue(body, "podwire_agent_gc_runs_total", `result="success"`)
		return v
	}
	liveID := runPod(t, d, "live", conf)
	waitNoTentative(t, h)
	before := settledSnapshot(t, h)
	leakID := runPod(t, d, "leak", conf)
	waitNoTentative(t, h)
	// containerd caches each pod's attachments to its own loopback network (cni-loopback,
	// which is in no conf dir) and to the agent's.
	for _, id := range []string{liveID, leakID} {
		requireCacheEntries(t, id, conf.network)
	}
	// Two GC runs that begin after both pods are listed and older than the grace: live
	// pods keep everything.
	time.Sleep(grace)
	start := gcRuns()
	eventually(t, 3*period, "two GC runs with both pods live", func() error {
		if r := gcRuns(); r < start+2 {
			return fmt.Errorf("gc_runs_total{success} %v, want ≥ %v", r, start+2)
		}
		return nil
	})
	if err := wantMetrics(n, map[string]float64{`podwire_agent_gc_reclaimed_total{kind="lease"}`: 0,
		`podwire_agent_gc_reclaimed_total{kind="runtime-attachment"}`: 0, `podwire_agent_gc_runs_total{result="error"}`: 0}); err != nil {
		t.Fatalf("GC with both pods live: %v", err)
	}
	for _, id := range []string{liveID, leakID} {
		if p, err := d.InspectPod(id); err != nil || p.Status.State != "SANDBOX_READY" {
			t.Fatalf("pod %s after the agent's GC runs: %+v, %v", short(id), p, err)
		}
	}

	l := leakSandbox(t, h, d, conf, leakID)
	leakedAt := time.Now()
	waitReclaimed(t, h, conf.network, l, before, 2*period+grace+15*time.Second)
	t.Logf("check: the agent's periodic GC (period %v, grace %v) reclaimed the sandbox %s leaked without DEL %s after the leak (node as before it)",
		period, grace, short(leakID), time.Since(leakedAt).Round(100*time.Millisecond))
	eventually(t, 10*time.Second, "reclaimed counts", func() error {
		return wantMetrics(n, map[string]float64{
			`podwire_agent_gc_reclaimed_total{kind="lease"}`:      1,
			`podwire_agent_gc_reclaimed_total{kind="veth"}`:       1,
			`podwire_agent_gc_reclaimed_total{kind="ifb"}`:        1,
			`podwire_agent_gc_reclaimed_total{kind="attachment"}`: 1,
			// the pod's hostPort chain (portmap's iptables layout; the agent's conflist
			// has no ipMasq)
			`podwire_agent_gc_reclaimed_total{kind="rule"}`: 1,
			// its cni-loopback cache entry
			`podwire_agent_gc_reclaimed_total{kind="runtime-attachment"}`: 1,
		})
	})
	// Both of the leaked sandbox's cache entries are gone in the run that reclaimed the
	// pod (the runtime's networks run right after the agent's), the live pod's stay.
	if left := libcniCacheFiles(leakID); len(left) > 0 {
		t.Fatalf("libcni cache entries of the leaked sandbox %s left after the agent's GC: %v", short(leakID), left)
	}
	requireCacheEntries(t, liveID, conf.network)
	t.Logf("check: the leaked sandbox's cache entries in %s and cni-loopback are gone, the live pod's kept", conf.network)
	if p, err := d.InspectPod(liveID); err != nil || p.Status.State != "SANDBOX_READY" {
		t.Fatalf("live pod after the leak's GC: %+v, %v", p, err)
	}
	if _, err := os.Stat(filepath.Join(h.DataDir, conf.network)); err != nil {
		t.Fatalf("live pod's lease dir: %v", err)
	}
}

// requireCacheEntries checks that libcni's cache in the runtime's cache dir holds sandbox
// id's attachments to containerd's cni-loopback (lo) and to network (eth0).
func requireCacheEntries(t *testing.T, id, network string) {
	t.Helper()
	for _, name := range []string{"cni-loopback-" + id + "-lo", network + "-" + id + "-eth0"} {
		if _, err := os.Stat(filepath.Join(e2eLibcniCache, "results", name)); err != nil {
			t.Fatalf("libcni cache entry of sandbox %s: %v (entries: %v)", short(id), err, libcniCacheFiles(id))
		}
	}
}
