// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"time"

	"github.com/vishvananda/netlink"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// etcdURL is on loopback only: nothing on the segment (nodes, pods) may reach etcd.
func (p Plan) etcdURL(port int) string { return fmt.Sprintf("http://127.0.0.1:%d", port) }

func (p Plan) bin(name string) string { return filepath.Join(p.BinDir, name) }
func (p Plan) pki(name string) string { return filepath.Join(p.PKI, name) }

// controlPlane starts etcd, kube-apiserver, kube-controller-manager and kube-scheduler in
// the machine's netns, listening on the segment's host address (etcd on loopback), and
// waits until the API server serves.
func (s *State) controlPlane(ctx context.Context) error {
	p := s.Plan
	etcdURL, peerURL := p.etcdURL(p.EtcdPort), p.etcdURL(p.EtcdPort+1)
	if err := s.cgroup("/" + p.Prefix + "-cp"); err != nil {
		return err
	}
	daemons := []struct {
		name string
		argv []string
	}{
		{"etcd", []string{p.bin("etcd"), "--name=podwire-lab", "--data-dir=" + filepath.Join(p.Dir, "etcd"),
			"--listen-client-urls=" + etcdURL, "--advertise-client-urls=" + etcdURL,
			"--listen-peer-urls=" + peerURL, "--initial-advertise-peer-urls=" + peerURL,
			"--initial-cluster=podwire-lab=" + peerURL,
			"--log-level=warn", "--quota-backend-bytes=2147483648", "--unsafe-no-fsync"}},
		{"kube-apiserver", []string{p.bin("kube-apiserver"), "--etcd-servers=" + etcdURL,
			"--bind-address=" + p.HostIP.String(), "--advertise-address=" + p.HostIP.String(), "--secure-port=6443",
			"--tls-cert-file=" + p.pki("apiserver.crt"), "--tls-private-key-file=" + p.pki("apiserver.key"),
			"--client-ca-file=" + p.pki("ca.crt"),
			"--kubelet-client-certificate=" + p.pki("apiserver-kubelet-client.crt"),
			"--kubelet-client-key=" + p.pki("apiserver-kubelet-client.key"),
			// The kubelets' names resolve nowhere: dial their InternalIP.
			"--kubelet-preferred-address-types=InternalIP,Hostname",
			"--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
			"--service-account-issuer=https://kubernetes.default.svc",
			"--service-account-key-file=" + p.pki("sa.pub"), "--service-account-signing-key-file=" + p.pki("sa.key"),
			"--service-cluster-ip-range=" + p.ServiceCIDR.String(),
			"--service-node-port-range=30000-32767",
			"--allow-privileged=true", "--profiling=false", "--v=1"}},
		{"kube-controller-manager", []string{p.bin("kube-controller-manager"),
			"--kubeconfig=" + p.pki("kube-controller-manager.kubeconfig"),
			"--authentication-kubeconfig=" + p.pki("kube-controller-manager.kubeconfig"),
			"--authorization-kubeconfig=" + p.pki("kube-controller-manager.kubeconfig"),
			"--bind-address=" + p.HostIP.String(),
			"--allocate-node-cidrs=true", "--cluster-cidr=" + p.ClusterCIDR.String(), "--node-cidr-mask-size=24",
			"--service-cluster-ip-range=" + p.ServiceCIDR.String(),
			"--cluster-signing-cert-file=" + p.pki("ca.crt"), "--cluster-signing-key-file=" + p.pki("ca.key"),
			"--root-ca-file=" + p.pki("ca.crt"), "--service-account-private-key-file=" + p.pki("sa.key"),
			"--use-service-account-credentials=true", "--controllers=*,bootstrapsigner,tokencleaner",
			// No cloud: routes are podwire-agent's, not the route controller's.
			"--configure-cloud-routes=false", "--leader-elect=false", "--profiling=false", "--v=1"}},
		{"kube-scheduler", []string{p.bin("kube-scheduler"),
			"--kubeconfig=" + p.pki("kube-scheduler.kubeconfig"),
			"--authentication-kubeconfig=" + p.pki("kube-scheduler.kubeconfig"),
			"--authorization-kubeconfig=" + p.pki("kube-scheduler.kubeconfig"),
			"--bind-address=" + p.HostIP.String(), "--leader-elect=false", "--profiling=false", "--v=1"}},
	}
	for i, d := range daemons {
		proc, err := s.startDaemon(d.name, "/"+p.Prefix+"-cp", d.argv, nil)
		if err != nil {
			return err
		}
		if i == 1 {
			if err := waitAPI(ctx, p, proc); err != nil {
				return err
			}
		}
	}
	return nil
}

// Client is an admin clientset for the lab.
func (p Plan) Client() (*kubernetes.Clientset, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", p.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("the lab's kubeconfig %s (is the lab up? make cluster): %w", p.Kubeconfig, err)
	}
	cfg.QPS, cfg.Burst = 50, 100
	return kubernetes.NewForConfig(cfg)
}

func waitAPI(ctx context.Context, p Plan, api Proc) error {
	c, err := p.Client()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(3 * time.Minute)
	var last error
	for time.Now().Before(deadline) {
		if !api.alive() {
			return fmt.Errorf("kube-apiserver exited; see %s", api.Log)
		}
		var body []byte
		body, last = c.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if last == nil && string(body) == "ok" {
			return nil
		}
		time.Sleep(time.Second)
	}
	return fmt.Errorf("kube-apiserver not ready after 3m: %v; see %s", last, api.Log)
}

// hostRoutes routes each node's pod CIDR via the node on the lab's bridge: the API server
// proxies to pods and Services (kubectl port-forward does not need it, the Proxy specs
// do), as a control plane on the pod network does. The routes go with the bridge.
func (s *State) hostRoutes(ctx context.Context) error {
	c, err := s.Plan.Client()
	if err != nil {
		return err
	}
	br, err := netlink.LinkByName(s.Plan.Bridge)
	if err != nil {
		return err
	}
	for _, n := range s.Plan.Nodes {
		var cidr string
		deadline := time.Now().Add(time.Minute)
		for cidr == "" {
			node, err := c.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err == nil {
				cidr = node.Spec.PodCIDR
			}
			if cidr == "" && time.Now().After(deadline) {
				return fmt.Errorf("node %s has no pod CIDR after a minute (kube-controller-manager --allocate-node-cidrs; see its log): %v", n.Name, err)
			}
			if cidr == "" {
				time.Sleep(time.Second)
			}
		}
		_, dst, err := net.ParseCIDR(cidr)
		if err != nil {
			return err
		}
		if err := netlink.RouteReplace(&netlink.Route{LinkIndex: br.Attrs().Index, Dst: dst, Gw: n.IP.AsSlice()}); err != nil {
			return fmt.Errorf("routing %s via node %s: %w", cidr, n.Name, err)
		}
	}
	return nil
}
