// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/podwire/podwire/pkg/agent/kube"
	"github.com/podwire/podwire/pkg/agent/metrics"
	"github.com/podwire/podwire/pkg/agent/routes"
	"github.com/podwire/podwire/pkg/netfilter"
	nffake "github.com/podwire/podwire/pkg/netfilter/fake"
)

// world is an agent on fakes: Nodes a, b, c in a fake clientset, node a's agent.
type world struct {
	cfg    Config
	kc     *fake.Clientset
	rt     *routes.Fake
	kernel *nffake.Kernel
	cni    *fakeCNI
	crt    Runtime
	m      *metrics.Metrics
	a      *Agent
	stop   func()
}

func newWorld(t *testing.T, period time.Duration, tweak func(*world)) *world {
	t.Helper()
	root := t.TempDir()
	src := filepath.Join(root, "src")
	os.MkdirAll(src, 0o755)
	for _, p := range []string{"bridge", "host-local", "portmap", "bandwidth"} {
		os.WriteFile(filepath.Join(src, p), []byte(p), 0o755)
	}
	w := &world{
		kc: fake.NewClientset(
			mkNode("a", "192.168.50.1", "10.244.0.0/24"),
			mkNode("b", "192.168.50.2", "10.244.1.0/24"),
			mkNode("c", "192.168.50.3", "10.244.2.0/24")),
		rt:     &routes.Fake{Conn: []routes.Connected{{Prefix: netip.MustParsePrefix("192.168.50.0/24"), LinkIndex: 2}}},
		kernel: nffake.New(), cni: &fakeCNI{statusOK: true}, m: metrics.New(),
	}
	w.cfg = Config{NodeName: "a", SourceBinDir: src, CNIBinDir: filepath.Join(root, "bin"), CNIConfDir: filepath.Join(root, "net.d"),
		ConflistName: "10-podwire.conflist", NetworkName: "podwire", CNIVersion: "1.1.0", Bridge: "cni0",
		IPAMDataDir: filepath.Join(root, "ipam"), ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
		StatusPeriod: period, StateDir: filepath.Join(root, "state"), Routes: true, Masquerade: true}
	if tweak != nil {
		tweak(w)
	}
	a, err := New(w.cfg, Deps{Kube: w.kc, Runtime: w.crt, Routes: w.rt, Masq: netfilter.NewNFTablesOn(w.kernel), CNI: w.cni, Metrics: w.m})
	if err != nil {
		t.Fatal(err)
	}
	w.a = a
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- a.Run(ctx) }()
	w.stop = func() { cancel(); <-done }
	t.Cleanup(w.stop)
	return w
}

func (w *world) condition(t *testing.T) (corev1.NodeCondition, bool) {
	n, err := w.kc.CoreV1().Nodes().Get(context.Background(), "a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range n.Status.Conditions {
		if c.Type == kube.ConditionType {
			return c, true
		}
	}
	return corev1.NodeCondition{}, false
}

// patches counts the agent's writes to the API server.
func (w *world) patches() int {
	n := 0
	for _, a := range w.kc.Actions() {
		if a.GetVerb() == "patch" {
			n++
		}
	}
	return n
}

func counter(c interface{ Write(*dto.Metric) error }) float64 {
	var m dto.Metric
	_ = c.Write(&m)
	return m.GetCounter().GetValue()
}

const bcRoutes = "10.244.1.0/24 via 192.168.50.2 dev #2 proto 165\n10.244.2.0/24 via 192.168.50.3 dev #2 proto 165"

