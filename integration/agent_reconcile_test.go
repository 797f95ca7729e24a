// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/podwire/podwire/integration/kubeapi"
	"github.com/podwire/podwire/integration/nstest"
	"github.com/podwire/podwire/pkg/agent/kube"
	"github.com/podwire/podwire/pkg/agent/routes"
)

// TestAgentReconcilers runs two agents against a real kube-apiserver, each as the
// DaemonSet's ServiceAccount with a pod-bound token, among four Nodes (two of them with
// no host: their routes are made all the same, a gateway on the segment is enough):
//   - node-2's CNI conf dir cannot be written (its parent is a file): its conflist
//     reconciler fails, is counted and retried, its Node condition says ConflistFailed
//     and /readyz refuses, while its routes to every other Node are made and follow a
//     Node's deletion; once the dir can be written the agent completes without a
//     restart;
//   - a Node deleted while node-1's agent is stopped loses its route when it starts;
//   - routes of other owners (proto static, and boot, `ip route add`'s default) to
//     pod-like CIDRs in the cluster CIDR survive every sync.
func TestAgentReconcilers(t *testing.T) {
	nstest.RequireRoot(t)
	repo, err := nstest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bins := kubeBinaries(t, repo)
	agentBin := buildAgent(t, repo)

	const clusterCIDR = "10.244.0.0/16"
	var nodes []*clusterNode
	for i := 1; i <= 2; i++ {
		h := nstest.New(t)
		n := &clusterNode{name: fmt.Sprintf("node-%d", i), h: h, lanIP: fmt.Sprintf("192.168.50.%d", 10+i),
			podCIDR: netip.MustParsePrefix(fmt.Sprintf("10.244.%d.0/24", i)), root: t.TempDir()}
		n.cni = libcni.NewCNIConfigWithCacheDir([]string{n.binDir()}, n.cacheDir(), nil)
		nodes = append(nodes, n)
	}
	healthy, broken := nodes[0], nodes[1]
	seg := newLAN(t, healthy.h)
	cp := newNetNS(t)
	seg.attach(cp, "192.168.50.2/24")
	for _, n := range nodes {
		seg.attach(n.h.HostNS, n.lanIP+"/24")
		n.h.Run(n.h.HostNS, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	}
	api := kubeapi.Start(t, bins, cp, netip.MustParseAddr("192.168.50.2"), kubeapi.ServiceAccount("podwire-system", "podwire-agent"))
	admin := api.Client(t, kubeapi.Admin)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	applyDeploy(t, api, filepath.Join(repo, "deploy", "00-rbac.yaml"), false)
	applyDeploy(t, api, filepath.Join(repo, "deploy", "01-node-policy.yaml"), false)

	// name -> (LAN address, pod CIDR)
	type member struct{ ip, cidr string }
	cluster := map[string]member{}
	for _, n := range nodes {
		createNode(ctx, t, admin, n.name, n.lanIP, n.podCIDR)
		cluster[n.name] = member{n.lanIP, n.podCIDR.String()}
	}
	for i, g := range []string{"ghost-a", "ghost-b"} {
		m := member{fmt.Sprintf("192.168.50.%d", 30+i), fmt.Sprintf("10.244.%d.0/24", 30+i)}
		createNode(ctx, t, admin, g, m.ip, netip.MustParsePrefix(m.cidr))
		cluster[g] = m
	}
	// want is "<cidr> via <ip>" for every member but self, sorted as ip route sorts.
	want := func(self string, gone ...string) []string {
		var out []string
		for name, m := range cluster {
			if name != self && !slices.Contains(gone, name) {
				out = append(out, m.cidr+" via "+m.ip)
			}
		}
		slices.SortFunc(out, func(a, b string) int {
			pa, _ := netip.ParsePrefix(strings.Fields(a)[0])
			pb, _ := netip.ParsePrefix(strings.Fields(b)[0])
			return pa.Addr().Compare(pb.Addr())
		})
		return out
	}

	// Routes of other owners on node-1, in the cluster CIDR, to CIDRs no Node has.
	healthy.h.Run(healthy.h.HostNS, "ip", "route", "add", "10.244.98.0/24", "via", "192.168.50.98", "dev", "lan0", "proto", "static")
	healthy.h.Run(healthy.h.HostNS, "ip", "route", "add", "10.244.99.0/24", "via", "192.168.50.99", "dev", "lan0")
	foreign := func() error {
		for proto, w := range map[string]string{"static": "10.244.98.0/24 via 192.168.50.98 dev lan0", "boot": "10.244.99.0/24 via 192.168.50.99 dev lan0"} {
			out := healthy.h.Run(healthy.h.HostNS, "ip", "-4", "route", "show", "proto", proto)
			if !strings.Contains(out, w) {
				return fmt.Errorf("the foreign route %q (proto %s) is gone:\n%s", w, proto, out)
			}
		}
		return nil
	}
	if err := foreign(); err != nil {
		t.Fatal(err)
	}

	// node-2's conf dir: its parent is a regular file, so nothing can be written under
	// it, not even by root.
	if err := os.MkdirAll(filepath.Join(broken.root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(broken.root, "etc", "cni"), []byte("not a dir\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		n.kubeconfig = api.PodKubeconfig(t, "podwire-system", "podwire-agent", n.name)
		n.agent = startAgent(t, n.h.HostNS, n.name+"-agent", agentBin, n.agentArgs(n.kubeconfig, clusterCIDR)...)
	}

	eventually(t, 60*time.Second, "node-1 ready", func() error { return readyz(healthy, 200) })
	eventually(t, 30*time.Second, "node-1 routes", func() error { return agentRoutes(healthy, want(healthy.name)) })
	eventually(t, 30*time.Second, "node-2 routes while its conflist fails", func() error { return agentRoutes(broken, want(broken.name)) })
	eventually(t, 30*time.Second, "node-2 condition", func() error {
		return nodeCondition(ctx, admin, broken.name, corev1.ConditionFalse, "ConflistFailed")
	})
	eventually(t, 30*time.Second, "node-2's conflist retried", func() error {
		return metricAtLeast(broken, "podwire_agent_reconcile_errors_total", `reconciler="conflist"`, 2)
	})
	if err := readyz(broken, 503); err != nil {
		t.Errorf("node-2 without a conflist: %v", err)
	}
	if err := wantMetrics(broken, map[string]float64{`podwire_agent_reconcile_errors_total{reconciler="routes"}`: 0}); err != nil {
		t.Error(err)
	}

	// A Node goes while node-2's conflist still fails: its route goes there too.
	if err := admin.CoreV1().Nodes().Delete(ctx, "ghost-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		eventually(t, 30*time.Second, n.name+" routes after ghost-b left", func() error { return agentRoutes(n, want(n.name, "ghost-b")) })
	}

	// A Node goes while node-1's agent is stopped: the route stays (nothing removes it
	// while the agent is down), and goes when the agent starts.
	healthy.agent.stop(t)
	if err := admin.CoreV1().Nodes().Delete(ctx, "ghost-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "node-2 routes after ghost-a left", func() error { return agentRoutes(broken, want(broken.name, "ghost-a", "ghost-b")) })
	if err := agentRoutes(healthy, want(healthy.name, "ghost-b")); err != nil {
		t.Fatalf("node-1's routes with its agent stopped: %v", err)
	}
	healthy.agent = startAgent(t, healthy.h.HostNS, healthy.name+"-agent-2", agentBin, healthy.agentArgs(healthy.kubeconfig, clusterCIDR)...)
	eventually(t, 60*time.Second, "node-1 routes after a restart", func() error { return agentRoutes(healthy, want(healthy.name, "ghost-a", "ghost-b")) })
	eventually(t, 30*time.Second, "node-1 ready after a restart", func() error { return readyz(healthy, 200) })
	// Several resyncs (--status-period=1s) later, the other owners' routes are there.
	time.Sleep(3 * time.Second)
	if err := foreign(); err != nil {
		t.Error(err)
	}

	// node-2's dir becomes writable: the retried conflist reconciler completes, no restart.
	if err := os.Remove(filepath.Join(broken.root, "etc", "cni")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(broken.confDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "node-2's conflist once the dir is writable", func() error {
		_, err := os.Stat(filepath.Join(broken.confDir(), "10-podwire.conflist"))
		return err
	})
	eventually(t, 30*time.Second, "node-2 condition after the fix", func() error {
		return nodeCondition(ctx, admin, broken.name, corev1.ConditionTrue, "StatusOK")
	})
	eventually(t, 30*time.Second, "node-2 ready after the fix", func() error { return readyz(broken, 200) })
}

func readyz(n *clusterNode, want int) error {
	code, body, err := nsGet(n.h.HostNS, "http://127.0.0.1:9309/readyz")
	if err == nil && code != want {
		err = fmt.Errorf("/readyz %d %s, want %d", code, strings.TrimSpace(body), want)
	}
	return err
}

// agentRoutes checks n's routes of the agent's protocol are exactly want ("<cidr> via <ip>").
func agentRoutes(n *clusterNode, want []string) error {
	out, err := nstest.RunIn(n.h.HostNS, "ip", "-4", "route", "show", "proto", fmt.Sprint(routes.Protocol))
	if err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	var got []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(l); len(f) >= 3 {
			got = append(got, strings.Join(f[:3], " "))
		}
	}
	if !slices.Equal(got, want) {
		return fmt.Errorf("%s: routes %q, want %q", n.name, got, want)
	}
	return nil
}

func nodeCondition(ctx context.Context, c kubernetes.Interface, name string, status corev1.ConditionStatus, reason string) error {
	node, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	for _, cond := range node.Status.Conditions {
		if cond.Type == kube.ConditionType {
			if cond.Status != status || cond.Reason != reason {
				return fmt.Errorf("%s: %s=%s (%s: %s), want %s (%s)", name, cond.Type, cond.Status, cond.Reason, cond.Message, status, reason)
			}
			return nil
		}
	}
	return fmt.Errorf("%s: no %s condition", name, kube.ConditionType)
}

func metricAtLeast(n *clusterNode, name, label string, min float64) error {
	code, body, err := nsGet(n.h.HostNS, "http://127.0.0.1:9310/metrics")
	if err != nil || code != 200 {
		return fmt.Errorf("scrape: %d %v", code, err)
	}
	if v, ok := metricValue(body, name, label); !ok || v < min {
		return fmt.Errorf("%s{%s} = %v (present %v), want >= %v", name, label, v, ok, min)
	}
	return nil
}
