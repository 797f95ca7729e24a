// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/podwire/podwire/integration/kubeapi"
	"github.com/podwire/podwire/integration/nstest"
	"github.com/podwire/podwire/pkg/agent/kube"
)

// TestAgentLeastPrivilege applies deploy/ for real on a real kube-apiserver (RBAC and
// the ValidatingAdmissionPolicy of deploy/01-node-policy.yaml) and acts as two agents,
// each with a token bound to a pod on its node, as the kubelet gives the DaemonSet's
// pods. An agent writes its own Node's PodwireNetworkReady condition and podwire.io/
// annotation with the agent's own code; any other Node, and on its own Node a label, a
// taint, a cordon, a pod CIDR, another annotation or another condition, is refused, and
// so is a token of the ServiceAccount that names no node.
func TestAgentLeastPrivilege(t *testing.T) {
	nstest.RequireRoot(t)
	h := nstest.New(t)
	repo, err := nstest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bins := kubeBinaries(t, repo)
	seg := newLAN(t, h)
	cp := newNetNS(t)
	seg.attach(cp, "192.168.52.2/24")
	unbound := kubeapi.ServiceAccount("podwire-system", "podwire-agent")
	api := kubeapi.Start(t, bins, cp, netip.MustParseAddr("192.168.52.2"), unbound)
	applyDeploy(t, api, filepath.Join(repo, "deploy", "00-rbac.yaml"), false)
	applyDeploy(t, api, filepath.Join(repo, "deploy", "01-node-policy.yaml"), false)
	applyDeploy(t, api, filepath.Join(repo, "deploy"), true)
	admin := api.Client(t, kubeapi.Admin)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for i, n := range []string{"lp-a", "lp-b"} {
		createNode(ctx, t, admin, n, fmt.Sprintf("192.168.52.%d", 10+i), netip.MustParsePrefix(fmt.Sprintf("10.246.%d.0/24", i)))
	}
	agentA := clientFor(t, api, api.PodToken(t, "podwire-system", "podwire-agent", "lp-a"))

	// The policy is enforced once the API server has loaded it: wait until a refused
	// write is refused (in a dry run, which admission sees too, so nothing changes
	// before), then check every case once.
	eventually(t, 30*time.Second, "the policy in force", func() error {
		_, err := agentA.CoreV1().Nodes().Patch(ctx, "lp-b", types.StrategicMergePatchType,
			[]byte(`{"metadata":{"annotations":{"podwire.io/free-addresses":"1"}}}`), metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
			return fmt.Errorf("lp-a's agent patching lp-b: %v, want refused", err)
		}
		return nil
	})

	// What the agent writes, through its own code, on its own Node.
	self, err := agentA.CoreV1().Nodes().Get(ctx, "lp-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := kube.PatchCondition(ctx, agentA, self, kube.Condition{Ready: true, Reason: "Installed", Message: "ok"}, time.Now()); err != nil {
		t.Errorf("the agent's own condition on its own Node: %v", err)
	}
	if err := kube.PatchAnnotation(ctx, agentA, "lp-a", kube.FreeAddressesAnnotation, "253"); err != nil {
		t.Errorf("the agent's own annotation on its own Node: %v", err)
	}
	if err := kube.PatchAnnotation(ctx, agentA, "lp-a", kube.FreeAddressesAnnotation, ""); err != nil {
		t.Errorf("removing the agent's own annotation on its own Node: %v", err)
	}
	otherB, err := agentA.CoreV1().Nodes().Get(ctx, "lp-b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := kube.PatchCondition(ctx, agentA, otherB, kube.Condition{Ready: false, Reason: "X", Message: "x"}, time.Now()); !refused(err) {
		t.Errorf("lp-a's agent setting lp-b's condition: %v, want refused", err)
	}

	for _, c := range []struct{ name, node, sub, patch string }{
		{"another Node's annotation", "lp-b", "", `{"metadata":{"annotations":{"podwire.io/free-addresses":"1"}}}`},
		{"another Node's label", "lp-b", "", `{"metadata":{"labels":{"evil":"1"}}}`},
		{"another Node's taint", "lp-b", "", `{"spec":{"taints":[{"key":"evil","effect":"NoSchedule"}]}}`},
		{"cordoning another Node", "lp-b", "", `{"spec":{"unschedulable":true}}`},
		{"a label on its own Node", "lp-a", "", `{"metadata":{"labels":{"evil":"1"}}}`},
		{"a taint on its own Node", "lp-a", "", `{"spec":{"taints":[{"key":"evil","effect":"NoSchedule"}]}}`},
		{"cordoning its own Node", "lp-a", "", `{"spec":{"unschedulable":true}}`},
		{"a finalizer on its own Node", "lp-a", "", `{"metadata":{"finalizers":["podwire.io/evil"]}}`},
		{"another annotation on its own Node", "lp-a", "", `{"metadata":{"annotations":{"example.com/evil":"1"}}}`},
		{"another condition on its own Node", "lp-a", "status", `{"status":{"conditions":[{"type":"Ready","status":"False","reason":"Evil"}]}}`},
		{"its own Node's capacity", "lp-a", "status", `{"status":{"capacity":{"pods":"1000"}}}`},
		{"its own Node's addresses", "lp-a", "status", `{"status":{"addresses":[{"type":"InternalIP","address":"192.0.2.1"}]}}`},
	} {
		if err := patchNode(ctx, agentA, c.node, c.sub, c.patch); !refused(err) {
			t.Errorf("%s: %v, want refused", c.name, err)
		}
	}

	// A token of the ServiceAccount bound to no pod names no node: RBAC lets it patch,
	// the policy does not.
	plain := api.Client(t, unbound)
	if err := kube.PatchAnnotation(ctx, plain, "lp-a", kube.FreeAddressesAnnotation, "1"); !refused(err) {
		t.Errorf("an unbound token of the agent's ServiceAccount: %v, want refused", err)
	} else if !strings.Contains(err.Error(), "names no node") {
		t.Errorf("an unbound token's refusal does not say why: %v", err)
	}
	// Everyone else is outside the policy.
	if err := patchNode(ctx, admin, "lp-b", "", `{"metadata":{"labels":{"admin":"1"}}}`); err != nil {
		t.Errorf("the admin labelling a Node: %v", err)
	}

	// Nothing refused got through.
	for _, n := range []string{"lp-a", "lp-b"} {
		node, err := admin.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		evilTaint := false
		for _, tn := range node.Spec.Taints {
			evilTaint = evilTaint || tn.Key == "evil"
		}
		if node.Labels["evil"] != "" || evilTaint || node.Spec.Unschedulable || len(node.Finalizers) > 0 ||
			node.Annotations["example.com/evil"] != "" || (n == "lp-b" && node.Annotations[kube.FreeAddressesAnnotation] != "") {
			t.Errorf("Node %s was changed by a refused patch: %+v %+v", n, node.ObjectMeta, node.Spec)
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady || (n == "lp-b" && c.Type == kube.ConditionType) {
				t.Errorf("Node %s has a condition from a refused patch: %+v", n, c)
			}
		}
	}
}

// refused reports whether err is the API server's refusal of a write (RBAC's Forbidden
// or the admission policy's).
func refused(err error) bool { return apierrors.IsForbidden(err) || apierrors.IsInvalid(err) }

func clientFor(t *testing.T, api *kubeapi.Server, token string) *kubernetes.Clientset {
	t.Helper()
	c, err := kubernetes.NewForConfig(api.TokenConfig(token))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func patchNode(ctx context.Context, c kubernetes.Interface, node, sub, patch string) error {
	var subs []string
	if sub != "" {
		subs = []string{sub}
	}
	_, err := c.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, subs...)
	return err
}
