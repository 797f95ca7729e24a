// SPDX-License-Identifier: Apache-2.0

package crio

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// RuntimePath is the runc handler's runtime_path for a CRI-O whose files are below
// dir: runcclamp, built into dir, which takes out of each spec what this machine's
// kernel refuses (an oom_score_adj below root's own without CAP_SYS_RESOURCE, hugetlb
// limits without a hugetlb hierarchy) and execs Debian's runc. The test harness and the
// Kubernetes lab's CRI-O nodes both use it.
func RuntimePath(repo, dir string) (string, error) {
	out := filepath.Join(dir, "runcclamp")
	return out, BuildGo(repo, "./integration/crio/runcclamp", out)
}

// BuildGo builds a static program of podwire's tree (pkg, relative to repo) into out.
func BuildGo(repo, pkg, out string) error {
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, pkg)
	build.Dir = repo
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("building %s: %w\n%s", pkg, err, b)
	}
	return nil
}

// LocalhostHostPorts are the node settings CRI-O's hostPorts on 127.0.0.1 need and
// that CRI-O makes none of (cri-o's own CI sets them up the same way): the kernel
// drops a DNAT of 127.0.0.1 to a pod unless route_localnet is on, and the pod would
// answer 127.0.0.1 to itself unless the node masquerades 127.0.0.0/8. docs/crio.md
// shows these commands; the tests and the lab's CRI-O nodes run them in the node's netns.
var LocalhostHostPorts = [][]string{
	{"sysctl", "-w", "net.ipv4.conf.all.route_localnet=1"},
	{"iptables", "-t", "nat", "-I", "POSTROUTING", "-s", "127.0.0.0/8", "!", "-d", "127.0.0.0/8", "-j", "MASQUERADE"},
}
