// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestNodeDeletion deletes the last Node: podwire-agent on the first removes its route
// to that node's pod CIDR. The Node is then created again with the same pod CIDR (as an
// operator restores a node whose pods still run: kube-controller-manager would give a
// re-registering kubelet a new CIDR, and the bridge still holds the old gateway, so
// every new sandbox there fails until the node is drained) and its kubelet and
// kube-proxy (which exits when its Node is deleted) restarted; the route comes back.
func TestNodeDeletion(t *testing.T) {
	p := needLab(t)
	if len(p.Nodes) < 2 {
		t.Skip("one node: no route to another")
	}
	c, err := p.Client()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	first, last := p.Nodes[0], p.Nodes[len(p.Nodes)-1]
	node, err := c.CoreV1().Nodes().Get(ctx, last.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cidr := node.Spec.PodCIDR
	restore := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node.Name, Labels: node.Labels},
		Spec: corev1.NodeSpec{PodCIDR: node.Spec.PodCIDR, PodCIDRs: node.Spec.PodCIDRs}}
	route := func() (string, error) {
		out, err := run(inNode(first, "ip", "-4", "route", "show", cidr)...)
		return strings.TrimSpace(out), err
	}
	eventually(t, 30*time.Second, func() error {
		r, err := route()
		if err == nil && !strings.Contains(r, "via "+last.IP.String()) {
			err = fmt.Errorf("node %s has no route to %s via %s: %q", first.Name, cidr, last.IP, r)
		}
		return err
	})
	if err := c.CoreV1().Nodes().Delete(ctx, last.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// Whatever happens below, the node comes back for the tests after this one.
	t.Cleanup(func() {
		if _, err := c.CoreV1().Nodes().Create(ctx, restore, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Error(err)
		}
		// kube-proxy exits when its Node is deleted ("Node is being deleted"), for its
		// supervisor to start it again; the lab is that supervisor.
		for _, d := range []string{"-kubelet", "-kube-proxy"} {
			if err := Restart(p.Dir, last.Name+d); err != nil {
				t.Error(err)
				return
			}
		}
		if err := p.waitNodes(ctx, testLog{t}, 2*time.Minute, func(ready bool) bool { return ready }); err != nil {
			t.Error(err)
		}
		if _, err := p.Kubectl(nil, "-n", "kube-system", "rollout", "status", "deployment/coredns", "--timeout=2m"); err != nil {
			t.Error(err)
		}
	})
	eventually(t, 30*time.Second, func() error {
		if r, err := route(); err != nil || r != "" {
			return fmt.Errorf("node %s still routes %s after Node %s was deleted: %q %v", first.Name, cidr, last.Name, r, err)
		}
		return nil
	})
	if _, err := c.CoreV1().Nodes().Create(ctx, restore, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		if r, err := route(); err != nil || !strings.Contains(r, "via "+last.IP.String()) {
			return fmt.Errorf("node %s has no route to %s again after Node %s was restored: %q %v", first.Name, cidr, last.Name, r, err)
		}
		return nil
	})
}

// testLog writes waitNodes' progress to the test log.
type testLog struct{ t *testing.T }

func (l testLog) Write(b []byte) (int, error) {
	l.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}
