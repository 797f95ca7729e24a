// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// Inside a node's mount namespace containerd keeps its default paths: /var/lib/containerd
// and /run/containerd are the node's own binds, and deploy/'s podwire-agent finds the CRI
// socket where it looks for it (CRI-O's, on a CRI-O node, in the /run/crio bind).
const (
	criSocket = "/run/containerd/containerd.sock"
	// crioSocket is CRI-O's packaged socket path, inside a CRI-O node's /run/crio bind.
	crioSocket  = "/run/crio/crio.sock"
	podCNIBin   = "/opt/cni/bin"
	podCNIConf  = "/etc/cni/net.d"
	PauseImage  = "registry.k8s.io/pause:3.10.2"
	clusterZone = "cluster.local"
	// sbinPath finds iptables, nft and runc even under a user's PATH.
	sbinPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// containerdConfig is containerd 2.x's config (schema 3) for a lab node.
func (p Plan) containerdConfig(n Node) string {
	return fmt.Sprintf(`# Written by podwire's lab (integration/cluster) for node %[1]s.
version = 3
# NRI's socket is one per machine; the snapshotters nobody uses stay quiet.
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.blockfile", "io.containerd.snapshotter.v1.erofs", "io.containerd.nri.v1.nri"]

[plugins.'io.containerd.internal.v1.opt']
  # Not /opt/containerd on the machine.
  path = "/var/lib/containerd/opt"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = %[2]q

[plugins.'io.containerd.cri.v1.runtime']
  disable_apparmor = true
  # This machine's root lacks CAP_SYS_RESOURCE: a negative oom_score_adj fails in runc.
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [%[3]q]
    conf_dir = %[4]q
    max_conf_num = 1
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      runtime_path = %[5]q
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        SystemdCgroup = false

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
`, n.Name, PauseImage, podCNIBin, podCNIConf, filepath.Join(p.ContainerdDir, "containerd-shim-runc-v2"))
}

// kubeletConfig is the node's KubeletConfiguration (what worked on this machine; see
// docs and shared lab notes: cgroup v1 needs failCgroupV1: false, the kubelets need
// roots of their own, and each sees the whole machine's memory and disk).
func (p Plan) kubeletConfig(n Node) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: %[1]s
cgroupsPerQOS: true
failSwapOn: false
containerRuntimeEndpoint: unix://%[2]s
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %[3]s}
authorization: {mode: Webhook}
clusterDomain: %[4]s
clusterDNS: [%[5]s]
resolvConf: %[6]s
address: %[7]s
healthzBindAddress: 127.0.0.1
evictionHard: {memory.available: "0%%", nodefs.available: "0%%", imagefs.available: "0%%", nodefs.inodesFree: "0%%"}
imageGCHighThresholdPercent: 100
serializeImagePulls: false
rotateCertificates: false
serverTLSBootstrap: false
`, n.Cgroup, n.socket(), p.pki("ca.crt"), clusterZone, p.DNS, n.Path("resolv.conf"), n.IP)
}

func (p Plan) kubeProxyConfig(n Node) string {
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: %[1]s}
hostnameOverride: %[2]s
mode: %[3]s
clusterCIDR: %[4]s
# nf_conntrack_max is read-only outside the initial netns.
conntrack: {maxPerCore: 0}
# Root here lacks CAP_SYS_RESOURCE: a negative score fails.
oomScoreAdj: 0
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
`, p.pki("kube-proxy.kubeconfig"), n.Name, p.ProxyMode, p.ClusterCIDR)
}

// socket is the CRI socket of n's runtime, inside n's mount namespace.
func (n Node) socket() string {
	if n.Runtime == RuntimeCRIO {
		return crioSocket
	}
	return criSocket
}

// sysCgroup is the cgroup of a node's daemons (containerd and so its shims, the kubelet,
// kube-proxy): Down kills what is left in it.
func (n Node) sysCgroup() string { return n.Cgroup + "-sys" }

// startNode starts n's runtime (containerd or CRI-O) with the images in it, then the
// kubelet and kube-proxy.
func (s *State) startNode(ctx context.Context, n Node, images []ImageArchive) error {
	p := s.Plan
	for _, cg := range []string{n.Cgroup, n.sysCgroup()} {
		if err := s.cgroup(cg); err != nil {
			return err
		}
	}
	files := map[string]string{
		"kubelet.yaml":    p.kubeletConfig(n),
		"kube-proxy.yaml": p.kubeProxyConfig(n),
		"resolv.conf":     "# The lab has no upstream resolver: pods resolve cluster names only.\noptions ndots:5\n",
	}
	for name, body := range files {
		if err := os.WriteFile(n.Path(name), []byte(body), 0o644); err != nil {
			return err
		}
	}
	path := "PATH=" + p.ContainerdDir + ":" + sbinPath
	var err error
	if n.Runtime == RuntimeCRIO {
		err = s.startCRIO(n, images)
	} else {
		err = s.startContainerd(n, images)
	}
	if err != nil {
		return err
	}
	if _, err := s.startDaemon(n.Name+"-kubelet", n.sysCgroup(), inNode(n, p.bin("kubelet"),
		"--config="+n.Path("kubelet.yaml"), "--kubeconfig="+p.pki("kubelet-"+n.Name+".kubeconfig"),
		"--hostname-override="+n.Name, "--node-ip="+n.IP.String(), "--root-dir=/var/lib/kubelet", "--v=1"), []string{path}); err != nil {
		return err
	}
	return s.startProxy(n)
}

// startContainerd starts containerd 2.x in n and imports the images into it.
func (s *State) startContainerd(n Node, images []ImageArchive) error {
	p := s.Plan
	if err := os.WriteFile(n.Path("containerd.toml"), []byte(p.containerdConfig(n)), 0o644); err != nil {
		return err
	}
	ctrd, err := s.startDaemon(n.Name+"-containerd", n.sysCgroup(), inNode(n, filepath.Join(p.ContainerdDir, "containerd"),
		"--config", n.Path("containerd.toml")), []string{"PATH=" + p.ContainerdDir + ":" + sbinPath})
	if err != nil {
		return err
	}
	if err := waitFor(30*time.Second, ctrd, func() error {
		_, err := run(inNode(n, filepath.Join(p.ContainerdDir, "ctr"), "--address", criSocket, "version")...)
		return err
	}); err != nil {
		return fmt.Errorf("node %s's containerd: %w", n.Name, err)
	}
	for _, img := range images {
		if err := p.importImage(n, img); err != nil {
			return err
		}
	}
	return nil
}

func (s *State) startProxy(n Node) error {
	_, err := s.startDaemon(n.Name+"-kube-proxy", n.sysCgroup(), inNode(n, s.Plan.bin("kube-proxy"),
		"--config="+n.Path("kube-proxy.yaml"), "--v=1"), []string{"PATH=" + sbinPath})
	return err
}

// waitFor polls check until it succeeds, d passes, or proc exits.
func waitFor(d time.Duration, proc Proc, check func() error) error {
	deadline := time.Now().Add(d)
	var last error
	for time.Now().Before(deadline) {
		if !proc.alive() {
			return fmt.Errorf("%s exited; see %s", proc.Name, proc.Log)
		}
		if last = check(); last == nil {
			return nil
		}
		time.Sleep(300 * time.Millisecond)
	}
	return fmt.Errorf("not ready after %s: %v; see %s", d, last, proc.Log)
}
