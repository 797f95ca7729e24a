// SPDX-License-Identifier: Apache-2.0

// Package kubeapi runs a real Kubernetes control plane for podwire's integration tests:
// etcd and kube-apiserver, built from the Go module proxy (no release binaries, no
// container images), started in a network namespace of the test's own.
package kubeapi

import (
	"debug/buildinfo"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
)

// The releases the tests build and run. The modules that pin them, with their go.sum,
// are in build/apiserver and build/etcd (modules of their own, so podwire's go.mod does
// not carry kube-apiserver's dependencies).
const (
	KubernetesVersion = "v1.37.2"
	EtcdVersion       = "v3.7.3"
)

// Binaries are the control plane's programs.
type Binaries struct {
	Etcd, APIServer string
}

type program struct {
	name, moduleDir, pkg string
	dep, version         string // the module whose version the binary must carry
}

var programs = []program{
	{"etcd", "build/etcd", ".", "go.etcd.io/etcd/server/v3", EtcdVersion},
	{"kube-apiserver", "build/apiserver", "k8s.io/kubernetes/cmd/kube-apiserver", "k8s.io/kubernetes", KubernetesVersion},
}

// Ensure returns etcd and kube-apiserver, built once into
// <repo>/.cache/kube/<kubernetes version>/ (git-ignored) and reused while each binary
// carries the pinned module version. A cold build of kube-apiserver takes about ten
// CPU-minutes. PODWIRE_KUBE_DIR, when set, names a directory holding etcd and
// kube-apiserver to use as they are.
func Ensure(repo string) (Binaries, error) {
	dir := os.Getenv("PODWIRE_KUBE_DIR")
	if dir == "" {
		dir = filepath.Join(repo, ".cache", "kube", KubernetesVersion)
		for _, p := range programs {
			if err := build(filepath.Join(repo, "integration", "kubeapi"), dir, p); err != nil {
				return Binaries{}, err
			}
		}
	}
	b := Binaries{Etcd: filepath.Join(dir, "etcd"), APIServer: filepath.Join(dir, "kube-apiserver")}
	for _, f := range []string{b.Etcd, b.APIServer} {
		if st, err := os.Stat(f); err != nil || st.Mode()&0o111 == 0 {
			return Binaries{}, fmt.Errorf("no executable %s: unset PODWIRE_KUBE_DIR to build etcd %s and kube-apiserver %s there", f, EtcdVersion, KubernetesVersion)
		}
	}
	return b, nil
}

// build compiles p into dir unless a binary of the pinned version is there. It builds to
// a temporary name and renames it into place, so an interrupted run, or another run
// building at the same time, never leaves a half-written binary.
func build(src, dir string, p program) error {
	out := filepath.Join(dir, p.name)
	if current(out, p) {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, "."+p.name+"-")
	if err != nil {
		return err
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	// -mod=readonly: the pinned go.sum decides every module. Integration tests run one
	// at a time, so the build may take every core.
	cmd := exec.Command("go", "build", "-mod=readonly", "-trimpath", "-o", tmp.Name(), p.pkg)
	cmd.Dir = filepath.Join(src, p.moduleDir)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false", "GOWORK=off")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building %s %s in %s (needs the Go module proxy; or set PODWIRE_KUBE_DIR to a directory with etcd and kube-apiserver): %w\n%s",
			p.name, p.version, cmd.Dir, err, tail(string(b), 40))
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return fmt.Errorf("installing %s into %s: %w", p.name, dir, err)
	}
	if !current(out, p) {
		return fmt.Errorf("%s built from %s does not carry %s %s", out, cmd.Dir, p.dep, p.version)
	}
	return nil
}

// current reports whether file is p built against p.dep at p.version.
func current(file string, p program) bool {
	info, err := buildinfo.ReadFile(file)
	if err != nil {
		return false
	}
	// kube-apiserver's main package is k8s.io/kubernetes's (Main); etcd's main is ours,
	// etcd a dependency.
	for _, d := range append([]*debug.Module{&info.Main}, info.Deps...) {
		if d.Path == p.dep {
			return d.Version == p.version
		}
	}
	return false
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
