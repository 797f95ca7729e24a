// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/podwire/podwire/internal/benchmd"
)

// The plugins the lab's conflist runs, and where the reference v1.10.0 ones come from.
const referenceVersion = "v1.10.0"

var chainPlugins = map[string]string{
	"bridge": "plugins/main/bridge", "host-local": "plugins/ipam/host-local", "loopback": "plugins/main/loopback",
	"portmap": "plugins/meta/portmap", "bandwidth": "plugins/meta/bandwidth",
}

// TestPodStartup is make bench-startup: pods created at once, spread over the nodes,
// timed from the Create call to the Ready the API server reports, with podwire's plugins
// and then the reference ones in /opt/cni/bin under the same conflist, in interleaved
// rounds. The agent is moved off the nodes for the whole run, so that both sets run
// alone and the agent does not put its binaries back; it is restored at the end.
// Without PODWIRE_LAB_BENCH=1 it is a bounded round of a few pods per set that writes
// nothing (CI proves the harness; the figures come from make bench-startup).
func TestPodStartup(t *testing.T) {
	p := needLab(t)
	pods, rounds := 4, 1
	full := os.Getenv("PODWIRE_LAB_BENCH") == "1"
	if full {
		pods, rounds = 30, 3
	}
	ref := referencePluginDir(t, p)
	agentOff(t, p)
	saved := t.TempDir()
	for _, n := range p.Nodes {
		must(t, copyPlugins(n.Path("fs", "/opt/cni/bin"), filepath.Join(saved, n.Name)))
	}
	t.Cleanup(func() {
		for _, n := range p.Nodes {
			if err := copyPlugins(filepath.Join(saved, n.Name), n.Path("fs", "/opt/cni/bin")); err != nil {
				t.Errorf("putting podwire's plugins back on %s: %v", n.Name, err)
			}
		}
	})
	results := map[string][]time.Duration{}
	var walls = map[string][]time.Duration{}
	for r := 0; r < rounds; r++ {
		for _, set := range []string{"podwire", "reference"} {
			src := ref
			for _, n := range p.Nodes {
				if set == "podwire" {
					src = filepath.Join(saved, n.Name)
				}
				must(t, copyPlugins(src, n.Path("fs", "/opt/cni/bin")))
			}
			before := leases(p)
			f := newFixture(t, p)
			lat, wall := startRound(t, f, pods)
			results[set] = append(results[set], lat...)
			walls[set] = append(walls[set], wall)
			f.deleteNamespace()
			waitLeases(t, p, before)
		}
	}
	table := "| plugins | pods | p50 create→Ready | p99 | slowest round, all Ready |\n|---|---|---|---|---|\n"
	for _, set := range []string{"podwire", "reference"} {
		l := results[set]
		slices.Sort(l)
		table += fmt.Sprintf("| %s %s | %d (%d rounds of %d) | %s | %s | %s |\n", set, map[string]string{"podwire": "(this commit)", "reference": referenceVersion}[set],
			len(l), rounds, pods, startupPct(l, 50), startupPct(l, 99), slices.Max(walls[set]).Round(10*time.Millisecond))
	}
	t.Logf("pod startup:\n%s", table)
	if full {
		body := "## Pod startup in the lab (`make bench-startup`)\n\n" +
			fmt.Sprintf("%d pods (pause image, no probes) created at once, spread over the lab's %d nodes (kube-proxy %s), "+
				"timed from each Create call to the Ready condition seen on a watch; %d interleaved rounds per plugin set, "+
				"podwire's and the reference %s in each node's /opt/cni/bin under the agent's conflist (the agent is moved off "+
				"the nodes for the run; both sets run without it). Run %s.\n\n", pods, len(p.Nodes), p.ProxyMode, rounds, referenceVersion,
				time.Now().UTC().Format("2006-01-02")) + table +
			"\nThe kubelet, containerd and the API server dominate: the plugins' share of a pod's start is the chain ADD " +
			"(tens of milliseconds, section 1), so the two sets differ by less than the rounds do.\n"
		must(t, benchmd.WriteSection(filepath.Join(p.Repo, "BENCHMARKS.md"), "bench-startup", body))
	}
}

// startRound creates n pause pods at once, alternating over the nodes, and returns each
// one's create→Ready time and the time until all were Ready.
func startRound(t *testing.T, f *fixture, n int) ([]time.Duration, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	w, err := f.c.CoreV1().Pods(f.ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	created := map[string]time.Time{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		node := f.p.Nodes[i%len(f.p.Nodes)].Name
		name := fmt.Sprintf("start-%02d", i)
		grace := int64(0)
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{
				NodeSelector:                  map[string]string{"kubernetes.io/hostname": node},
				TerminationGracePeriodSeconds: &grace,
				Containers:                    []corev1.Container{{Name: "pause", Image: PauseImage, ImagePullPolicy: corev1.PullNever}},
			},
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			at := time.Now()
			if _, err := f.c.CoreV1().Pods(f.ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				errs <- fmt.Errorf("creating %s: %w", name, err)
				return
			}
			mu.Lock()
			created[name] = at
			mu.Unlock()
		}()
	}
	ready := map[string]time.Time{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			for _, c := range pod.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					if _, seen := ready[pod.Name]; !seen {
						ready[pod.Name] = time.Now()
					}
				}
			}
			if len(ready) == n {
				return
			}
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-ctx.Done():
	}
	if len(ready) != n {
		t.Fatalf("%d of %d pods Ready within 5m", len(ready), n)
	}
	var lat []time.Duration
	var last time.Time
	for name, at := range ready {
		lat = append(lat, at.Sub(created[name]))
		if at.After(last) {
			last = at
		}
	}
	return lat, last.Sub(start)
}

