// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/podwire/podwire/integration/kubeapi"
	"github.com/podwire/podwire/integration/nstest"
	"github.com/podwire/podwire/internal/benchmd"
	"github.com/podwire/podwire/pkg/agent/routes"
)

// TestAgentScale measures podwire-agent against a real kube-apiserver holding many
// Nodes the size kubelets make them (images, conditions, labels), with agents in node
// namespaces on one segment: how long until a new Node's route is on every agent, each
// agent's RSS and CPU, and its requests per minute as the API server's audit log records
// them (by the node its token is bound to), at rest and during a churn of heartbeat-like
// Node status patches. Bounded by default (300 Nodes, 2 agents, 15 s windows) so it runs
// in `go test ./integration/...`; `make bench-agent` runs 2,000 Nodes and writes the
// table into BENCHMARKS.md (PODWIRE_AGENT_BENCH_NODES, _AGENTS, _WINDOW, _CHURN, _OUT).
func TestAgentScale(t *testing.T) {
	nstest.RequireRoot(t)
	repo, err := nstest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	nNodes := envInt("PODWIRE_AGENT_BENCH_NODES", 300)
	nAgents := envInt("PODWIRE_AGENT_BENCH_AGENTS", 2)
	window := time.Duration(envInt("PODWIRE_AGENT_BENCH_WINDOW", 15)) * time.Second
	// The kubelet's pre-Lease heartbeat: a status update every 10 s per Node.
	churn := envInt("PODWIRE_AGENT_BENCH_CHURN", max(1, nNodes/10))
	bins := kubeBinaries(t, repo)
	agentBin := buildAgent(t, repo)

	h := nstest.New(t)
	seg := newLAN(t, h)
	cp := newNetNS(t)
	seg.attach(cp, "10.200.0.2/16")
	api := kubeapi.Start(t, bins, cp, netip.MustParseAddr("10.200.0.2"), kubeapi.ServiceAccount("podwire-system", "podwire-agent"))
	// The test's client may go faster than client-go's default 100 QPS (the churn).
	cfg := api.RESTConfig(t, kubeapi.Admin)
	cfg.QPS, cfg.Burst = 2000, 4000
	admin, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	applyDeploy(t, api, filepath.Join(repo, "deploy", "00-rbac.yaml"), false)
	applyDeploy(t, api, filepath.Join(repo, "deploy", "01-node-policy.yaml"), false)

	// Node i: InternalIP 10.200.x.y on the segment, pod CIDR the i-th /24 of 10.64.0.0/10.
	nodeIP := func(i int) string { return fmt.Sprintf("10.200.%d.%d", 1+i/250, 1+i%250) }
	nodeCIDR := func(i int) netip.Prefix {
		return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(64 + i/256), byte(i % 256), 0}), 24)
	}
	start := time.Now()
	parallel(nNodes, 16, func(i int) { createFatNode(ctx, t, admin, fmt.Sprintf("n%05d", i), nodeIP(i), nodeCIDR(i)) })
	created := time.Since(start)

	type agent struct {
		name  string
		netns ns.NetNS
		proc  *agentProc
	}
	var agents []*agent
	for i := 0; i < nAgents; i++ {
		a := &agent{name: fmt.Sprintf("n%05d", i), netns: newNetNS(t)}
		seg.attach(a.netns, nodeIP(i)+"/16")
		root := t.TempDir()
		kc := api.PodKubeconfig(t, "podwire-system", "podwire-agent", a.name)
		a.proc = startAgent(t, a.netns, a.name+"-agent", agentBin, "--kubeconfig="+kc, "--node-name="+a.name,
			"--source-bin-dir="+h.BinDir, "--cni-bin-dir="+filepath.Join(root, "bin"), "--cni-conf-dir="+filepath.Join(root, "net.d"),
			"--cni-cache-dir="+filepath.Join(root, "cache"), "--state-dir="+filepath.Join(root, "state"), "--ipam-data-dir="+filepath.Join(root, "ipam"),
			"--bridge="+h.Name(fmt.Sprintf("b%d", i)), "--network-name=scale", "--cri-socket=", "--cni-version=1.1.0",
			"--cluster-cidr=10.64.0.0/10", "--health-addr=127.0.0.1:9309", "--metrics-addr=127.0.0.1:9310",
			"--gc-period=0", "--status-period=30s", "--log-level=warn")
		agents = append(agents, a)
	}
	startAgents := time.Now()
	for _, a := range agents {
		eventually(t, 5*time.Minute, a.name+" routes to every Node", func() error {
			n, err := countRoutes(a.netns)
			if err == nil && n != nNodes-1 {
				err = fmt.Errorf("%d routes, want %d", n, nNodes-1)
			}
			return err
		})
	}
	converged := time.Since(startAgents)
	time.Sleep(3 * time.Second) // the first condition and annotation patches settle

	// measure is one window: CPU and requests of each agent, RSS at its end, and the time
	// a Node created mid-window takes to be routed on every agent.
	next := nNodes
	measure := func(label string) benchRow {
		row := benchRow{label: label}
		cpu0 := map[string]time.Duration{}
		for _, a := range agents {
			cpu0[a.name] = procCPU(t, a.proc.cmd.Process.Pid)
		}
		t0 := time.Now()
		time.Sleep(window / 2)
		lat, err := routeLatency(ctx, admin, agents[0].netns, func() []ns.NetNS {
			var out []ns.NetNS
			for _, a := range agents {
				out = append(out, a.netns)
			}
			return out
		}(), fmt.Sprintf("n%05d", next), nodeIP(next), nodeCIDR(next))
		if err != nil {
			t.Fatal(err)
		}
		next++
		row.latency = lat
		time.Sleep(time.Until(t0.Add(window)))
		el := time.Since(t0)
		reqs := api.Requests(t)
		for _, a := range agents {
			n := 0
			for _, r := range reqs {
				if r.Node == a.name && !r.Time.Before(t0) && r.Time.Before(t0.Add(el)) {
					n++
				}
			}
			row.reqPerMin = max(row.reqPerMin, float64(n)/el.Minutes())
			row.cpu = max(row.cpu, float64(procCPU(t, a.proc.cmd.Process.Pid)-cpu0[a.name])/float64(el))
			row.rssMiB = max(row.rssMiB, procRSS(t, a.proc.cmd.Process.Pid))
		}
		return row
	}
	rows := []benchRow{measure("at rest")}

	// Churn: heartbeat-like status patches of every Node in turn, churn per second.
	stop := make(chan struct{})
	var patched atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(time.Second / time.Duration(churn))
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			now := metav1.Now().UTC().Format(time.RFC3339)
			patch := fmt.Sprintf(`{"status":{"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","lastHeartbeatTime":%q}]}}`, now)
			go func() {
				if _, err := admin.CoreV1().Nodes().Patch(ctx, fmt.Sprintf("n%05d", nAgents+i%(nNodes-nAgents)), types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err == nil {
					patched.Add(1)
				}
			}()
		}
	}()
	churnStart := time.Now()
	row := measure("")
	rate := float64(patched.Load()) / time.Since(churnStart).Seconds()
	row.label = fmt.Sprintf("churn: %.0f Node status patches/s (asked %d/s)", rate, churn)
	rows = append(rows, row)
	close(stop)
	wg.Wait()
	if rate < float64(churn)/2 {
		t.Errorf("the churn reached %.0f patches/s of %d", rate, churn)
	}

	var b strings.Builder
	fmt.Fprintf(&b, "%d Nodes (created through the API in %.1fs), %d agents; every agent had a route to every Node %.1fs after starting; windows of %s.\n\n",
		nNodes, created.Seconds(), nAgents, converged.Seconds(), window)
	fmt.Fprintf(&b, "On %s, %d CPUs shared with other work; kube-apiserver and etcd on the same machine.\n\n", runtime.GOARCH, runtime.NumCPU())
	fmt.Fprintf(&b, "| state | new Node routed on every agent | agent requests/min (max) | agent CPU (max, cores) | agent RSS (max) |\n|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %.0f ms | %.1f | %.3f | %.0f MiB |\n", r.label, float64(r.latency)/float64(time.Millisecond), r.reqPerMin, r.cpu, r.rssMiB)
	}
	b.WriteString("\n")
	// The audit log sees the agents at all: each watched the Nodes (client-go's informer
	// lists through the watch, sendInitialEvents) and patched its own Node's status, so
	// the zeros above are measured, not missed.
	all := api.Requests(t)
	for _, a := range agents {
		verbs := map[string]int{}
		for _, r := range all {
			if r.Node == a.name {
				verbs[r.Verb+" "+r.Resource]++
			}
		}
		if verbs["watch nodes"] == 0 || verbs["patch nodes/status"] == 0 {
			t.Errorf("%s's requests in the audit log: %v, want a watch and a status patch", a.name, verbs)
		}
		var vs []string
		for v, n := range verbs {
			vs = append(vs, fmt.Sprintf("%s %d", v, n))
		}
		slices.Sort(vs)
		fmt.Fprintf(&b, "- agent on %s, every request of the whole run: %s\n", a.name, strings.Join(vs, ", "))
	}
	t.Logf("\n%s", b.String())
	for _, r := range rows {
		// No request per period, and none per Node update: at most the odd watch renewal.
		if r.reqPerMin > 6 {
			t.Errorf("%s: %.1f requests/min by one agent, want (almost) none", r.label, r.reqPerMin)
		}
		if r.latency > 10*time.Second {
			t.Errorf("%s: a new Node took %v to be routed", r.label, r.latency)
		}
	}
	if out := os.Getenv("PODWIRE_AGENT_BENCH_OUT"); out != "" {
		writeBenchSection(t, out, b.String())
	}
}

