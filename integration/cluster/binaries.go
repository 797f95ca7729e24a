// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"debug/buildinfo"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/podwire/podwire/integration/kubeapi"
)

// CoreDNS is built from the Go module proxy (its module has no replace directives, so
// `go install module@version` works) and cached beside the Kubernetes binaries.
const (
	CoreDNSModule  = "github.com/coredns/coredns"
	CoreDNSVersion = "v1.15.0"
	// CoreDNSImage is the name the lab's CoreDNS image is imported under.
	CoreDNSImage = "registry.k8s.io/coredns/coredns:" + CoreDNSVersion
	// RegressionImage is the server of the Conntrack invalid-state spec, under the name
	// e2e.test expects.
	RegressionImage = "registry.k8s.io/e2e-test-images/regression-issue-74839:1.5"
	// AgentImage is the podwire-agent image deploy/ names.
	AgentImage = "docker.io/podwire/podwire-agent:dev"
)

// ensureCoreDNS returns CoreDNS's binary in the Kubernetes cache dir, built once.
func ensureCoreDNS(repo string) (string, error) {
	dir := filepath.Join(repo, ".cache", "kube", kubeapi.KubernetesVersion)
	out := filepath.Join(dir, "coredns")
	if info, err := buildinfo.ReadFile(out); err == nil && info.Main.Path == CoreDNSModule && info.Main.Version == CoreDNSVersion {
		return out, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(dir, ".coredns-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	cmd := exec.Command("go", "install", "-trimpath", "-ldflags=-s -w", CoreDNSModule+"@"+CoreDNSVersion)
	cmd.Dir = os.TempDir() // outside any module
	cmd.Env = append(os.Environ(), "GOBIN="+tmp, "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false", "GOWORK=off")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go install %s@%s (needs the Go module proxy): %w\n%s", CoreDNSModule, CoreDNSVersion, err, b)
	}
	if err := os.Rename(filepath.Join(tmp, "coredns"), out); err != nil {
		return "", err
	}
	return out, nil
}
