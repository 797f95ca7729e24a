// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// upgradeImage is the second agent image the upgrade rolls out: the same sources built
// with another version stamp, so every plugin's bytes and --version answer differ.
const upgradeImage = "docker.io/podwire/podwire-agent:upgrade-test"

// upgradeReport collects the figures make bench-upgrade writes to BENCHMARKS.md.
type upgradeReport struct {
	mu    sync.Mutex
	lines []string
}

func (r *upgradeReport) add(format string, a ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, fmt.Sprintf(format, a...))
}

// TestAgentUpgrade is issue 28's "under change" item, in order on one lab: a rolling
// upgrade of the agent DaemonSet to a second build while pods are created and deleted on
// every node; the API server stopped (PODWIRE_UPGRADE_OUTAGE, 20s by default; make
// bench-upgrade stops it for 60s); then the rollback to the lab's own image with the
// first new agent SIGKILLed while it copies the plugins.
func TestAgentUpgrade(t *testing.T) {
	p := needLab(t)
	outage := 20 * time.Second
	if v := os.Getenv("PODWIRE_UPGRADE_OUTAGE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("PODWIRE_UPGRADE_OUTAGE=%q: a duration such as 60s: %v", v, err)
		}
		outage = d
	}
	rep := &upgradeReport{}
	start := time.Now()
	v1, v2 := agentBuilds(t, p, rep)
	f := newFixture(t, p)
	// Whatever fails below, the lab ends on its own image.
	t.Cleanup(func() { setAgentImage(t, p, AgentImage) })

	t.Run("RollingUpgradeUnderChurn", func(t *testing.T) { f.t = t; rollUnderChurn(t, f, v1, v2, rep) })
	t.Run("APIServerOutage", func(t *testing.T) { f.t = t; apiOutage(t, f, outage, rep) })
	t.Run("KilledMidInstall", func(t *testing.T) { f.t = t; killedMidInstall(t, f, v1, v2, rep) })
	f.t = t
	rep.add("Whole test: %s on %d node(s).", time.Since(start).Round(time.Second), len(p.Nodes))
	t.Logf("\n%s", strings.Join(rep.lines, "\n"))
	if out := os.Getenv("PODWIRE_UPGRADE_OUT"); out != "" && !t.Failed() {
		writeUpgradeSection(t, out, outage, rep)
	}
}

// agentBuilds returns the lab's installed build (v1, read from the first node: every
// node must hold the same) and builds the second one (v2) into an image imported on
// every node.
func agentBuilds(t *testing.T, p Plan, rep *upgradeReport) (build, build) {
	var v1 build
	for _, n := range p.Nodes {
		sums, err := hashDir(n.Path("fs", podCNIBin))
		if err != nil {
			t.Fatal(err)
		}
		if v1.sums == nil {
			v1.sums = sums
			if v1.version, err = pluginVersion(filepath.Join(n.Path("fs", podCNIBin), "bridge")); err != nil {
				t.Fatal(err)
			}
		} else if fmt.Sprint(sums) != fmt.Sprint(v1.sums) {
			t.Fatalf("node %s holds other plugins than %s: %v vs %v", n.Name, p.Nodes[0].Name, sums, v1.sums)
		}
	}
	v2 := build{version: v1.version + ".upgrade"}
	t0 := time.Now()
	bin := filepath.Join(p.Dir, "images", "upgrade-bin")
	_ = os.RemoveAll(bin)
	tar := filepath.Join(p.Dir, "images", "podwire-agent-upgrade.oci.tar")
	// As make image does it, with the version stamp changed.
	for _, argv := range [][]string{
		{"make", "--no-print-directory", "build", "BIN_DIR=" + bin, "VERSION=" + v2.version},
		{"go", "run", "./hack/mkimage", "-agent", filepath.Join(bin, "podwire-agent"), "-init", filepath.Join(bin, "podwire-init"),
			"-plugins", bin, "-name", upgradeImage, "-o", tar},
	} {
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Dir = p.Repo
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("building the upgrade image: %s: %v\n%s", strings.Join(argv, " "), err, out)
		}
	}
	sums, err := hashDir(bin)
	if err != nil {
		t.Fatal(err)
	}
	delete(sums, "podwire-agent")
	delete(sums, "podwire-init")
	v2.sums = sums
	for name, s := range v1.sums {
		if v2.sums[name] == "" || v2.sums[name] == s {
			t.Fatalf("%s: the upgrade build must hold it with other bytes (v1 %s, v2 %q)", name, s, v2.sums[name])
		}
	}
	for _, n := range p.Nodes {
		if err := p.importImage(n, ImageArchive{Path: tar, Names: []string{upgradeImage}}); err != nil {
			t.Fatal(err)
		}
	}
	rep.add("Builds: v1 `%s` (the lab's image), v2 `%s` (%d plugin files, every one with other bytes); v2 built and imported on every node in %s.",
		v1.version, v2.version, len(v2.sums), time.Since(t0).Round(time.Second))
	return v1, v2
}

