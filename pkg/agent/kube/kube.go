// SPDX-License-Identifier: Apache-2.0

// Package kube is the agent's Kubernetes side: reading Nodes, and writing its own Node's
// PodwireNetworkReady condition and podwire.io/free-addresses annotation.
package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/podwire/podwire/pkg/agent/routes"
)

const (
	// ConditionType is the Node condition the agent owns.
	ConditionType corev1.NodeConditionType = "PodwireNetworkReady"
	// FreeAddressesAnnotation holds {"<range>": free addresses}.
	FreeAddressesAnnotation = "podwire.io/free-addresses"
)

// Config returns the client config: the kubeconfig file, or in-cluster when empty.
func Config(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		c, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster config (run in a pod with a service account, or pass --kubeconfig): %w", err)
		}
		return c, nil
	}
	c, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	return c, nil
}

// PodCIDRs returns spec.podCIDRs, or spec.podCIDR when podCIDRs is empty; unparsable
// entries are returned as errors.
func PodCIDRs(n *corev1.Node) ([]netip.Prefix, error) {
	raw := n.Spec.PodCIDRs
	if len(raw) == 0 && n.Spec.PodCIDR != "" {
		raw = []string{n.Spec.PodCIDR}
	}
	var out []netip.Prefix
	for _, s := range raw {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("node %s: pod CIDR %q: %w", n.Name, s, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// RouteNode is what routing needs of n: its InternalIPs and pod CIDRs (bad ones dropped).
func RouteNode(n *corev1.Node) routes.Node {
	rn := routes.Node{Name: n.Name}
	rn.PodCIDRs, _ = PodCIDRs(n)
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil {
			rn.InternalIPs = append(rn.InternalIPs, ip.Unmap())
		}
	}
	return rn
}

// Condition is the agent's verdict for the Node condition.
type Condition struct {
	Ready   bool
	Reason  string // CamelCase
	Message string
}

// PatchCondition sets the PodwireNetworkReady condition through the status
// subresource (a strategic merge patch keyed by type, so the kubelet's conditions stay).
// lastTransitionTime moves only when the status changes.
func PatchCondition(ctx context.Context, c kubernetes.Interface, current *corev1.Node, cond Condition, now time.Time) error {
	status := corev1.ConditionFalse
	if cond.Ready {
		status = corev1.ConditionTrue
	}
	transition := metav1.NewTime(now)
	if current != nil {
		for _, old := range current.Status.Conditions {
			if old.Type == ConditionType && old.Status == status {
				transition = old.LastTransitionTime
			}
		}
	}
	patch := map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{{
		Type: ConditionType, Status: status, Reason: cond.Reason, Message: cond.Message,
		LastHeartbeatTime: metav1.NewTime(now), LastTransitionTime: transition,
	}}}}
	b, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	name := current.Name
	if _, err := c.CoreV1().Nodes().Patch(ctx, name, types.StrategicMergePatchType, b, metav1.PatchOptions{}, "status"); err != nil {
		return fmt.Errorf("patching node %s's %s condition%s: %w", name, ConditionType, rbacHint(err, "patch on nodes/status"), err)
	}
	return nil
}

// NeedsPatch reports whether the Node's condition differs from cond. The agent patches
// only on change, never on a timer: every patch is a Node update every agent's informer
// receives, and nothing reads the condition's lastHeartbeatTime (the node lifecycle
// controller watches the kubelet's Lease and Ready condition, not other conditions).
func NeedsPatch(n *corev1.Node, cond Condition) bool {
	status := corev1.ConditionFalse
	if cond.Ready {
		status = corev1.ConditionTrue
	}
	for _, c := range n.Status.Conditions {
		if c.Type == ConditionType {
			return c.Status != status || c.Reason != cond.Reason || c.Message != cond.Message
		}
	}
	return true
}

// PatchAnnotation sets (value != "") or removes (value == "") an annotation of node.
func PatchAnnotation(ctx context.Context, c kubernetes.Interface, node, key, value string) error {
	var v any
	if value != "" {
		v = value
	}
	b, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{key: v}}})
	if err != nil {
		return err
	}
	if _, err := c.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, b, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("patching node %s's annotation %s%s: %w", node, key, rbacHint(err, "patch on nodes"), err)
	}
	return nil
}

// rbacHint names the permission a refused request needs; other failures (the API server
// unreachable, a conflict) get none, which would send the operator the wrong way.
func rbacHint(err error, perm string) string {
	if apierrors.IsForbidden(err) {
		return " (the agent's ClusterRole needs " + perm + ")"
	}
	return ""
}
