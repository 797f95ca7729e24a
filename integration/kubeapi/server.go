// SPDX-License-Identifier: Apache-2.0

package kubeapi

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// User is an identity of the static token file: a token authenticates as Name in Groups.
type User struct {
	Name   string
	Groups []string
}

// Admin is in system:masters, which RBAC lets do anything.
var Admin = User{Name: "podwire-test-admin", Groups: []string{"system:masters"}}

// ServiceAccount is the identity a ServiceAccount's token carries (RBAC binds it by
// that name), so a static token can stand for a DaemonSet's pods.
func ServiceAccount(namespace, name string) User {
	return User{
		Name:   "system:serviceaccount:" + namespace + ":" + name,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
	}
}

// Server is a running etcd and kube-apiserver in one network namespace, serving HTTPS
// on Addr:Port with a CA of its own.
type Server struct {
	NetNS  ns.NetNS
	Addr   netip.Addr
	Port   int
	CA     []byte // PEM
	tokens map[string]string
	dir    string
}

// URL is the API server's address as clients use it.
func (s *Server) URL() string {
	return "https://" + net.JoinHostPort(s.Addr.String(), fmt.Sprint(s.Port))
}

// Start runs etcd (on the namespace's loopback) and kube-apiserver (on addr:6443, an
// address of netns n) with RBAC, a static token for each of users, a service-account
// key pair and a serving certificate of its own. It returns once /readyz answers ok;
// cleanup stops both and removes their data.
func Start(t testing.TB, bins Binaries, n ns.NetNS, addr netip.Addr, users ...User) *Server {
	t.Helper()
	s := &Server{NetNS: n, Addr: addr, Port: 6443, tokens: map[string]string{}, dir: t.TempDir()}
	var tokens strings.Builder
	for i, u := range append([]User{Admin}, users...) {
		tok := randomHex(t, 16)
		s.tokens[u.Name] = tok
		fmt.Fprintf(&tokens, "%s,%s,uid-%d,\"%s\"\n", tok, u.Name, i, strings.Join(u.Groups, ","))
	}
	s.write(t, "tokens.csv", []byte(tokens.String()), 0o600)
	s.write(t, "audit-policy.yaml", []byte(auditPolicy), 0o600)
	s.certs(t)

	etcd := s.start(t, "etcd", bins.Etcd,
		"--data-dir="+filepath.Join(s.dir, "etcd"),
		"--listen-client-urls=http://127.0.0.1:2379", "--advertise-client-urls=http://127.0.0.1:2379",
		"--listen-peer-urls=http://127.0.0.1:2380", "--initial-advertise-peer-urls=http://127.0.0.1:2380",
		"--initial-cluster=default=http://127.0.0.1:2380",
		"--log-level=warn", "--quota-backend-bytes=1073741824")
	api := s.start(t, "kube-apiserver", bins.APIServer,
		"--etcd-servers=http://127.0.0.1:2379",
		"--bind-address="+addr.String(), "--advertise-address="+addr.String(),
		fmt.Sprintf("--secure-port=%d", s.Port),
		"--tls-cert-file="+s.path("serving.crt"), "--tls-private-key-file="+s.path("serving.key"),
		"--cert-dir="+s.path("certs"),
		"--token-auth-file="+s.path("tokens.csv"),
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+s.path("sa.pub"),
		"--service-account-signing-key-file="+s.path("sa.key"),
		"--service-cluster-ip-range=10.96.0.0/16",
		"--audit-policy-file="+s.path("audit-policy.yaml"), "--audit-log-path="+s.path("audit.log"),
		"--audit-log-format=json", "--audit-log-mode=blocking",
		"--profiling=false", "--v=0")

	c := s.Client(t, Admin)
	deadline := time.Now().Add(3 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		body, err := c.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		cancel()
		if err == nil && strings.TrimSpace(string(body)) == "ok" {
			break
		}
		for _, p := range []*proc{etcd, api} {
			if p.exited() {
				t.Fatalf("%s exited before the API server was ready: %s\n%s", p.name, p.err, p.log())
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("kube-apiserver not ready within 3m (last: %v %s)\netcd:\n%s\nkube-apiserver:\n%s", err, body, etcd.log(), api.log())
		}
		time.Sleep(250 * time.Millisecond)
	}
	return s
}

// RESTConfig is a client configuration for u that dials from inside the server's
// namespace, so the test process (in the host's) reaches an address only that
// namespace has.
func (s *Server) RESTConfig(t testing.TB, u User) *rest.Config {
	t.Helper()
	tok, ok := s.tokens[u.Name]
	if !ok {
		t.Fatalf("no token for %s: pass it to kubeapi.Start", u.Name)
	}
	return s.restConfig(tok)
}

func (s *Server) restConfig(token string) *rest.Config {
	return &rest.Config{
		Host:            s.URL(),
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: s.CA},
		Dial: func(ctx context.Context, network, address string) (net.Conn, error) {
			var c net.Conn
			err := s.NetNS.Do(func(ns.NetNS) error {
				var err error
				c, err = (&net.Dialer{}).DialContext(ctx, network, address)
				return err
			})
			return c, err
		},
		QPS: 100, Burst: 200,
	}
}

// Client is a clientset for u (see RESTConfig).
func (s *Server) Client(t testing.TB, u User) *kubernetes.Clientset {
	t.Helper()
	c, err := kubernetes.NewForConfig(s.RESTConfig(t, u))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Kubeconfig writes a kubeconfig for u, as a node's agent is given one, and returns its
// path. Its clients must reach Addr from their own namespace.
func (s *Server) Kubeconfig(t testing.TB, u User) string {
	t.Helper()
	return s.writeKubeconfig(t, s.tokens[u.Name])
}

func (s *Server) path(name string) string { return filepath.Join(s.dir, name) }

func (s *Server) write(t testing.TB, name string, b []byte, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(s.path(name), b, mode); err != nil {
		t.Fatal(err)
	}
}

// certs makes a CA, a serving certificate for Addr signed by it, and the service-account
// signing key pair.
func (s *Server) certs(t testing.TB) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "podwire-test-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kube-apiserver"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IP(s.Addr.AsSlice()), net.IPv4(127, 0, 0, 1)},
		DNSNames:    []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	s.CA = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	s.write(t, "serving.crt", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
	s.write(t, "serving.key", pemKey(t, key), 0o600)
	sa, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	s.write(t, "sa.key", pemKey(t, sa), 0o600)
	s.write(t, "sa.pub", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644)
}

func pemKey(t testing.TB, key any) []byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

func randomHex(t testing.TB, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", b)
}

// proc is a control-plane process, its output in a file.
type proc struct {
	name, logFile string
	cmd           *exec.Cmd
	done          chan struct{}
	err           error
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proc) log() string {
	b, _ := os.ReadFile(p.logFile)
	return tail(string(bytes.ToValidUTF8(b, nil)), 30)
}

// start runs bin in the server's namespace (nsenter execs it, so the PID is bin's);
// cleanup sends SIGTERM and, after 15 s, SIGKILL.
func (s *Server) start(t testing.TB, name, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, logFile: s.path(name + ".log"), done: make(chan struct{})}
	f, err := os.Create(p.logFile)
	if err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command("nsenter", append([]string{"--net=" + s.NetNS.Path(), bin}, args...)...)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	if err := p.cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("starting %s: %v", name, err)
	}
	go func() { p.err = p.cmd.Wait(); f.Close(); close(p.done) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("%s's last output:\n%s", name, p.log())
		}
	})
	return p
}
