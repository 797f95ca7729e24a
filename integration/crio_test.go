// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/podwire/podwire/integration/crio"
	"github.com/podwire/podwire/integration/nstest"
)

// crioNetwork is the network name of the CRI-O tests' conflist plus the test prefix.
// CRI-O shares libcni's result cache (/var/lib/cni/results) with containerd and podman
// and GCs every cached attachment of its network name at startup: a name another
// runtime on the node also uses loses that runtime's pods (docs/crio.md). The
// containerd tests use the kubenet example's "kubenet"; these never do.
const crioNetwork = "crio-kubenet-"

// crioConf is the kubenet conf-example as the CRI-O tests run it.
type crioConf struct {
	*kubenetConf
	cniVersion string
	logFile    string // every plugin's opt-in log
}

// crioKubenet is loadKubenetExample at cniVersion v with CRI-O's own network name and
// every plugin logging each verb to one file, which is how the tests see which verbs
// CRI-O sends to which plugin.
func crioKubenet(t *testing.T, h *nstest.H, repo, v string, edit func(list map[string]any)) *crioConf {
	t.Helper()
	kc := loadKubenetExample(t, h, repo)
	c := &crioConf{kubenetConf: kc, cniVersion: v, logFile: filepath.Join(t.TempDir(), "cni.log")}
	var list map[string]any
	if err := json.Unmarshal(kc.raw, &list); err != nil {
		t.Fatal(err)
	}
	kc.network = crioNetwork + h.Prefix
	list["name"], list["cniVersion"] = kc.network, v
	for _, p := range list["plugins"].([]any) {
		pm := p.(map[string]any)
		pm["logFile"], pm["logLevel"] = c.logFile, "info"
	}
	if edit != nil {
		edit(list)
	}
	raw, err := json.MarshalIndent(list, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	kc.raw = raw
	return c
}

// startCRIO builds (once) and starts a private CRI-O in h's node netns with conf as its
// only network. Without CRI-O (no Go module proxy, no conmon, runc, skopeo, gcc) the
// test is skipped, and fails under CI=true.
func startCRIO(t *testing.T, h *nstest.H, repo string, conf *crioConf, o crio.Options) *crio.Daemon {
	t.Helper()
	if missing := crio.Missing(); len(missing) > 0 {
		nstest.Missing(t, "the CRI-O tests need Debian packages %s: `apt-get install %s` (.ci/run installs them)",
			strings.Join(missing, ", "), strings.Join(missing, " "))
	}
	start := time.Now()
	bin, err := crio.EnsureCRIO(repo)
	if err != nil {
		nstest.Missing(t, "CRI-O %s: %v", crio.Version, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Logf("built CRI-O %s and pinns from the Go module proxy in %s (cached in %s)", crio.Version, d.Round(time.Second), bin.Dir)
	}
	confDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(confDir, "10-"+conf.network+".conflist"), conf.raw, 0o644); err != nil {
		t.Fatal(err)
	}
	o.NetNS, o.CNIBinDir, o.CNIConfDir, o.Repo, o.Bin = h.HostNS.Path(), h.BinDir, confDir, repo, bin
	if o.Dir == "" {
		o.Dir = t.TempDir()
	}
	began := time.Now()
	d := crio.Start(t, o)
	t.Logf("%s (%s) runs in node netns %s, pid %d, up in %s; conflist %s at cniVersion %s: %s",
		d.Version, d.Socket, h.HostNS.Path(), d.Pid(), time.Since(began).Round(10*time.Millisecond), conf.network, conf.cniVersion, strings.Join(conf.plugins, " + "))
	return d
}

// crioPod is one pod sandbox config: pid namespace CONTAINER (the kubelet's default,
// which needs no infra process: on this machine runc cannot give an infra process
// CRI-O's oom_score_adj -998 without CAP_SYS_RESOURCE), the daemon's cgroup parent,
// and the given extras.
func crioPod(name string, d *crio.Daemon, extra map[string]any) map[string]any {
	var uid [16]byte
	_, _ = rand.Read(uid[:])
	cfg := map[string]any{
		"metadata":      map[string]any{"name": name, "namespace": "podwire-e2e", "uid": hex.EncodeToString(uid[:]), "attempt": 0},
		"hostname":      name,
		"log_directory": filepath.Join(d.Dir, "pods", name),
		"linux": map[string]any{"cgroup_parent": d.CgroupParent,
			"security_context": map[string]any{"namespace_options": map[string]any{"pid": 1}}},
	}
	for k, v := range extra {
		cfg[k] = v
	}
	return cfg
}

// crioRun runs a pod and returns its ID.
func crioRun(t *testing.T, d *crio.Daemon, name string, extra map[string]any) string {
	t.Helper()
	id, err := d.RunPod(name, crioPod(name, d, extra))
	if err != nil {
		t.Fatalf("running pod %s: %v", name, err)
	}
	return id
}

// crioPodNS returns a pod's IP and its netns, opened from the test's mount namespace.
func crioPodNS(t *testing.T, d *crio.Daemon, id string) (*crio.PodInspect, ns.NetNS) {
	t.Helper()
	p, err := d.InspectPod(id)
	if err != nil {
		t.Fatal(err)
	}
	if p.NetNS() == "" {
		t.Fatalf("pod %s has no netns in its runtime spec", short(id))
	}
	n, err := ns.GetNS(d.NetNSPath(p.NetNS()))
	if err != nil {
		t.Fatalf("opening pod %s's netns %s: %v", short(id), p.NetNS(), err)
	}
	t.Cleanup(func() { n.Close() })
	return p, n
}

// crioCondition returns `crictl info`'s condition typ.
func crioCondition(t *testing.T, d *crio.Daemon, typ string) criCondition {
	t.Helper()
	out := d.MustCrictl("info")
	var info struct {
		Status struct {
			Conditions []criCondition `json:"conditions"`
		} `json:"status"`
	}
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		t.Fatalf("parsing crictl info: %v\n%s", err, out)
	}
	for _, c := range info.Status.Conditions {
		if c.Type == typ {
			return c
		}
	}
	t.Fatalf("crictl info has no %s condition:\n%s", typ, out)
	return criCondition{}
}

