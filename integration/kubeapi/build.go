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

// The releases the tests and the lab build and run. The modules that pin them, with
// their go.sum, are in build/kubernetes and build/etcd (modules of their own, so
// podwire's go.mod does not carry Kubernetes' dependencies).
const (
	KubernetesVersion = "v1.37.2"
	EtcdVersion       = "v3.7.3"
)

// Binaries are the control plane's programs.
type Binaries struct {
	Etcd, APIServer string
}

// kubeModule is the wrapper module every Kubernetes program is built in.
const kubeModule = "build/kubernetes"

type program struct {
	name, moduleDir, pkg string
	dep, version         string // the module whose version the binary must carry
	test                 bool   // pkg is a test package: `go test -c` builds it
}

// versionLDFlags make a Kubernetes program report its release: built from the module
// proxy it has no git tree to take it from and reports v0.0.0-master, which specs and
// clients gated on the server's version refuse.
var versionLDFlags = "-s -w" +
	" -X k8s.io/component-base/version.gitVersion=" + KubernetesVersion +
	" -X k8s.io/component-base/version.gitMajor=1" +
	" -X k8s.io/component-base/version.gitMinor=37" +
	" -X k8s.io/component-base/version.gitTreeState=clean"

func kubeProgram(name, pkg string) program {
	return program{name, kubeModule, pkg, "k8s.io/kubernetes", KubernetesVersion, false}
}

var (
	etcdProgram = program{"etcd", "build/etcd", ".", "go.etcd.io/etcd/server/v3", EtcdVersion, false}
	apiServer   = kubeProgram("kube-apiserver", "k8s.io/kubernetes/cmd/kube-apiserver")
	// The rest of a cluster, for the lab (integration/cluster) and the conformance run.
	clusterPrograms = []program{
		kubeProgram("kubelet", "k8s.io/kubernetes/cmd/kubelet"),
		kubeProgram("kube-proxy", "k8s.io/kubernetes/cmd/kube-proxy"),
		kubeProgram("kube-controller-manager", "k8s.io/kubernetes/cmd/kube-controller-manager"),
		kubeProgram("kube-scheduler", "k8s.io/kubernetes/cmd/kube-scheduler"),
		kubeProgram("kubectl", "k8s.io/kubernetes/cmd/kubectl"),
		kubeProgram("agnhost", "k8s.io/kubernetes/test/images/agnhost"),
		// The server of the Conntrack "invalid conntrack state" spec (its own image).
		kubeProgram("regression-issue-74839", "k8s.io/kubernetes/test/images/regression-issue-74839"),
	}
	e2eProgram = program{"e2e.test", kubeModule, "k8s.io/kubernetes/test/e2e", "k8s.io/kubernetes", KubernetesVersion, true}
)

// Ensure returns etcd and kube-apiserver, built once into
// <repo>/.cache/kube/<kubernetes version>/ (git-ignored) and reused while each binary
// carries the pinned module version. A cold build of kube-apiserver takes about ten
// CPU-minutes. PODWIRE_KUBE_DIR, when set, names a directory holding etcd and
// kube-apiserver to use as they are.
func Ensure(repo string) (Binaries, error) {
	dir, err := ensure(repo, []program{etcdProgram, apiServer})
	if err != nil {
		return Binaries{}, err
	}
	return Binaries{Etcd: filepath.Join(dir, "etcd"), APIServer: filepath.Join(dir, "kube-apiserver")}, nil
}

// EnsureCluster is Ensure for every program a cluster runs: etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler, kubelet, kube-proxy, kubectl, agnhost and,
// with e2e, the conformance binary e2e.test. It returns the directory that holds them,
// each under its own name. A cold build takes about an hour of CPU on 2 cores (the
// kubelet alone ~17 CPU-minutes, e2e.test ~7 more); once the packages are in Go's
// build cache, relinking one program takes a minute.
func EnsureCluster(repo string, e2e bool) (string, error) {
	progs := append([]program{etcdProgram, apiServer}, clusterPrograms...)
	if e2e {
		progs = append(progs, e2eProgram)
	}
	return ensure(repo, progs)
}

func ensure(repo string, progs []program) (string, error) {
	dir := os.Getenv("PODWIRE_KUBE_DIR")
	if dir == "" {
		dir = filepath.Join(repo, ".cache", "kube", KubernetesVersion)
		for _, p := range progs {
			if err := build(filepath.Join(repo, "integration", "kubeapi"), dir, p); err != nil {
				return "", err
			}
		}
	}
	for _, p := range progs {
		f := filepath.Join(dir, p.name)
		if st, err := os.Stat(f); err != nil || st.Mode()&0o111 == 0 {
			return "", fmt.Errorf("no executable %s: unset PODWIRE_KUBE_DIR to build %s %s there", f, p.name, p.version)
		}
	}
	return dir, nil
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
	args := []string{"build", "-mod=readonly", "-trimpath"}
	if p.dep == "k8s.io/kubernetes" {
		args = append(args, "-ldflags="+versionLDFlags)
	}
	if p.test {
		// go test -c runs go vet first by default: most of e2e.test's build time.
		args = append([]string{"test", "-c", "-vet=off"}, args[1:]...)
	}
	cmd := exec.Command("go", append(args, "-o", tmp.Name(), p.pkg)...)
	cmd.Dir = filepath.Join(src, p.moduleDir)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false", "GOWORK=off")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building %s %s in %s (needs the Go module proxy; or set PODWIRE_KUBE_DIR to a directory with the binaries): %w\n%s",
			p.name, p.version, cmd.Dir, err, tail(string(b), 40))
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return fmt.Errorf("installing %s into %s: %w", p.name, dir, err)
	}
	if p.dep == "k8s.io/kubernetes" {
		if err := os.WriteFile(out+".ldflags", []byte(stamp(out)), 0o644); err != nil {
			return err
		}
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
	if p.dep == "k8s.io/kubernetes" {
		// -trimpath keeps -ldflags out of the build info, so a stamp beside the binary
		// says it was built with the version ldflags (without them it reports
		// v0.0.0-master).
		if b, err := os.ReadFile(file + ".ldflags"); err != nil || string(b) != stamp(file) {
			return false
		}
	}
	for _, d := range append([]*debug.Module{&info.Main}, info.Deps...) {
		if d.Path == p.dep {
			return d.Version == p.version
		}
	}
	return false
}

// stamp is the version ldflags and the binary's size and modification time: a binary
// another build put in its place later (without the ldflags) no longer matches.
func stamp(file string) string {
	st, err := os.Stat(file)
	if err != nil {
		return ""
	}
	return fmt.Sprintf("%s\n%d %d\n", versionLDFlags, st.Size(), st.ModTime().UnixNano())
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
