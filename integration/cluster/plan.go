// SPDX-License-Identifier: Apache-2.0

// Package cluster is podwire's Kubernetes lab: a real control plane (etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler) in the machine's network
// namespace and nodes that are each a network namespace plus a mount namespace shared by
// the node's containerd, kubelet and kube-proxy, on one L2 segment (a bridge the lab
// makes). The pod network is podwire itself: the nodes start without a CNI config and
// turn Ready once `kubectl apply -f deploy/` has run podwire-agent on them.
//
// Everything the lab makes lives under one run directory and is named with one prefix;
// Down removes exactly what the state file there lists, so the machine is left as it was.
// The lab is driven by ./integration/cluster/lab (make cluster, make cluster-down) and
// checked by this package's tests.
package cluster

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
)

// Config is what an operator chooses; everything else is derived from it.
type Config struct {
	// Dir is the run directory: certificates, configs, node roots, logs and the state file.
	Dir string
	// Repo is podwire's checkout (binaries are built from it and cached in its .cache).
	Repo string
	// ProxyMode is kube-proxy's mode on every node: "iptables" or "nftables".
	ProxyMode string
	// Nodes is the number of nodes (1 or 2).
	NodeCount int
	// Prefix names every kernel object and cgroup the lab makes.
	Prefix string
	// Segment is the nodes' L2 subnet; its first address is the machine's side, where the
	// control plane listens.
	Segment netip.Prefix
	// ClusterCIDR, ServiceCIDR and DNS are the cluster's addresses. ClusterCIDR must match
	// podwire-agent's --cluster-cidr in deploy/.
	ClusterCIDR, ServiceCIDR netip.Prefix
	DNS                      netip.Addr
	// Agent says whether Up applies deploy/ (podwire-agent) and CoreDNS.
	Agent bool
	// Runtimes is each node's container runtime, in node order: "containerd" (the
	// default for a node not listed) or "crio" (CRI-O from integration/crio's build).
	Runtimes []string
	// E2E says whether Up builds e2e.test too (the conformance run needs it; it also
	// names the agnhost images e2e expects). The CI smoke leaves it out.
	E2E bool
}

// DefaultConfig is the lab `make cluster` brings up.
func DefaultConfig(repo string) Config {
	return Config{
		Dir:         "/tmp/podwire-lab",
		Repo:        repo,
		ProxyMode:   "iptables",
		NodeCount:   2,
		Prefix:      "pwlab",
		Segment:     netip.MustParsePrefix("10.250.0.0/24"),
		ClusterCIDR: netip.MustParsePrefix("10.244.0.0/16"),
		ServiceCIDR: netip.MustParsePrefix("10.96.0.0/16"),
		DNS:         netip.MustParseAddr("10.96.0.10"),
		Agent:       true,
		E2E:         true,
	}
}

// Node is one node of the plan.
type Node struct {
	Name    string     // the Kubernetes node name and its netns name
	IP      netip.Addr // on the segment
	HostEnd string     // the veth end on the machine's bridge
	Dir     string     // its root under the run dir
	MountNS string     // the file its mount namespace is pinned at
	NetNS   string     // the file its network namespace is pinned at
	Cgroup  string     // the kubelet's cgroupRoot, e.g. /pwlab-1
	Runtime string     // RuntimeContainerd or RuntimeCRIO
}

// The runtimes a node can run (RUNTIMES).
const (
	RuntimeContainerd = "containerd"
	RuntimeCRIO       = "crio"
)

// NodeDirs are the node-local directories: each is a private bind inside the node's
// mount namespace (source under Node.Dir, target on the machine's path), so containerd,
// the kubelet, kube-proxy and the pods' hostPath volumes (podwire-agent's among them)
// see only the node's own.
var NodeDirs = []string{
	"/var/lib/kubelet", "/var/lib/containerd", "/run/containerd", "/etc/cni/net.d", "/opt/cni/bin",
	"/var/lib/cni", "/var/log/pods", "/var/log/containers", "/run/netns", "/var/lib/podwire-agent",
	"/run/podwire",
	// CRI-O's socket dir (deploy/'s DaemonSet mounts it on every node) and
	// containers/image's blob-info cache, which skopeo keeps there with no option to move it.
	"/run/crio", "/var/lib/containers",
}

// KernelSysctls are the host-wide sysctls the kubelet rewrites at start (it wants these
// values). Inside each node's mount namespace a file holding the value is bound over each,
// so the kubelet finds what it wants and the machine's own values stay.
var KernelSysctls = map[string]string{
	"/proc/sys/vm/overcommit_memory": "1",
	"/proc/sys/kernel/panic":         "10",
	"/proc/sys/kernel/panic_on_oops": "1",
}

// Plan is every name, address and path the lab uses, derived from a Config. It is pure
// data: Up and Down act on it.
type Plan struct {
	Config
	Bridge        string     // the segment's bridge in the machine's netns
	HostIP        netip.Addr // the bridge's address: the API server and the controllers listen there
	APIServer     string     // https URL
	ServiceAPI    netip.Addr // the kubernetes Service's ClusterIP
	Nodes         []Node
	BinDir        string // the Kubernetes binaries (filled by Up)
	ContainerdDir string // containerd 2.x, its shim and ctr (filled by Up)
	CRIODir       string // CRI-O's crio and pinns (filled by Up when a node runs CRI-O)
	Crictl        string // crictl (filled by Up when a node runs CRI-O)
	PKI           string // certificates and kubeconfigs
	Logs          string
	StateFile     string
	Kubeconfig    string // admin
	// EtcdPort is etcd's client port on loopback (the peer port is the next): derived
	// from the segment, so labs on different segments can run side by side.
	EtcdPort int
}

