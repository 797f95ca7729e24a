// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/podwire/podwire/pkg/agent/cri"
	"github.com/podwire/podwire/pkg/agent/kube"
	"github.com/podwire/podwire/pkg/agent/metrics"
	"github.com/podwire/podwire/pkg/agent/routes"
	"github.com/podwire/podwire/pkg/netfilter"
	nffake "github.com/podwire/podwire/pkg/netfilter/fake"
)

type fakeRuntime struct{ name, version string }

func (r fakeRuntime) Version(context.Context) (string, string, error) { return r.name, r.version, nil }
func (r fakeRuntime) Sandboxes(context.Context) ([]cri.Sandbox, error) {
	return []cri.Sandbox{{ID: "live"}}, nil
}

// Networks is what containerd reports: its loopback network and the agent's conflist.
func (r fakeRuntime) Networks(context.Context) ([]cri.Network, error) {
	return []cri.Network{
		{Name: "cni-loopback", IfName: "lo", Conflist: []byte(`{"cniVersion":"0.3.1","name":"cni-loopback","plugins":[{"type":"loopback"}]}`)},
		{Name: "podwire", IfName: "eth0", Conflist: []byte(`{"cniVersion":"1.0.0","name":"podwire","plugins":[{"type":"bridge"}]}`)},
	}, nil
}

type fakeCNI struct {
	mu       sync.Mutex
	gcValid  map[string][]types.GCAttachment // by network
	gcVer    map[string]string
	statusOK bool
}

func (f *fakeCNI) GCNetworkList(_ context.Context, l *libcni.NetworkConfigList, a *libcni.GCArgs) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.gcValid == nil {
		f.gcValid, f.gcVer = map[string][]types.GCAttachment{}, map[string]string{}
	}
	f.gcValid[l.Name], f.gcVer[l.Name] = a.ValidAttachments, l.CNIVersion
	return nil
}

func (f *fakeCNI) GetStatusNetworkList(context.Context, *libcni.NetworkConfigList) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.statusOK {
		return nil
	}
	return &types.Error{Code: 50, Msg: "bridge: not ready"}
}

func (f *fakeCNI) GetCachedAttachments(string) ([]*libcni.NetworkAttachment, error) {
	return []*libcni.NetworkAttachment{{ContainerID: "live", IfName: "eth0", Network: "podwire"}}, nil
}

func mkNode(name, ip string, cidrs ...string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:   corev1.NodeSpec{PodCIDRs: cidrs},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}}}
}