// A conf dir nothing can be written to: the conflist reconciler fails, is counted,
// retried, and sets the condition; routes and masquerade go on; once the dir is
// writable the conflist is written and the Node is ready, without a restart.
func TestConflistFailureDoesNotStopOthers(t *testing.T) {
	var blocker string
	w := newWorld(t, 50*time.Millisecond, func(w *world) {
		blocker = filepath.Dir(w.cfg.CNIConfDir) + "/etc"
		os.WriteFile(blocker, nil, 0o644)
		w.cfg.CNIConfDir = filepath.Join(blocker, "net.d")
	})
	eventually(t, "routes while the conflist fails", func() bool { return w.rt.Dump() == bcRoutes })
	eventually(t, "masquerade while the conflist fails", func() bool { return counter(w.m.MasqueradeSync.WithLabelValues("success")) >= 1 })
	eventually(t, "ConflistFailed", func() bool {
		c, ok := w.condition(t)
		return ok && c.Status == corev1.ConditionFalse && c.Reason == "ConflistFailed"
	})
	eventually(t, "retries", func() bool { return counter(w.m.ReconcileErrors.WithLabelValues(rConflist)) >= 2 })
	if w.a.Ready() {
		t.Error("ready without a conflist")
	}
	if n := counter(w.m.ReconcileErrors.WithLabelValues(rRoutes)) + counter(w.m.ReconcileErrors.WithLabelValues(rMasquerade)); n != 0 {
		t.Errorf("%v errors of routes and masquerade", n)
	}
	os.Remove(blocker)
	eventually(t, "the conflist once the dir is writable", func() bool { _, err := os.Stat(w.a.ConflistPath()); return err == nil })
	eventually(t, "StatusOK", func() bool {
		c, ok := w.condition(t)
		return ok && c.Status == corev1.ConditionTrue && c.Reason == "StatusOK" && w.a.Ready()
	})
}

// A failing route change and a failing nftables commit are retried on their own; the
// conflist and the condition do not wait for them.
func TestRouteAndMasqueradeFailuresRetried(t *testing.T) {
	w := newWorld(t, time.Hour, func(w *world) {
		w.rt.Fail = errors.New("EPERM")
		w.kernel.FailNext("flush", errors.New("EPERM"))
	})
	eventually(t, "the conflist", func() bool { _, err := os.Stat(w.a.ConflistPath()); return err == nil })
	eventually(t, "routes after a retry", func() bool { return w.rt.Dump() == bcRoutes })
	eventually(t, "masquerade after a retry", func() bool { return counter(w.m.MasqueradeSync.WithLabelValues("success")) == 1 })
	if n := counter(w.m.ReconcileErrors.WithLabelValues(rRoutes)); n != 1 {
		t.Errorf("route reconcile errors %v, want 1", n)
	}
	if n := counter(w.m.ReconcileErrors.WithLabelValues(rMasquerade)); n != 1 {
		t.Errorf("masquerade reconcile errors %v, want 1", n)
	}
	eventually(t, "StatusOK", func() bool { c, ok := w.condition(t); return ok && c.Reason == "StatusOK" })
}