// setAgentImage rolls the agent DaemonSet out on image and waits for the rollout.
func setAgentImage(t *testing.T, p Plan, image string) time.Duration {
	t.Helper()
	t0 := time.Now()
	if _, err := p.Kubectl(nil, "-n", "podwire-system", "set", "image", "daemonset/podwire-agent", "agent="+image); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Kubectl(nil, "-n", "podwire-system", "rollout", "status", "daemonset/podwire-agent", "--timeout=8m"); err != nil {
		t.Fatal(err)
	}
	return time.Since(t0)
}

// churnStats counts the loop's pods.
type churnStats struct {
	mu               sync.Mutex
	created, deleted int
	names            []string
	createdAt        []time.Time
	addLat, delLat   []time.Duration
	failures         []string
}

// churn creates a pod on node, waits for it to run with an address, deletes it and waits
// for it to be gone, until stop is closed.
func churn(c *kubernetes.Clientset, ns, node string, worker int, stop <-chan struct{}, st *churnStats) {
	ctx := context.Background()
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		default:
		}
		name := fmt.Sprintf("churn-%s-%d-%d", node, worker, i)
		pod := agnhost(name, node, nil)
		pod.Spec.Containers[0].Args, pod.Spec.Containers[0].Ports, pod.Spec.Containers[0].ReadinessProbe = []string{"pause"}, nil, nil
		fail := func(format string, a ...any) {
			st.mu.Lock()
			st.failures = append(st.failures, name+": "+fmt.Sprintf(format, a...))
			st.mu.Unlock()
		}
		t0 := time.Now()
		if _, err := c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			fail("create: %v", err)
			time.Sleep(time.Second)
			continue
		}
		st.mu.Lock()
		st.created++
		st.names = append(st.names, name)
		st.createdAt = append(st.createdAt, t0)
		st.mu.Unlock()
		running := false
		for time.Since(t0) < 2*time.Minute {
			got, err := c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err == nil && got.Status.Phase == corev1.PodRunning && got.Status.PodIP != "" {
				running = true
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if !running {
			fail("not Running with an address after 2m")
		}
		addLat := time.Since(t0)
		t1 := time.Now()
		if err := c.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			fail("delete: %v", err)
			continue
		}
		gone := false
		for time.Since(t1) < 2*time.Minute {
			if _, err := c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
				gone = true
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if !gone {
			fail("still there 2m after its deletion")
			continue
		}
		st.mu.Lock()
		st.deleted++
		if running {
			st.addLat = append(st.addLat, addLat)
		}
		st.delLat = append(st.delLat, time.Since(t1))
		st.mu.Unlock()
	}
}

func pct(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[int(q*float64(len(s)-1))].Round(10 * time.Millisecond)
}

