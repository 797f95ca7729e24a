// SPDX-License-Identifier: Apache-2.0

package cluster

import (
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
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// identity is one client or server certificate the lab issues.
type identity struct {
	file   string // pki/<file>.crt and .key
	cn     string
	orgs   []string
	server bool
	ips    []net.IP
	dns    []string
}

// identities are the lab's certificates: the API server's serving certificate, its
// client certificate towards the kubelets, and one client certificate per component
// (the Node authorizer and NodeRestriction know a kubelet by system:node:<name> in
// system:nodes).
func (p Plan) identities() []identity {
	ids := []identity{
		{file: "apiserver", cn: "kube-apiserver", server: true,
			ips: []net.IP{p.HostIP.AsSlice(), p.ServiceAPI.AsSlice(), net.IPv4(127, 0, 0, 1)},
			dns: []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost"}},
		{file: "apiserver-kubelet-client", cn: "kube-apiserver-kubelet-client", orgs: []string{"system:masters"}},
		{file: "admin", cn: "podwire-lab-admin", orgs: []string{"system:masters"}},
		{file: "kube-controller-manager", cn: "system:kube-controller-manager"},
		{file: "kube-scheduler", cn: "system:kube-scheduler"},
		{file: "kube-proxy", cn: "system:kube-proxy"},
	}
	for _, n := range p.Nodes {
		ids = append(ids, identity{file: "kubelet-" + n.Name, cn: "system:node:" + n.Name, orgs: []string{"system:nodes"}})
	}
	return ids
}

// writePKI issues the CA, every identity, the service-account key pair and a
// kubeconfig per client identity into p.PKI.
func writePKI(p Plan) error {
	if err := os.MkdirAll(p.PKI, 0o700); err != nil {
		return err
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "podwire-lab-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(365 * 24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	if err := os.WriteFile(filepath.Join(p.PKI, "ca.crt"), caPEM, 0o644); err != nil {
		return err
	}
	keyPEM, err := pemKey(caKey)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(p.PKI, "ca.key"), keyPEM, 0o600); err != nil {
		return err
	}
	for i, id := range p.identities() {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(int64(i + 2)), Subject: pkix.Name{CommonName: id.cn, Organization: id.orgs},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(365 * 24 * time.Hour),
			KeyUsage:    x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
			IPAddresses: id.ips, DNSNames: id.dns,
		}
		if id.server {
			tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return fmt.Errorf("issuing %s: %w", id.cn, err)
		}
		certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
		keyPEM, err := pemKey(key)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(p.PKI, id.file+".crt"), certPEM, 0o644); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(p.PKI, id.file+".key"), keyPEM, 0o600); err != nil {
			return err
		}
		if id.server || id.file == "apiserver-kubelet-client" {
			continue
		}
		if err := writeKubeconfig(filepath.Join(p.PKI, id.file+".kubeconfig"), p.APIServer, caPEM, certPEM, keyPEM); err != nil {
			return err
		}
	}
	sa, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	if err != nil {
		return err
	}
	saKey, err := pemKey(sa)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(p.PKI, "sa.key"), saKey, 0o600); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(p.PKI, "sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644)
}

func writeKubeconfig(file, server string, ca, cert, key []byte) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["podwire-lab"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	cfg.AuthInfos["user"] = &clientcmdapi.AuthInfo{ClientCertificateData: cert, ClientKeyData: key}
	cfg.Contexts["podwire-lab"] = &clientcmdapi.Context{Cluster: "podwire-lab", AuthInfo: "user"}
	cfg.CurrentContext = "podwire-lab"
	return clientcmd.WriteToFile(*cfg, file)
}

func pemKey(key any) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}
