// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"

	"github.com/podwire/podwire/integration/kubeapi"
	"github.com/podwire/podwire/integration/nodestate"
	"github.com/podwire/podwire/integration/nstest"
	"github.com/podwire/podwire/pkg/agent/kube"
	"github.com/podwire/podwire/pkg/agent/routes"
)

// clusterNode is one simulated Kubernetes node: a host namespace (nstest.H) on the LAN,
// its CNI directories, and the agent running in it.
type clusterNode struct {
	name    string
	h       *nstest.H
	lanIP   string
	podCIDR netip.Prefix
	root    string // the node's /opt/cni/bin, /etc/cni/net.d, /var/lib/cni, agent state
	cni     *libcni.CNIConfig
	agent   *agentProc
	before  nodestate.Snapshot
	// kubeconfig holds the agent's token, bound to a pod on this node (TestAgentCluster).
	kubeconfig string
}

func (n *clusterNode) binDir() string   { return filepath.Join(n.root, "opt/cni/bin") }
func (n *clusterNode) confDir() string  { return filepath.Join(n.root, "etc/cni/net.d") }
func (n *clusterNode) cacheDir() string { return filepath.Join(n.root, "var/lib/cni") }

// agentArgs are the flags the DaemonSet passes, with the node's directories for the
// host mounts, no CRI (the conflist's cniVersion is given; GC is tested against a real
// containerd in TestContainerdAgentGC) and short periods.
func (n *clusterNode) agentArgs(kubeconfig, clusterCIDR string) []string {
	return []string{
		"--kubeconfig=" + kubeconfig, "--node-name=" + n.name,
		"--source-bin-dir=" + n.h.BinDir,
		"--cni-bin-dir=" + n.binDir(), "--cni-conf-dir=" + n.confDir(), "--cni-cache-dir=" + n.cacheDir(),
		"--state-dir=" + filepath.Join(n.root, "var/lib/podwire-agent"),
		"--ipam-data-dir=" + n.h.DataDir,
		"--bridge=" + n.h.Name("br"), "--network-name=" + n.h.Name("net"),
		"--cri-socket=", "--cni-version=1.1.0", "--cluster-cidr=" + clusterCIDR,
		"--health-addr=127.0.0.1:9309", "--metrics-addr=127.0.0.1:9310",
		"--gc-period=0", "--status-period=1s", "--log-level=debug",
	}
}

