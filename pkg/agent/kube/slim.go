// SPDX-License-Identifier: Apache-2.0

package kube

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// Slim is the Node informer's transform: of every Node it keeps the name, the pod CIDRs,
// the InternalIPs and the deletion timestamp (plus the resourceVersion the informer keys
// its bookkeeping on); of the agent's own Node (self) also the agent's condition and its
// free-addresses annotation, which the status reconciler compares before it patches (so
// it needs no GET). Everything else (images, the kubelet's conditions, labels,
// managedFields: most of a Node's bytes) is dropped before it reaches the cache, so the
// cache of a 5,000-Node cluster is a few hundred bytes a Node.
//
// Slim is idempotent and passes through what is not a *corev1.Node (a tombstone).
func Slim(self string) cache.TransformFunc {
	return func(o any) (any, error) {
		n, ok := o.(*corev1.Node)
		if !ok {
			return o, nil
		}
		s := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: n.Name, ResourceVersion: n.ResourceVersion, DeletionTimestamp: n.DeletionTimestamp},
			Spec:       corev1.NodeSpec{PodCIDR: n.Spec.PodCIDR, PodCIDRs: n.Spec.PodCIDRs},
		}
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				s.Status.Addresses = append(s.Status.Addresses, a)
			}
		}
		if n.Name == self {
			if v, ok := n.Annotations[FreeAddressesAnnotation]; ok {
				s.Annotations = map[string]string{FreeAddressesAnnotation: v}
			}
			for _, c := range n.Status.Conditions {
				if c.Type == ConditionType {
					s.Status.Conditions = []corev1.NodeCondition{c}
				}
			}
		}
		return s, nil
	}
}

// RoutingChanged reports whether an update changed what routing, the conflist or the
// masquerade use: pod CIDRs, InternalIPs or deletion state. Other updates (a heartbeat,
// a label) are dropped by the agent's event handler.
func RoutingChanged(old, cur *corev1.Node) bool {
	return old.Name != cur.Name || old.Spec.PodCIDR != cur.Spec.PodCIDR || !slices.Equal(old.Spec.PodCIDRs, cur.Spec.PodCIDRs) ||
		!slices.Equal(internalIPs(old), internalIPs(cur)) ||
		(old.DeletionTimestamp == nil) != (cur.DeletionTimestamp == nil)
}

// ReportChanged reports whether an update changed what the agent writes on its own
// Node (its condition, its annotation): someone else may have changed or removed them.
func ReportChanged(old, cur *corev1.Node) bool {
	return old.Annotations[FreeAddressesAnnotation] != cur.Annotations[FreeAddressesAnnotation] ||
		!slices.EqualFunc(ownConditions(old), ownConditions(cur), func(a, b corev1.NodeCondition) bool {
			return a.Status == b.Status && a.Reason == b.Reason && a.Message == b.Message
		})
}

func internalIPs(n *corev1.Node) []string {
	var out []string
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			out = append(out, a.Address)
		}
	}
	return out
}

func ownConditions(n *corev1.Node) []corev1.NodeCondition {
	var out []corev1.NodeCondition
	for _, c := range n.Status.Conditions {
		if c.Type == ConditionType {
			out = append(out, c)
		}
	}
	return out
}