// agentOff moves podwire-agent off every node (a nodeSelector no node has) until the
// test ends; the Cleanup puts the DaemonSet back as it was and waits for its rollout.
func agentOff(t *testing.T, p Plan) {
	t.Helper()
	c, err := p.Client()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ds := c.AppsV1().DaemonSets("podwire-system")
	patch := func(v string) {
		body := `{"spec":{"template":{"spec":{"nodeSelector":{"podwire.io/startup-bench":` + v + `}}}}}`
		if _, err := ds.Patch(ctx, "podwire-agent", types.StrategicMergePatchType, []byte(body), metav1.PatchOptions{}); err != nil {
			t.Fatalf("patching podwire-agent: %v", err)
		}
	}
	patch(`"off"`)
	t.Cleanup(func() {
		patch("null")
		if out, err := p.Kubectl(nil, "-n", "podwire-system", "rollout", "status", "ds/podwire-agent", "--timeout=3m"); err != nil {
			t.Errorf("podwire-agent back on the nodes: %v\n%s", err, out)
		}
	})
	eventually(t, 2*time.Minute, func() error {
		l, err := c.CoreV1().Pods("podwire-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=podwire-agent"})
		if err != nil {
			return err
		}
		if len(l.Items) > 0 {
			return fmt.Errorf("%d podwire-agent pods still there", len(l.Items))
		}
		return nil
	})
}

// leases are the host-local lease files of every node (node/address → container ID).
func leases(p Plan) map[string]string {
	held := map[string]string{}
	for _, n := range p.Nodes {
		files, _ := filepath.Glob(n.Path("fs", "/var/lib/cni", "networks", "*", "*.*.*.*"))
		for _, l := range files {
			if b, err := os.ReadFile(l); err == nil {
				held[n.Name+"/"+filepath.Base(l)] = strings.SplitN(string(b), "\n", 2)[0]
			}
		}
	}
	return held
}

// waitLeases waits until the nodes hold no lease that was not held before the round:
// every DEL of the round has run before the next one starts.
func waitLeases(t *testing.T, p Plan, before map[string]string) {
	t.Helper()
	eventually(t, 2*time.Minute, func() error {
		var extra []string
		for k, id := range leases(p) {
			if before[k] != id {
				extra = append(extra, k)
			}
		}
		if len(extra) > 0 {
			return fmt.Errorf("leases of the round's pods still held: %v", extra)
		}
		return nil
	})
}

// referencePluginDir returns the reference plugins of the chain, installed from the Go
// module proxy into .cache once (as the integration tests and make bench do).
func referencePluginDir(t *testing.T, p Plan) string {
	t.Helper()
	dir := filepath.Join(p.Repo, ".cache", "reference-"+referenceVersion)
	var missing []string
	for name, pkg := range chainPlugins {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			missing = append(missing, "github.com/containernetworking/plugins/"+pkg+"@"+referenceVersion)
		}
	}
	if len(missing) > 0 {
		cmd := exec.Command("go", append([]string{"install", "-trimpath"}, missing...)...)
		cmd.Env = append(os.Environ(), "GOBIN="+dir, "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("installing the reference plugins %s (the benchmark's baseline): %v\n%s", referenceVersion, err, out)
		}
	}
	return dir
}

// copyPlugins copies the chain's plugins from src to dst, each through a temporary file
// renamed over the old one, so a runtime never executes a half-written binary.
func copyPlugins(src, dst string) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	for name := range chainPlugins {
		in, err := os.Open(filepath.Join(src, name))
		if err != nil {
			return err
		}
		tmp, err := os.CreateTemp(dst, "."+name+"-")
		if err != nil {
			in.Close()
			return err
		}
		_, err = io.Copy(tmp, in)
		in.Close()
		if err == nil {
			err = tmp.Chmod(0o755)
		}
		if cerr := tmp.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Rename(tmp.Name(), filepath.Join(dst, name))
		}
		if err != nil {
			os.Remove(tmp.Name())
			return fmt.Errorf("copying %s to %s: %w", name, dst, err)
		}
	}
	return nil
}

// startupPct is the p-th percentile of sorted (nearest rank).
func startupPct(sorted []time.Duration, p int) string {
	if len(sorted) == 0 {
		return "-"
	}
	i := (len(sorted)*p + 99) / 100
	i = min(max(i, 1), len(sorted)) - 1
	return sorted[i].Round(10 * time.Millisecond).String()
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(strings.TrimSpace(err.Error()))
	}
}