// TestAgentCluster runs podwire-agent on three simulated nodes against a real
// kube-apiserver and etcd: the Nodes are made through the API; each agent, as the
// DaemonSet's ServiceAccount under deploy/'s RBAC, installs the plugins and writes the
// conflist; pods made through libcni with those files reach each other across nodes
// without NAT (host-gw routes) and an outside host with NAT; deleting a Node removes its
// routes on the others; the metrics count it; and --uninstall leaves every node as it
// was before the agent.
func TestAgentCluster(t *testing.T) {
	nstest.RequireRoot(t)
	repo, err := nstest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bins := kubeBinaries(t, repo)
	agentBin := buildAgent(t, repo)

	// The segment: a control-plane host, three nodes and an outside host (no route to
	// any pod CIDR, so it can only answer pods whose traffic was masqueraded).
	const clusterCIDR = "10.244.0.0/16"
	var nodes []*clusterNode
	for i := 1; i <= 3; i++ {
		h := nstest.New(t)
		n := &clusterNode{name: fmt.Sprintf("node-%d", i), h: h, lanIP: fmt.Sprintf("192.168.50.%d", 10+i),
			podCIDR: netip.MustParsePrefix(fmt.Sprintf("10.244.%d.0/24", i)), root: t.TempDir()}
		n.cni = libcni.NewCNIConfigWithCacheDir([]string{n.binDir()}, n.cacheDir(), nil)
		nodes = append(nodes, n)
	}
	seg := newLAN(t, nodes[0].h)
	cp, outside := newNetNS(t), newNetNS(t)
	seg.attach(cp, "192.168.50.2/24")
	seg.attach(outside, "192.168.50.100/24")
	for _, n := range nodes {
		seg.attach(n.h.HostNS, n.lanIP+"/24")
		// Forwarding is on on every Kubernetes node (the kubelet's prerequisites); set it
		// before the snapshot, so the snapshot holds what the agent and plugins change.
		n.h.Run(n.h.HostNS, "sysctl", "-qw", "net.ipv4.ip_forward=1")
		waitLANUp(t, n.h, n.h.HostNS)
		waitNoTentative(t, n.h)
		n.before = n.h.Snapshot()
	}

	agentUser := kubeapi.ServiceAccount("podwire-system", "podwire-agent")
	api := kubeapi.Start(t, bins, cp, netip.MustParseAddr("192.168.50.2"), agentUser)
	admin := api.Client(t, kubeapi.Admin)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	// deploy/ as an operator applies it: its namespace, RBAC and Node policy for real
	// (each agent authenticates as its ServiceAccount with a token bound to a pod on
	// its node, as the DaemonSet's pods do), then the whole manifest, DaemonSet
	// included, accepted in a server-side dry run.
	applyDeploy(t, api, filepath.Join(repo, "deploy", "00-rbac.yaml"), false)
	applyDeploy(t, api, filepath.Join(repo, "deploy", "01-node-policy.yaml"), false)
	applyDeploy(t, api, filepath.Join(repo, "deploy"), true)

	for _, n := range nodes {
		createNode(ctx, t, admin, n.name, n.lanIP, n.podCIDR)
	}
	for _, n := range nodes {
		n.kubeconfig = api.PodKubeconfig(t, "podwire-system", "podwire-agent", n.name)
		n.agent = startAgent(t, n.h.HostNS, n.name+"-agent", agentBin, n.agentArgs(n.kubeconfig, clusterCIDR)...)
	}

	// Each node: binaries as shipped, the conflist for its pod CIDR, ready, host-gw
	// routes to the two others, the condition on its Node.
	lists := map[string]*libcni.NetworkConfigList{}
	for _, n := range nodes {
		eventually(t, 60*time.Second, n.name+" ready", func() error {
			code, body, err := nsGet(n.h.HostNS, "http://127.0.0.1:9309/readyz")
			if err == nil && code != 200 {
				err = fmt.Errorf("/readyz %d %s", code, body)
			}
			return err
		})
		requireInstalled(t, n)
		list, err := libcni.ConfListFromFile(filepath.Join(n.confDir(), "10-podwire.conflist"))
		if err != nil {
			t.Fatalf("%s: the agent's conflist: %v", n.name, err)
		}
		if !bytes.Contains(list.Bytes, []byte(`"`+n.podCIDR.String()+`"`)) {
			t.Fatalf("%s: conflist does not hold the Node's pod CIDR %s:\n%s", n.name, n.podCIDR, list.Bytes)
		}
		lists[n.name] = list
		eventually(t, 30*time.Second, n.name+" routes", func() error { return wantRoutes(n, nodes) })
		eventually(t, 30*time.Second, n.name+" condition", func() error {
			node, err := admin.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			for _, c := range node.Status.Conditions {
				if c.Type == kube.ConditionType && c.Status == corev1.ConditionTrue {
					if node.Annotations[kube.FreeAddressesAnnotation] == "" {
						return fmt.Errorf("no %s annotation", kube.FreeAddressesAnnotation)
					}
					return nil
				}
			}
			return fmt.Errorf("no %s=True condition: %+v", kube.ConditionType, node.Status.Conditions)
		})
	}

	// A pod on each node, through the agent's conflist and binaries.
	type pod struct {
		node *clusterNode
		ns   ns.NetNS
		rt   *libcni.RuntimeConf
		ip   string
		echo string
	}
	var pods []*pod
	for _, n := range nodes {
		p := n.h.NewPod()
		// The runtime brings the pod's lo up (containerd and CRI-O run loopback). Go's
		// net package also probes IPv6 once per process by binding ::1 on the first
		// socket that needs it: from a pod without lo, every later test in this process
		// would get IPv4-only "[::]" listeners.
		n.h.Run(p, "ip", "link", "set", "lo", "up")
		rt := n.h.RT(p, "eth0")
		res, err := n.h.AddWith(n.cni, lists[n.name], rt)
		if err != nil {
			t.Fatalf("%s: ADD through the agent's conflist: %v", n.name, err)
		}
		ip := res.IPs[0].Address.IP.String()
		if !n.podCIDR.Contains(netip.MustParseAddr(ip)) {
			t.Fatalf("%s: pod got %s, outside the Node's pod CIDR %s", n.name, ip, n.podCIDR)
		}
		pods = append(pods, &pod{node: n, ns: p, rt: rt, ip: ip, echo: peerEcho(t, p, ip)})
	}
	outsideEcho := peerEcho(t, outside, "192.168.50.100")
	for _, from := range pods {
		fromNS := from.ns
		for _, to := range pods {
			if to == from {
				continue
			}
			seen, err := seenAs(fromNS, to.echo)
			if err != nil {
				t.Fatalf("pod on %s to pod on %s: %v", from.node.name, to.node.name, err)
			}
			if seen != from.ip {
				t.Errorf("pod %s on %s reached pod on %s as %s: pod-to-pod traffic across nodes must not be NATed", from.ip, from.node.name, to.node.name, seen)
			}
		}
		if err := nstest.Ping(fromNS, "192.168.50.100"); err != nil {
			t.Errorf("pod on %s to the outside host: %v", from.node.name, err)
		}
		seen, err := seenAs(fromNS, outsideEcho)
		if err != nil {
			t.Fatalf("pod on %s to the outside host: %v", from.node.name, err)
		}
		if seen != from.node.lanIP {
			t.Errorf("pod %s on %s reached the outside host as %s, want its node's %s (masqueraded)", from.ip, from.node.name, seen, from.node.lanIP)
		}
	}

	// The metrics count what is there.
	for _, n := range nodes {
		eventually(t, 30*time.Second, n.name+" metrics", func() error {
			return wantMetrics(n, map[string]float64{
				"podwire_agent_routes":        2,
				"podwire_agent_network_ready": 1,
				`podwire_agent_addresses_used{range="` + n.podCIDR.String() + `"}`: 1,
				// every plugin, and the conflist
				`podwire_agent_install_events_total{result="installed"}`: float64(len(pluginNames(t, n.h.BinDir)) + 1),
				`podwire_agent_route_sync_total{result="error"}`:         0,
			})
		})
	}

	// A Node goes: its routes go everywhere else; its agent keeps running.
	gone := nodes[2]
	if err := admin.CoreV1().Nodes().Delete(ctx, gone.name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes[:2] {
		eventually(t, 30*time.Second, n.name+" routes after "+gone.name+" left", func() error { return wantRoutes(n, nodes[:2]) })
		eventually(t, 30*time.Second, n.name+" route metric", func() error {
			return wantMetrics(n, map[string]float64{"podwire_agent_routes": 1})
		})
	}
	if _, err := seenAs(pods[0].ns, pods[2].echo); err == nil {
		t.Errorf("a pod on %s still reaches the pod on deleted %s", nodes[0].name, gone.name)
	}

	// Tear down as an operator does: pods deleted, the agents stopped, `--uninstall`.
	for _, p := range pods {
		if err := p.node.h.DelWith(p.node.cni, lists[p.node.name], p.rt); err != nil {
			t.Fatalf("%s: DEL: %v", p.node.name, err)
		}
	}
	for _, n := range nodes {
		n.agent.stop(t)
		out, err := exec.Command("nsenter", append([]string{"--net=" + n.h.HostNS.Path(), agentBin, "--uninstall"},
			n.agentArgs(n.kubeconfig, clusterCIDR)...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: podwire-agent --uninstall: %v\n%s", n.name, err, out)
		}
		for _, d := range []string{n.binDir(), n.confDir()} {
			if left, _ := os.ReadDir(d); len(left) != 0 {
				t.Errorf("%s: --uninstall left %d entries in %s (%s…)", n.name, len(left), d, left[0].Name())
			}
		}
		// The bridge is the bridge plugin's, left after the last pod as the reference
		// leaves it; an operator removing podwire deletes it.
		n.h.Run(n.h.HostNS, "ip", "link", "del", n.h.Name("br"))
		n.h.RequireUnchanged(n.before)
	}
}

// requireInstalled checks the node's CNI bin dir holds each shipped plugin, byte for byte.
func requireInstalled(t *testing.T, n *clusterNode) {
	t.Helper()
	for _, p := range pluginNames(t, n.h.BinDir) {
		want, err := os.ReadFile(filepath.Join(n.h.BinDir, p))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(n.binDir(), p))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s: %s not installed as shipped (%v)", n.name, p, err)
		}
	}
}

