// SPDX-License-Identifier: Apache-2.0

package kube

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
)

func node() *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1"},
		Spec:       corev1.NodeSpec{PodCIDR: "10.244.1.0/24"},
		Status: corev1.NodeStatus{
			Addresses:  []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: "n1"}, {Type: corev1.NodeInternalIP, Address: "192.168.5.1"}},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
		},
	}
}

func TestRouteNode(t *testing.T) {
	n := node()
	rn := RouteNode(n)
	if len(rn.PodCIDRs) != 1 || rn.PodCIDRs[0].String() != "10.244.1.0/24" || len(rn.InternalIPs) != 1 {
		t.Errorf("%+v", rn)
	}
	n.Spec.PodCIDRs = []string{"10.244.2.0/24", "fd00::/64"}
	if rn := RouteNode(n); len(rn.PodCIDRs) != 2 || rn.PodCIDRs[0].String() != "10.244.2.0/24" {
		t.Errorf("podCIDRs wins over podCIDR: %+v", rn)
	}
}

func TestPatchCondition(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset(node())
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	n, _ := c.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	if err := PatchCondition(ctx, c, n, Condition{Ready: false, Reason: "StatusFailed", Message: "bridge: not ready"}, t0); err != nil {
		t.Fatal(err)
	}
	n, _ = c.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	if err := PatchCondition(ctx, c, n, Condition{Ready: false, Reason: "StatusFailed", Message: "still"}, t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	n, _ = c.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	var got *corev1.NodeCondition
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == ConditionType {
			got = &n.Status.Conditions[i]
		}
	}
	if len(n.Status.Conditions) != 2 || got == nil {
		t.Fatalf("conditions %+v", n.Status.Conditions)
	}
	if got.Status != corev1.ConditionFalse || got.Message != "still" || !got.LastTransitionTime.Time.Equal(t0) || !got.LastHeartbeatTime.Time.Equal(t0.Add(time.Minute)) {
		t.Errorf("condition %+v", got)
	}
	if err := PatchAnnotation(ctx, c, "n1", FreeAddressesAnnotation, `{"10.244.1.0/24":253}`); err != nil {
		t.Fatal(err)
	}
	n, _ = c.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	if n.Annotations[FreeAddressesAnnotation] != `{"10.244.1.0/24":253}` {
		t.Errorf("annotations %v", n.Annotations)
	}
}

func TestNeedsPatch(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	n := node()
	ok := Condition{Ready: true, Reason: "StatusOK", Message: "m"}
	if !NeedsPatch(n, ok) {
		t.Error("no condition yet: must patch")
	}
	n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: ConditionType, Status: corev1.ConditionTrue,
		Reason: "StatusOK", Message: "m", LastHeartbeatTime: metav1.NewTime(t0)})
	if NeedsPatch(n, ok) {
		t.Error("same condition: no patch, however old its heartbeat")
	}
	if !NeedsPatch(n, Condition{Reason: "StatusFailed"}) {
		t.Error("changed condition: patch")
	}
	if !NeedsPatch(n, Condition{Ready: true, Reason: "StatusOK", Message: "other"}) {
		t.Error("changed message: patch")
	}
}

// TestRBACHint: only a refusal names the missing permission; an unreachable API server
// (an outage) must not send the operator to the ClusterRole.
func TestRBACHint(t *testing.T) {
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, "n1", errors.New("no"))
	if got := rbacHint(forbidden, "patch on nodes"); got != " (the agent's ClusterRole needs patch on nodes)" {
		t.Errorf("forbidden: %q", got)
	}
	refused := fmt.Errorf("dial tcp 10.96.0.1:443: connect: connection refused")
	if got := rbacHint(refused, "patch on nodes"); got != "" {
		t.Errorf("connection refused: %q", got)
	}
}