// rollUnderChurn rolls v2 out while two pods per node are created and deleted in a loop.
func rollUnderChurn(t *testing.T, f *fixture, v1, v2 build, rep *upgradeReport) {
	p := f.p
	logs := map[string]int64{}
	for _, n := range p.Nodes {
		logs[n.Name] = fileSize(filepath.Join(p.Logs, n.Name+"-containerd.log"))
	}
	stopSample, stopChurn := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	var samplers []*dirSampler
	for _, n := range p.Nodes {
		s := newDirSampler(n.Path("fs", podCNIBin), v1, v2)
		samplers = append(samplers, s)
		wg.Add(1)
		go func() { defer wg.Done(); s.run(stopSample) }()
	}
	st := &churnStats{}
	var churners sync.WaitGroup
	for _, n := range p.Nodes {
		for w := 0; w < 2; w++ {
			churners.Add(1)
			go func() { defer churners.Done(); churn(f.c, f.ns, n.Name, w, stopChurn, st) }()
		}
	}
	// The loop runs before, through and after the rollout.
	time.Sleep(10 * time.Second)
	rollStart := time.Now()
	took := setAgentImage(t, p, upgradeImage)
	time.Sleep(10 * time.Second)
	close(stopChurn)
	churners.Wait()
	close(stopSample)
	wg.Wait()

	for _, fl := range st.failures {
		t.Errorf("churn: %s", fl)
	}
	if st.created == 0 || st.deleted != st.created {
		t.Errorf("churn: %d pods created, %d deleted", st.created, st.deleted)
	}
	during := 0
	for _, at := range st.createdAt {
		if !at.Before(rollStart) && at.Before(rollStart.Add(took)) {
			during++
		}
	}
	warnings := warningEvents(t, f)
	for _, w := range warnings {
		t.Errorf("event: %s", w)
	}
	cniErrs := 0
	for _, n := range p.Nodes {
		for _, l := range containerdErrors(t, filepath.Join(p.Logs, n.Name+"-containerd.log"), logs[n.Name], st.names) {
			cniErrs++
			t.Errorf("node %s: containerd: %s", n.Name, l)
		}
	}
	var sampled []string
	for i, s := range samplers {
		for _, b := range s.bad {
			t.Errorf("node %s's %s: %s", p.Nodes[i].Name, podCNIBin, b)
		}
		sampled = append(sampled, fmt.Sprintf("%s: %s", p.Nodes[i].Name, s.summary()))
		state, temps, err := dirState(s.dir, v1, v2)
		if err != nil {
			t.Fatal(err)
		}
		for name, v := range state {
			if v != "v2" {
				t.Errorf("node %s after the rollout: %s is %s, want v2", p.Nodes[i].Name, name, v)
			}
		}
		if len(temps) > 0 {
			t.Errorf("node %s after the rollout: temporary files %v", p.Nodes[i].Name, temps)
		}
	}
	rep.add("Rolling upgrade v1 → v2 (`kubectl set image`, RollingUpdate maxUnavailable 1): rollout took %s; "+
		"the churn (2 loops per node, each creating a pod, waiting for it to run with an address, deleting it and waiting until it is gone, "+
		"from 10 s before the rollout to 10 s after it) created %d pods (%d of them while the rollout ran) and deleted %d; failures %d; Warning events in its namespace %d "+
		"(FailedCreatePodSandBox, FailedKillPod, ...); containerd error lines about CNI or the loop's pods %d. "+
		"Pod start (create to Running with an IP) p50 %s, max %s; deletion (delete to gone) p50 %s, max %s.",
		took.Round(time.Second), st.created, during, st.deleted, len(st.failures), len(warnings), cniErrs,
		pct(st.addLat, 0.5), pct(st.addLat, 1), pct(st.delLat, 0.5), pct(st.delLat, 1))
	rep.add("/opt/cni/bin sampled during it (each file hashed whenever its inode, size or mtime changed; each plugin executed every second): %s. "+
		"After the rollout every plugin file is v2 and no temporary file is left.", strings.Join(sampled, "; "))
}

