// SPDX-License-Identifier: Apache-2.0

package kube

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

func fullNode(name string) *corev1.Node {
	now := metav1.Now()
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "7", UID: "u", Labels: map[string]string{"zone": "a"},
			Annotations:   map[string]string{FreeAddressesAnnotation: `{"10.244.1.0/24":250}`, "other": "x"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}, DeletionTimestamp: &now},
		Spec: corev1.NodeSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24", "fd00::/64"},
			Taints: []corev1.Taint{{Key: "t", Effect: corev1.TaintEffectNoSchedule}}, ProviderID: "p"},
		Status: corev1.NodeStatus{
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: name}, {Type: corev1.NodeInternalIP, Address: "192.168.50.1"},
				{Type: corev1.NodeExternalIP, Address: "203.0.113.1"}, {Type: corev1.NodeInternalIP, Address: "fd50::1"}},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue},
				{Type: ConditionType, Status: corev1.ConditionTrue, Reason: "StatusOK"}},
			Images:   []corev1.ContainerImage{{Names: []string{"registry/big:1"}, SizeBytes: 1 << 30}},
			NodeInfo: corev1.NodeSystemInfo{KubeletVersion: "v1.37.0"},
		},
	}
}

func TestSlim(t *testing.T) {
	tr := Slim("self")
	in := fullNode("other")
	out, err := tr(in)
	if err != nil {
		t.Fatal(err)
	}
	want := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "other", ResourceVersion: "7", DeletionTimestamp: in.DeletionTimestamp},
		Spec:       corev1.NodeSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24", "fd00::/64"}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.50.1"},
			{Type: corev1.NodeInternalIP, Address: "fd50::1"}}},
	}
	if !reflect.DeepEqual(out, want) {
		t.Errorf("another Node slimmed:\n%+v\nwant\n%+v", out, want)
	}
	// The own Node also keeps the agent's condition and annotation (what NeedsPatch and
	// the annotation check read), and only those.
	own, _ := tr(fullNode("self"))
	n := own.(*corev1.Node)
	if len(n.Annotations) != 1 || n.Annotations[FreeAddressesAnnotation] == "" || len(n.Status.Conditions) != 1 ||
		n.Status.Conditions[0].Type != ConditionType || !NeedsPatch(n, Condition{Reason: "X"}) || NeedsPatch(n, Condition{Ready: true, Reason: "StatusOK"}) {
		t.Errorf("own Node slimmed: %+v", n)
	}
	// Idempotent, and a tombstone passes through.
	again, _ := tr(out)
	if !reflect.DeepEqual(again, out) {
		t.Errorf("slimming twice: %+v", again)
	}
	tomb := cache.DeletedFinalStateUnknown{Key: "x", Obj: in}
	if got, _ := tr(tomb); !reflect.DeepEqual(got, tomb) {
		t.Errorf("tombstone: %+v", got)
	}
}

func TestChanged(t *testing.T) {
	tr := Slim("self")
	slim := func(n *corev1.Node) *corev1.Node { o, _ := tr(n); return o.(*corev1.Node) }
	base := fullNode("self")
	beat := fullNode("self")
	beat.ResourceVersion = "8"
	beat.Status.Conditions[0].LastHeartbeatTime = metav1.Now()
	beat.Labels["new"] = "label"
	beat.Status.Images = nil
	if RoutingChanged(slim(base), slim(beat)) || ReportChanged(slim(base), slim(beat)) {
		t.Error("a heartbeat, a label and images are no change")
	}
	for what, f := range map[string]func(*corev1.Node){
		"pod CIDRs":   func(n *corev1.Node) { n.Spec.PodCIDRs = n.Spec.PodCIDRs[:1] },
		"InternalIP":  func(n *corev1.Node) { n.Status.Addresses[1].Address = "192.168.50.9" },
		"deletion":    func(n *corev1.Node) { n.DeletionTimestamp = nil },
		"old podCIDR": func(n *corev1.Node) { n.Spec.PodCIDR = "10.244.9.0/24" },
	} {
		n := fullNode("self")
		f(n)
		if !RoutingChanged(slim(base), slim(n)) {
			t.Errorf("%s changed: not seen", what)
		}
	}
	for what, f := range map[string]func(*corev1.Node){
		"condition":  func(n *corev1.Node) { n.Status.Conditions[1].Reason = "Tampered" },
		"annotation": func(n *corev1.Node) { delete(n.Annotations, FreeAddressesAnnotation) },
	} {
		n := fullNode("self")
		f(n)
		if RoutingChanged(slim(base), slim(n)) || !ReportChanged(slim(base), slim(n)) {
			t.Errorf("%s changed: want a report change only", what)
		}
	}
}