// crioWaitNetwork polls NetworkReady until it is want.
func crioWaitNetwork(t *testing.T, d *crio.Daemon, want bool, timeout time.Duration) criCondition {
	t.Helper()
	var c criCondition
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if c = crioCondition(t, d, "NetworkReady"); c.Status == want {
			return c
		}
	}
	t.Fatalf("NetworkReady is %v after %s (reason %q, message %q), want %v", c.Status, timeout, c.Reason, c.Message, want)
	return c
}

// cniCall is one plugin's final log line for one verb.
type cniCall struct{ plugin, verb, container, netns, msg, err string }

// cniCalls reads the plugins' log: one entry per verb each plugin finished.
func cniCalls(t *testing.T, c *crioConf) []cniCall {
	t.Helper()
	if _, err := os.Stat(c.logFile); os.IsNotExist(err) {
		return nil
	}
	var out []cniCall
	for _, l := range readLog(t, c.logFile) {
		if l["msg"] != "done" && l["msg"] != "failed" {
			continue
		}
		s := func(k string) string { v, _ := l[k].(string); return v }
		out = append(out, cniCall{plugin: s("plugin"), verb: s("verb"), container: s("containerID"), netns: s("netns"), msg: s("msg"), err: s("error")})
	}
	return out
}

// verbs are the calls of container (any, when "") as "plugin VERB" in order.
func verbs(calls []cniCall, container string) []string {
	var out []string
	for _, c := range calls {
		if container == "" || c.container == container {
			s := c.plugin + " " + c.verb
			if c.msg == "failed" {
				s += " FAILED"
			}
			out = append(out, s)
		}
	}
	return out
}

// TestCRIOPods runs pods through CRI-O with the kubenet chain at cniVersion 1.0.0 and
// 1.1.0: the pod IP CRI-O reports is podwire's; CRI-O sends CHECK right after ADD and
// every plugin passes it; a CRI-O restart re-CHECKs every pod and they survive; at
// 1.1.0 CRI-O's STATUS reaches every plugin (at 1.0.0 none); the loopback plugin is
// never called (CRI-O brings lo up itself); stopping and removing the pods DELs them in
// reverse chain order and leaves the node as it was.
func TestCRIOPods(t *testing.T) {
	nstest.RequireRoot(t)
	for _, v := range []string{"1.0.0", "1.1.0"} {
		t.Run("cni-"+v, func(t *testing.T) { testCRIOPods(t, v) })
	}
}