func fileSize(path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return st.Size()
}

// warningEvents are the Warning events in f's namespace.
func warningEvents(t *testing.T, f *fixture) []string {
	list, err := f.c.CoreV1().Events(f.ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range list.Items {
		if e.Type == corev1.EventTypeWarning {
			out = append(out, fmt.Sprintf("%s %s: %s", e.InvolvedObject.Name, e.Reason, e.Message))
		}
	}
	return out
}

// containerdErrors are the error lines containerd logged after offset that name CNI, the
// pod network or one of pods.
func containerdErrors(t *testing.T, path string, offset int64, pods []string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if offset > int64(len(b)) {
		offset = 0
	}
	var out []string
	for _, l := range strings.Split(string(b[offset:]), "\n") {
		if !strings.Contains(l, "level=error") {
			continue
		}
		low := strings.ToLower(l)
		hit := strings.Contains(low, "cni") || strings.Contains(low, "network") || strings.Contains(low, "sandbox")
		for _, p := range pods {
			hit = hit || strings.Contains(l, p)
		}
		if hit {
			out = append(out, l)
		}
	}
	return out
}

// probeNode makes a Node with a pod CIDR and an InternalIP on the lab's segment and no
// kubelet: every agent must route its CIDR via that address.
func probeNode(t *testing.T, c *kubernetes.Clientset, p Plan) (name, cidr string, remove func()) {
	ctx := context.Background()
	a := p.ClusterCIDR.Addr().As4()
	cidr = netip.PrefixFrom(netip.AddrFrom4([4]byte{a[0], a[1], 250, 0}), 24).String()
	s := p.Segment.Addr().As4()
	ip := netip.AddrFrom4([4]byte{s[0], s[1], s[2], 99}).String()
	name = "pwupgrade-probe"
	node, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.NodeSpec{PodCIDR: cidr, PodCIDRs: []string{cidr}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	remove = func() {
		if err := c.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Error(err)
		}
	}
	t.Cleanup(remove)
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}
	if _, err := c.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return name, cidr + " via " + ip, remove
}

// routed reports whether every lab node routes route ("CIDR via IP"); want false: none does.
func routed(p Plan, route string, want bool) error {
	cidr, via, _ := strings.Cut(route, " ")
	for _, n := range p.Nodes {
		out, err := run(inNode(n, "ip", "-4", "route", "show", cidr)...)
		if err != nil {
			return err
		}
		if has := strings.Contains(out, via); has != want {
			return fmt.Errorf("node %s: route %s present %v, want %v: %q", n.Name, route, has, want, strings.TrimSpace(out))
		}
	}
	return nil
}

// writeUpgradeSection replaces the bench-upgrade section of BENCHMARKS.md.
func writeUpgradeSection(t *testing.T, path string, outage time.Duration, rep *upgradeReport) {
	const begin, end = "<!-- bench-upgrade:begin -->", "<!-- bench-upgrade:end -->"
	old, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n## podwire-agent under change (`make bench-upgrade`)\n\n", begin)
	fmt.Fprintf(&b, "TestAgentUpgrade in integration/cluster on the lab (`make cluster`), API server outage %s; on amd64, 2 CPUs shared with other work. "+
		"CI runs the same test with a 20 s outage in its own lab (`make test`).\n\n", outage)
	for _, l := range rep.lines {
		fmt.Fprintf(&b, "- %s\n", l)
	}
	b.WriteString(end + "\n")
	s := string(old)
	if i, j := strings.Index(s, begin), strings.Index(s, end); i >= 0 && j > i {
		s = s[:i] + b.String() + strings.TrimPrefix(s[j+len(end):], "\n")
	} else {
		s = strings.TrimRight(s, "\n") + "\n\n" + b.String()
	}
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}
