// SPDX-License-Identifier: Apache-2.0

package kubeapi

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// PodToken is a token of ServiceAccount namespace/sa bound to a Pod on node, as the
// kubelet gives a DaemonSet's pod: the API server puts the pod's and its node's names
// in the token (user extra "authentication.kubernetes.io/node-name"), which admission
// policies can check. The Pod object is created for it (nothing runs it: no kubelet
// serves node); the ServiceAccount must exist.
func (s *Server) PodToken(t testing.TB, namespace, sa, node string) string {
	t.Helper()
	c := s.Client(t, Admin)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := sa + "-" + node
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: corev1.PodSpec{
			NodeName:           node,
			ServiceAccountName: sa,
			Containers:         []corev1.Container{{Name: "agent", Image: "podwire.invalid/token-holder"}},
		},
	}
	p, err := c.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		p, err = c.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	}
	if err != nil {
		t.Fatalf("creating pod %s/%s to bind %s's token to: %v", namespace, name, sa, err)
	}
	exp := int64(3600)
	tr, err := c.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: &exp,
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("requesting a token of %s/%s bound to pod %s: %v", namespace, sa, p.Name, err)
	}
	return tr.Status.Token
}

// TokenConfig is a client configuration authenticating with token (see RESTConfig).
func (s *Server) TokenConfig(token string) *rest.Config { return s.restConfig(token) }

// PodKubeconfig writes a kubeconfig holding PodToken(namespace, sa, node), as a
// DaemonSet's pod on node authenticates, and returns its path.
func (s *Server) PodKubeconfig(t testing.TB, namespace, sa, node string) string {
	t.Helper()
	return s.writeKubeconfig(t, s.PodToken(t, namespace, sa, node))
}

func (s *Server) writeKubeconfig(t testing.TB, token string) string {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{Server: s.URL(), CertificateAuthorityData: s.CA}
	cfg.AuthInfos["user"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "user"}
	cfg.CurrentContext = "test"
	b, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(f, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}