func eventually(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second) // generous: the machine is shared
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestAgentOnFakes(t *testing.T) {
	root := t.TempDir()
	src := filepath.Join(root, "src")
	os.MkdirAll(src, 0o755)
	for _, p := range []string{"bridge", "host-local", "portmap", "bandwidth", "podwire-agent"} {
		os.WriteFile(filepath.Join(src, p), []byte(p), 0o755)
	}
	dataDir := filepath.Join(root, "ipam")
	os.MkdirAll(filepath.Join(dataDir, "podwire"), 0o755)
	os.WriteFile(filepath.Join(dataDir, "podwire", "10.244.0.2"), []byte("live\neth0"), 0o600)

	kc := fake.NewClientset(
		mkNode("a", "192.168.50.1", "10.244.0.0/24", "fd00:244::/64"),
		mkNode("b", "192.168.50.2", "10.244.1.0/24"),
		mkNode("c", "192.168.50.3", "10.244.2.0/24"))
	rt := &routes.Fake{Conn: []routes.Connected{{Prefix: netip.MustParsePrefix("192.168.50.0/24"), LinkIndex: 2}}}
	kernel := nffake.New()
	cni := &fakeCNI{statusOK: true}
	cfg := Config{NodeName: "a", SourceBinDir: src, CNIBinDir: filepath.Join(root, "bin"), CNIConfDir: filepath.Join(root, "net.d"),
		ConflistName: "10-podwire.conflist", NetworkName: "podwire", CNIVersion: "auto", Bridge: "cni0",
		IPAMDataDir: dataDir, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
		GCPeriod: time.Hour, StatusPeriod: time.Hour, StateDir: filepath.Join(root, "state"), Routes: true, Masquerade: true}
	d := Deps{Kube: kc, Runtime: fakeRuntime{"containerd", "1.6.20~ds1"}, Routes: rt, Masq: netfilter.NewNFTablesOn(kernel),
		CNI: cni, Metrics: metrics.New()}
	a, err := New(cfg, d)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- a.Run(ctx) }()
	defer func() { cancel(); <-done }()

	eventually(t, "the conflist", func() bool { _, err := os.Stat(a.ConflistPath()); return err == nil })
	b, _ := os.ReadFile(a.ConflistPath())
	if !strings.Contains(string(b), `"cniVersion": "1.0.0"`) || !strings.Contains(string(b), "fd00:244::/64") {
		t.Errorf("conflist for containerd 1.6, dual-stack:\n%s", b)
	}
	if _, err := os.Stat(filepath.Join(cfg.CNIBinDir, "bridge")); err != nil {
		t.Error("bridge not installed")
	}
	if _, err := os.Stat(filepath.Join(cfg.CNIBinDir, "podwire-agent")); err == nil {
		t.Error("the agent installed itself as a plugin")
	}
	eventually(t, "routes to b and c", func() bool {
		return rt.Dump() == "10.244.1.0/24 via 192.168.50.2 dev #2 proto 165\n10.244.2.0/24 via 192.168.50.3 dev #2 proto 165"
	})
	if dump := kernel.Dump(); !strings.Contains(dump, "podwire_agent") || !strings.Contains(dump, "masquerade") {
		t.Errorf("masquerade rules:\n%s", dump)
	}
	eventually(t, "the condition and annotation", func() bool {
		n, _ := kc.CoreV1().Nodes().Get(ctx, "a", metav1.GetOptions{})
		ok := false
		for _, c := range n.Status.Conditions {
			ok = ok || (c.Type == kube.ConditionType && c.Status == corev1.ConditionTrue)
		}
		return ok && n.Annotations[kube.FreeAddressesAnnotation] == `{"10.244.0.0/24":252,"fd00:244::/64":4611686018427387904}`
	})
	// GC of the agent's network at 1.1.0, then of the runtime's loopback network at its
	// own version, with the same live sandbox; the runtime's copy of the agent's
	// conflist is not GC'd twice.
	eventually(t, "GC", func() bool {
		cni.mu.Lock()
		defer cni.mu.Unlock()
		own, lo := cni.gcValid["podwire"], cni.gcValid["cni-loopback"]
		return len(own) == 1 && own[0].ContainerID == "live" && cni.gcVer["podwire"] == "1.1.0" &&
			len(lo) == 1 && lo[0].ContainerID == "live" && cni.gcVer["cni-loopback"] == "0.3.1" && len(cni.gcValid) == 2
	})
	if !a.Ready() || !a.Healthy() {
		t.Error("not ready/healthy")
	}

	// Node c goes: its route goes.
	if err := kc.CoreV1().Nodes().Delete(ctx, "c", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "c's route to go", func() bool { return rt.Dump() == "10.244.1.0/24 via 192.168.50.2 dev #2 proto 165" })

	cancel()
	<-done
	done = make(chan error, 1)
	done <- nil
	if err := Uninstall(context.Background(), cfg, d); err != nil {
		t.Fatal(err)
	}
	if rt.Dump() != "" || strings.Contains(kernel.Dump(), "podwire_agent") {
		t.Errorf("after uninstall: routes %q, nft:\n%s", rt.Dump(), kernel.Dump())
	}
	if ents, _ := os.ReadDir(cfg.CNIBinDir); len(ents) != 0 {
		t.Errorf("bin dir after uninstall: %v", ents)
	}
	if _, err := os.Stat(a.ConflistPath()); err == nil {
		t.Error("conflist left after uninstall")
	}
}