type benchRow struct {
	label     string
	latency   time.Duration
	reqPerMin float64
	cpu       float64
	rssMiB    float64
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func parallel(n, workers int, f func(i int)) {
	ch := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range ch {
				f(i)
			}
		}()
	}
	for i := 0; i < n; i++ {
		ch <- i
	}
	close(ch)
	wg.Wait()
}

// createFatNode makes a Node the size a kubelet registers: labels, 40 images, its
// conditions, addresses, node info.
func createFatNode(ctx context.Context, t *testing.T, c kubernetes.Interface, name, ip string, cidr netip.Prefix) {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
			"node.kubernetes.io/instance-type": "m5.xlarge", "topology.kubernetes.io/zone": "zone-a"}},
		Spec: corev1.NodeSpec{PodCIDR: cidr.String(), PodCIDRs: []string{cidr.String()}, ProviderID: "bench://" + name},
	}
	got, err := c.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		t.Errorf("creating Node %s: %v", name, err)
		return
	}
	now := metav1.Now()
	got.Status = corev1.NodeStatus{
		Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}, {Type: corev1.NodeHostName, Address: name}},
		Capacity:  corev1.ResourceList{}, NodeInfo: corev1.NodeSystemInfo{KubeletVersion: "v1.37.2", ContainerRuntimeVersion: "containerd://2.1.0", OSImage: "Debian GNU/Linux 12", KernelVersion: "6.1.0"},
	}
	for _, ct := range []corev1.NodeConditionType{corev1.NodeReady, corev1.NodeMemoryPressure, corev1.NodeDiskPressure, corev1.NodePIDPressure} {
		got.Status.Conditions = append(got.Status.Conditions, corev1.NodeCondition{Type: ct, Status: corev1.ConditionFalse, Reason: "Kubelet" + string(ct),
			Message: "kubelet is posting status", LastHeartbeatTime: now, LastTransitionTime: now})
	}
	for j := 0; j < 40; j++ {
		got.Status.Images = append(got.Status.Images, corev1.ContainerImage{SizeBytes: int64(1e8 + j),
			Names: []string{fmt.Sprintf("registry.example/team/app-%d@sha256:%064x", j, j), fmt.Sprintf("registry.example/team/app-%d:v1.%d", j, j)}})
	}
	if _, err := c.CoreV1().Nodes().UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Errorf("Node %s's status: %v", name, err)
	}
}