// A failing STATUS is the condition; a later success flips it, each written once.
func TestStatusReconciler(t *testing.T) {
	w := newWorld(t, 30*time.Millisecond, func(w *world) { w.cni.statusOK = false })
	eventually(t, "StatusCode50", func() bool { c, ok := w.condition(t); return ok && c.Reason == "StatusCode50" })
	w.cni.mu.Lock()
	w.cni.statusOK = true
	w.cni.mu.Unlock()
	eventually(t, "StatusOK", func() bool { c, ok := w.condition(t); return ok && c.Reason == "StatusOK" })
	eventually(t, "the annotation", func() bool {
		n, _ := w.kc.CoreV1().Nodes().Get(context.Background(), "a", metav1.GetOptions{})
		return n.Annotations[kube.FreeAddressesAnnotation] != ""
	})
	// Many status periods with nothing changing: no write at all (no heartbeat).
	before := w.patches()
	time.Sleep(20 * 30 * time.Millisecond)
	if n := w.patches() - before; n != 0 {
		t.Errorf("%d patches with nothing changed", n)
	}
	// Someone else changes the agent's condition: the agent puts it back.
	patch := `{"status":{"conditions":[{"type":"PodwireNetworkReady","status":"False","reason":"Tampered","message":"x"}]}}`
	if _, err := w.kc.CoreV1().Nodes().Patch(context.Background(), "a", types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the condition put back", func() bool { c, _ := w.condition(t); return c.Reason == "StatusOK" })
}

// Heartbeat-like updates of other Nodes (status conditions, labels) wake no
// reconciler; a pod CIDR change does, and a deleted Node's route goes.
func TestNodeEventsFiltered(t *testing.T) {
	w := newWorld(t, time.Hour, nil)
	eventually(t, "routes", func() bool { return w.rt.Dump() == bcRoutes })
	eventually(t, "StatusOK", func() bool { c, ok := w.condition(t); return ok && c.Reason == "StatusOK" })
	time.Sleep(100 * time.Millisecond)
	syncs, patches := counter(w.m.RouteSync.WithLabelValues("success")), w.patches()
	ctx := context.Background()
	for i := range 50 {
		b, _ := w.kc.CoreV1().Nodes().Get(ctx, "b", metav1.GetOptions{})
		b.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.NewTime(time.Now())}}
		b.Labels = map[string]string{"beat": string(rune('a' + i%26))}
		if _, err := w.kc.CoreV1().Nodes().Update(ctx, b, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(200 * time.Millisecond)
	if n := counter(w.m.RouteSync.WithLabelValues("success")) - syncs; n != 0 {
		t.Errorf("%v route syncs for heartbeats", n)
	}
	if n := w.patches() - patches; n != 0 {
		t.Errorf("%d patches for other Nodes' heartbeats", n)
	}
	b, _ := w.kc.CoreV1().Nodes().Get(ctx, "b", metav1.GetOptions{})
	b.Spec.PodCIDRs = []string{"10.244.7.0/24"}
	if _, err := w.kc.CoreV1().Nodes().Update(ctx, b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "b's new route", func() bool {
		return w.rt.Dump() == "10.244.2.0/24 via 192.168.50.3 dev #2 proto 165\n10.244.7.0/24 via 192.168.50.2 dev #2 proto 165"
	})
	// What the informer keeps of b: the transform's fields, nothing else.
	cached, err := w.a.nodes.Get("b")
	if err != nil || len(cached.Labels) != 0 || len(cached.Status.Conditions) != 0 {
		t.Errorf("cached b: %+v, %v", cached, err)
	}
}

// Routes of the agent's protocol to CIDRs no Node has (a Node deleted while the agent
// was down) go at start; other owners' routes stay.
func TestStaleRoutesAtStart(t *testing.T) {
	w := newWorld(t, time.Hour, func(w *world) {
		w.rt.Replace(routes.Route{Dst: netip.MustParsePrefix("10.244.9.0/24"), Gw: netip.MustParseAddr("192.168.50.9"), LinkIndex: 2})
		w.rt.AddForeign(routes.Route{Dst: netip.MustParsePrefix("10.244.8.0/24"), Gw: netip.MustParseAddr("192.168.50.8"), LinkIndex: 2})
	})
	eventually(t, "the stale route gone, the foreign one kept", func() bool {
		return w.rt.Dump() == bcRoutes+"\n10.244.8.0/24 via 192.168.50.8 dev #2 proto static"
	})
}

// GC's first run waits for the conflist, then GC runs every period on its own.
func TestGCReconciler(t *testing.T) {
	var blocker string
	w := newWorld(t, 50*time.Millisecond, func(w *world) {
		w.cfg.GCPeriod = 100 * time.Millisecond
		w.crt = fakeRuntime{"containerd", "2.1.0"}
		blocker = filepath.Dir(w.cfg.CNIConfDir) + "/etc"
		os.WriteFile(blocker, nil, 0o644)
		w.cfg.CNIConfDir = filepath.Join(blocker, "net.d")
	})
	eventually(t, "the conflist failing", func() bool { return counter(w.m.ReconcileErrors.WithLabelValues(rConflist)) >= 1 })
	time.Sleep(300 * time.Millisecond)
	if n := counter(w.m.GCRuns.WithLabelValues("success")) + counter(w.m.GCRuns.WithLabelValues("skipped")); n != 0 {
		t.Errorf("%v GC runs without a conflist", n)
	}
	os.Remove(blocker)
	eventually(t, "GC runs, repeatedly", func() bool { return counter(w.m.GCRuns.WithLabelValues("success")) >= 3 })
}