func pluginNames(t *testing.T, dir string) []string {
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		if !e.IsDir() {
			names = append(names, e.Name())
		}
	}
	return names
}

// wantRoutes checks node n's routes of the agent's protocol are exactly one per other
// member of peers, via its LAN address.
func wantRoutes(n *clusterNode, peers []*clusterNode) error {
	out, err := nstest.RunIn(n.h.HostNS, "ip", "-4", "route", "show", "proto", fmt.Sprint(routes.Protocol))
	if err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	var want []string
	for _, p := range peers {
		if p != n {
			want = append(want, fmt.Sprintf("%s via %s dev lan0", p.podCIDR, p.lanIP))
		}
	}
	got := strings.Split(strings.TrimSpace(out), "\n")
	if strings.TrimSpace(out) == "" {
		got = nil
	}
	if len(got) != len(want) {
		return fmt.Errorf("routes %q, want %q", got, want)
	}
	for i := range want {
		if !strings.HasPrefix(strings.TrimSpace(got[i]), want[i]) {
			return fmt.Errorf("routes %q, want %q", got, want)
		}
	}
	return nil
}

// wantMetrics scrapes the node's agent and compares the given series.
func wantMetrics(n *clusterNode, want map[string]float64) error {
	code, body, err := nsGet(n.h.HostNS, "http://127.0.0.1:9310/metrics")
	if err != nil || code != 200 {
		return fmt.Errorf("scrape: %d %v", code, err)
	}
	for series, v := range want {
		name, labels, _ := strings.Cut(strings.TrimSuffix(series, "}"), "{")
		var ls []string
		if labels != "" {
			ls = strings.Split(labels, ",")
		}
		got, ok := metricValue(body, name, ls...)
		if !ok || got != v {
			return fmt.Errorf("%s = %v (present %v), want %v", series, got, ok, v)
		}
	}
	return nil
}

