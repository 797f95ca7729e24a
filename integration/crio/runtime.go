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