func countRoutes(n ns.NetNS) (int, error) {
	var count int
	err := n.Do(func(ns.NetNS) error {
		rs, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Protocol: routes.Protocol, Table: unix.RT_TABLE_MAIN},
			netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
		count = len(rs)
		return err
	})
	return count, err
}

func hasRoute(n ns.NetNS, dst netip.Prefix) bool {
	found := false
	_ = n.Do(func(ns.NetNS) error {
		rs, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Protocol: routes.Protocol, Table: unix.RT_TABLE_MAIN,
			Dst: &net.IPNet{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(dst.Bits(), 32)}},
			netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE|netlink.RT_FILTER_DST)
		found = err == nil && len(rs) > 0
		return nil
	})
	return found
}

// routeLatency creates a Node and returns how long until every agent has its route.
func routeLatency(ctx context.Context, c kubernetes.Interface, _ ns.NetNS, agents []ns.NetNS, name, ip string, cidr netip.Prefix) (time.Duration, error) {
	t0 := time.Now()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{PodCIDRs: []string{cidr.String()}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}}}
	got, err := c.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return 0, err
	}
	got.Status = node.Status
	if _, err := c.CoreV1().Nodes().UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
		return 0, err
	}
	pending := slices.Clone(agents)
	for len(pending) > 0 {
		if time.Since(t0) > time.Minute {
			return 0, fmt.Errorf("Node %s not routed on %d agents within a minute", name, len(pending))
		}
		pending = slices.DeleteFunc(pending, func(n ns.NetNS) bool { return hasRoute(n, cidr) })
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(t0), nil
}

// procCPU is the user+system CPU time of pid.
func procCPU(t *testing.T, pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

// procRSS is pid's resident set in MiB.
func procRSS(t *testing.T, pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	t.Fatalf("no VmRSS for %d", pid)
	return 0
}

// writeBenchSection replaces the agent-scale section of the file at path (between its
// markers; appended when absent), leaving the rest as it is.
func writeBenchSection(t *testing.T, path, table string) {
	body := "## podwire-agent at scale (`make bench-agent`)\n\n" + table +
		"\nRequests are the agent's own, as the API server's audit log records them (by the node its pod-bound token names); " +
		"CPU is user+system time over the window; the new Node is created through the API and its route polled in every agent's namespace. " +
		"For comparison (not measured here): kindnet and flannel watch and cache whole Node objects and act on every Node update; podwire-agent caches five fields of each and ignores updates that change none of them, so the churn costs it only decoding the watch.\n"
	if err := benchmd.WriteSection(path, "bench-agent", body); err != nil {
		t.Fatal(err)
	}
}