// createNode makes a Node as the kubelet registers it and the node IPAM controller
// assigns its pod CIDR.
func createNode(ctx context.Context, t *testing.T, c kubernetes.Interface, name, ip string, cidr netip.Prefix) {
	t.Helper()
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.NodeSpec{PodCIDR: cidr.String(), PodCIDRs: []string{cidr.String()}},
		Status:     corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}, {Type: corev1.NodeHostName, Address: name}}},
	}
	got, err := c.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating Node %s: %v", name, err)
	}
	if len(got.Status.Addresses) == 0 {
		got.Status = node.Status
		if _, err := c.CoreV1().Nodes().UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("Node %s's status: %v", name, err)
		}
	}
}

// applyDeploy server-side-applies every object of the YAML files at path (a file or a
// directory) as the admin, in dry-run mode or for real.
func applyDeploy(t *testing.T, api *kubeapi.Server, path string, dryRun bool) {
	t.Helper()
	cfg := api.RESTConfig(t, kubeapi.Admin)
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(api.Client(t, kubeapi.Admin).Discovery()))
	files := []string{path}
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		files, _ = filepath.Glob(filepath.Join(path, "*.yaml"))
	}
	opts := metav1.ApplyOptions{FieldManager: "podwire-test", Force: true}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	n := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
		for {
			var obj unstructured.Unstructured
			if err := dec.Decode(&obj.Object); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if len(obj.Object) == 0 {
				continue
			}
			gvk := obj.GroupVersionKind()
			m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			if err != nil {
				t.Fatalf("%s: %s: %v", f, gvk, err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			_, err = dyn.Resource(m.Resource).Namespace(obj.GetNamespace()).Apply(ctx, obj.GetName(), &obj, opts)
			cancel()
			if err != nil {
				t.Fatalf("%s: applying %s %s/%s (dry run %v): %v", f, gvk.Kind, obj.GetNamespace(), obj.GetName(), dryRun, err)
			}
			n++
		}
	}
	if n == 0 {
		t.Fatalf("no objects in %s", path)
	}
}
