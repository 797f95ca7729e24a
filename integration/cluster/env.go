// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// deployClusterCIDR is the --cluster-cidr podwire-agent's DaemonSet in deploy/ carries.
const deployClusterCIDR = "10.244.0.0/16"

// FromEnv applies the lab's variables to c: LAB_DIR, PROXY_MODE, NODES, and, so that
// several labs (a developer's, the CI smoke's) can run on one machine side by side,
// LAB_PREFIX (names of links, netns and cgroups), LAB_SEGMENT (the nodes' subnet, which
// also picks etcd's ports) and LAB_CLUSTER_CIDR (the pod network; deploy/ is applied with
// the agent's --cluster-cidr rewritten to it). RUNTIMES (containerd or crio per node,
// comma-separated, in node order) runs a node on CRI-O instead of containerd.
func FromEnv(c Config) (Config, error) {
	if v := os.Getenv("LAB_DIR"); v != "" {
		c.Dir = v
	}
	if v := os.Getenv("PROXY_MODE"); v != "" {
		c.ProxyMode = v
	}
	if v := os.Getenv("NODES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return c, fmt.Errorf("NODES=%q: a number, 1 or 2", v)
		}
		c.NodeCount = n
	}
	if v := os.Getenv("RUNTIMES"); v != "" {
		c.Runtimes = strings.Split(v, ",")
		for i := range c.Runtimes {
			c.Runtimes[i] = strings.TrimSpace(c.Runtimes[i])
		}
	}
	if v := os.Getenv("LAB_PREFIX"); v != "" {
		c.Prefix = v
	}
	for _, e := range []struct {
		name string
		to   *netip.Prefix
	}{{"LAB_SEGMENT", &c.Segment}, {"LAB_CLUSTER_CIDR", &c.ClusterCIDR}} {
		if v := os.Getenv(e.name); v != "" {
			p, err := netip.ParsePrefix(v)
			if err != nil {
				return c, fmt.Errorf("%s=%q: an IPv4 subnet such as 10.251.0.0/24: %w", e.name, v, err)
			}
			*e.to = p.Masked()
		}
	}
	return c, nil
}

// deployManifests is deploy/ as `kubectl apply -f -` input, with the agent's cluster CIDR
// rewritten to the lab's. The default lab applies the directory itself (the README's
// command); only a lab on another pod network comes here.
func (p Plan) deployManifests() (string, error) {
	files, err := filepath.Glob(filepath.Join(p.Repo, "deploy", "*.yaml"))
	if err != nil {
		return "", err
	}
	sort.Strings(files)
	var b strings.Builder
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		b.WriteString("---\n")
		b.Write(data)
		b.WriteString("\n")
	}
	out := b.String()
	if !strings.Contains(out, "--cluster-cidr="+deployClusterCIDR) {
		return "", fmt.Errorf("deploy/ carries no --cluster-cidr=%s to rewrite to the lab's %s", deployClusterCIDR, p.ClusterCIDR)
	}
	return strings.ReplaceAll(out, "--cluster-cidr="+deployClusterCIDR, "--cluster-cidr="+p.ClusterCIDR.String()), nil
}