// NewPlan validates c and derives the lab's names, addresses and paths.
func NewPlan(c Config) (Plan, error) {
	switch c.ProxyMode {
	case "iptables", "nftables":
	default:
		return Plan{}, fmt.Errorf("kube-proxy mode %q: set PROXY_MODE to iptables or nftables", c.ProxyMode)
	}
	if c.NodeCount < 1 || c.NodeCount > 2 {
		return Plan{}, fmt.Errorf("%d nodes: the lab runs 1 or 2 (NODES=1 or NODES=2)", c.NodeCount)
	}
	if !filepath.IsAbs(c.Dir) || filepath.Clean(c.Dir) == "/" {
		return Plan{}, fmt.Errorf("run dir %q must be an absolute path below / (LAB_DIR)", c.Dir)
	}
	if c.Prefix == "" || len(c.Prefix) > 8 || strings.ContainsAny(c.Prefix, "/ .") {
		return Plan{}, fmt.Errorf("prefix %q: 1-8 characters, no '/', '.' or space (interface names are limited to 15)", c.Prefix)
	}
	if !c.Segment.Addr().Is4() || c.Segment.Bits() > 28 {
		return Plan{}, fmt.Errorf("segment %s: an IPv4 subnet of /28 or wider", c.Segment)
	}
	if c.ClusterCIDR.Overlaps(c.ServiceCIDR) || c.ClusterCIDR.Overlaps(c.Segment) || c.ServiceCIDR.Overlaps(c.Segment) {
		return Plan{}, fmt.Errorf("segment %s, cluster CIDR %s and service CIDR %s must not overlap", c.Segment, c.ClusterCIDR, c.ServiceCIDR)
	}
	runtimes, err := nodeRuntimes(c.Runtimes, c.NodeCount)
	if err != nil {
		return Plan{}, err
	}
	if !c.ServiceCIDR.Contains(c.DNS) {
		return Plan{}, fmt.Errorf("cluster DNS %s is outside the service CIDR %s", c.DNS, c.ServiceCIDR)
	}
	p := Plan{
		Config:     c,
		Bridge:     c.Prefix + "0",
		HostIP:     c.Segment.Masked().Addr().Next(),
		ServiceAPI: c.ServiceCIDR.Masked().Addr().Next(),
		PKI:        filepath.Join(c.Dir, "pki"),
		Logs:       filepath.Join(c.Dir, "logs"),
		StateFile:  filepath.Join(c.Dir, "state.json"),
	}
	p.Kubeconfig = filepath.Join(p.PKI, "admin.kubeconfig")
	seg := c.Segment.Masked().Addr().As4()
	p.EtcdPort = 20000 + int(seg[1])*10 + int(seg[2])%10*2
	p.APIServer = "https://" + p.HostIP.String() + ":6443"
	ip := p.HostIP
	for i := 1; i <= c.NodeCount; i++ {
		for j := 0; j < 10; j++ {
			ip = ip.Next()
		}
		name := fmt.Sprintf("%s-%d", c.Prefix, i)
		dir := filepath.Join(c.Dir, "nodes", name)
		p.Nodes = append(p.Nodes, Node{
			Name: name, IP: ip, HostEnd: fmt.Sprintf("%sh%d", c.Prefix, i), Dir: dir,
			MountNS: filepath.Join(c.Dir, "ns", name+".mnt"), NetNS: filepath.Join(c.Dir, "ns", name+".net"), Cgroup: "/" + name,
			Runtime: runtimes[i-1],
		})
	}
	return p, nil
}

// nodeRuntimes checks RUNTIMES against the node count: one entry per node, or none
// (every node containerd).
func nodeRuntimes(list []string, nodes int) ([]string, error) {
	out := make([]string, nodes)
	for i := range out {
		out[i] = RuntimeContainerd
	}
	if len(list) == 0 {
		return out, nil
	}
	if len(list) != nodes {
		return nil, fmt.Errorf("RUNTIMES=%s names %d runtimes for %d nodes: one per node in order, e.g. RUNTIMES=containerd,crio with NODES=2", strings.Join(list, ","), len(list), nodes)
	}
	for i, r := range list {
		switch r {
		case RuntimeContainerd, RuntimeCRIO:
			out[i] = r
		default:
			return nil, fmt.Errorf("RUNTIMES=%s: runtime %q for node %d: write containerd or crio, one per node (e.g. RUNTIMES=containerd,crio)", strings.Join(list, ","), r, i+1)
		}
	}
	return out, nil
}

// HasRuntime reports whether a node of the plan runs r.
func (p Plan) HasRuntime(r string) bool {
	for _, n := range p.Nodes {
		if n.Runtime == r {
			return true
		}
	}
	return false
}

// Path is a file of the node's own below its root.
func (n Node) Path(elem ...string) string { return filepath.Join(append([]string{n.Dir}, elem...)...) }