func testCRIOPods(t *testing.T, cniVersion string) {
	h := nstest.New(t)
	repo, err := nstest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	conf := crioKubenet(t, h, repo, cniVersion, nil)
	d := startCRIO(t, h, repo, conf, crio.Options{})
	crioWaitNetwork(t, d, true, 30*time.Second)
	chain := []string{"bridge", "portmap", "bandwidth"}

	warm := crioRun(t, d, "warm", nil)
	waitNoTentative(t, h)
	d.MustCrictl("stopp", warm)
	d.MustCrictl("rmp", warm)
	before := settledSnapshot(t, h)

	var ids []string
	ips := map[string]string{}
	for _, name := range []string{"one", "two"} {
		id := crioRun(t, d, name, nil)
		ids = append(ids, id)
		p, podNS := crioPodNS(t, d, id)
		ip := net.ParseIP(p.Status.Network.IP)
		if p.Status.State != "SANDBOX_READY" || ip == nil || !conf.subnet.Contains(ip) {
			t.Fatalf("pod %s: state %s IP %q, want SANDBOX_READY with an IP in %s", name, p.Status.State, p.Status.Network.IP, conf.subnet)
		}
		if b, err := os.ReadFile(filepath.Join(h.DataDir, conf.network, ip.String())); err != nil || !strings.Contains(string(b), id) {
			t.Fatalf("host-local lease of %s: %q, %v; want it to name sandbox %s", ip, b, err, short(id))
		}
		peer := checkPodInterfaces(t, podNS, ip)
		checkHostVeth(t, h, peer, conf.bridge)
		h.MustPing(podNS, conf.gateway.String())
		ips[id] = ip.String()
		got := verbs(cniCalls(t, conf), id)
		want := []string{}
		for _, verb := range []string{"ADD", "CHECK"} {
			for _, p := range chain {
				want = append(want, p+" "+verb)
			}
		}
		if strings.Join(got, ", ") != strings.Join(want, ", ") {
			t.Fatalf("pod %s: CNI calls %v, want %v (ADD down the chain, then CHECK down the chain, each passing)", name, got, want)
		}
		t.Logf("check: pod %s %s: CRI-O reports IP %s (host-local's lease in %s), eth0 and lo up, gateway answers; CNI calls: %s",
			name, short(id), ip, conf.subnet, strings.Join(got, ", "))
	}
	for _, c := range cniCalls(t, conf) {
		if c.plugin == "loopback" {
			t.Fatalf("CRI-O called the loopback plugin (%s): it brings lo up itself", c.verb)
		}
	}
	statuses := func() map[string]int {
		n := map[string]int{}
		for _, c := range cniCalls(t, conf) {
			if c.verb == "STATUS" {
				n[c.plugin]++
			}
		}
		return n
	}
	if s := statuses(); cniVersion == "1.1.0" {
		for _, p := range chain {
			if s[p] == 0 {
				t.Errorf("at cniVersion 1.1.0 CRI-O never sent STATUS to %s (STATUS calls: %v)", p, s)
			}
		}
		t.Logf("check: at 1.1.0 CRI-O's STATUS reached every plugin: %v", s)
	} else if len(s) > 0 {
		t.Errorf("at cniVersion 1.0.0 the plugins got STATUS %v: libcni sends it only from 1.1.0", s)
	} else {
		t.Logf("check: at 1.0.0 no plugin got STATUS (libcni sends it only from 1.1.0); NetworkReady is true regardless")
	}

	// A restart: CRI-O restores its pods from storage and re-reads each pod's IP with
	// CHECK (libcni's cached result is what it reports).
	statusBefore := statuses()
	n := len(cniCalls(t, conf))
	restart := time.Now()
	d.Restart()
	crioWaitNetwork(t, d, true, 30*time.Second)
	t.Logf("CRI-O restarted in %s", time.Since(restart).Round(10*time.Millisecond))
	after := cniCalls(t, conf)[n:]
	for _, id := range ids {
		got := verbs(after, id)
		want := []string{}
		for _, p := range chain {
			want = append(want, p+" CHECK")
		}
		if strings.Join(got, ", ") != strings.Join(want, ", ") {
			t.Errorf("after the restart pod %s got CNI calls %v, want %v", short(id), got, want)
		}
		p, podNS := crioPodNS(t, d, id)
		if p.Status.State != "SANDBOX_READY" || p.Status.Network.IP != ips[id] {
			t.Fatalf("after the restart pod %s: state %s IP %q, want SANDBOX_READY with %s", short(id), p.Status.State, p.Status.Network.IP, ips[id])
		}
		h.MustPing(podNS, conf.gateway.String())
	}
	if s := statuses(); cniVersion == "1.1.0" && len(s) > 0 {
		for _, p := range chain {
			if s[p] <= statusBefore[p] {
				t.Errorf("after the restart CRI-O sent no new STATUS to %s (before %v, now %v)", p, statusBefore, s)
			}
		}
	}
	t.Logf("check: the restart re-CHECKed every pod down the chain (%s) and each kept SANDBOX_READY, its IP and its gateway",
		strings.Join(verbs(after, ""), ", "))

	n = len(cniCalls(t, conf))
	for _, id := range ids {
		d.MustCrictl("stopp", id)
		d.MustCrictl("rmp", id)
		if left := libcniCacheFiles(id); len(left) > 0 {
			t.Errorf("pod %s removed, libcni cache entries left: %v", short(id), left)
		}
	}
	del := cniCalls(t, conf)[n:]
	for _, id := range ids {
		got := verbs(del, id)
		// CRI-O may DEL once on stopp and again on rmp; each DEL goes in reverse order.
		if len(got) < 3 || strings.Join(got[:3], ", ") != "bandwidth DEL, portmap DEL, bridge DEL" {
			t.Errorf("pod %s: DEL calls %v, want bandwidth DEL, portmap DEL, bridge DEL", short(id), got)
		}
	}
	requireSettledUnchanged(t, h, before)
	if cg := d.Cgroups(); len(cg) > 0 {
		t.Errorf("pod cgroups left: %v", cg)
	}
	t.Logf("check: stopp + rmp ran DEL in reverse order (%s); node state (links, addresses, routes, iptables, nftables, qdiscs, sysctls, leases) and the libcni cache as before the pods",
		strings.Join(verbs(del, ""), ", "))
}
