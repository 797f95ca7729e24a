// SPDX-License-Identifier: Apache-2.0

package containerd

import (
	"debug/buildinfo"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// crictl is installed from the Go module proxy (no prebuilt download is reachable).
const (
	crictlPackage = "sigs.k8s.io/cri-tools/cmd/crictl"
	crictlModule  = "sigs.k8s.io/cri-tools"
	CrictlVersion = "v1.37.0"
)

// EnsureCrictl returns the path of crictl CrictlVersion. PODWIRE_CRICTL, when set,
// names a crictl to use as is. Otherwise it is `go install`ed once into
// <repo>/.cache/bin (git-ignored) and reused while its module version matches.
func EnsureCrictl(repo string) (string, error) {
	if p := os.Getenv("PODWIRE_CRICTL"); p != "" {
		return p, nil
	}
	dir := filepath.Join(repo, ".cache", "bin")
	bin := filepath.Join(dir, "crictl")
	if crictlIsCurrent(bin) {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	cmd := exec.Command("go", "install", crictlPackage+"@"+CrictlVersion)
	// Outside the module, so the install never touches podwire's go.mod.
	cmd.Dir = os.TempDir()
	cmd.Env = append(os.Environ(), "GOBIN="+dir, "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go install %s@%s (needs the Go module proxy; or set PODWIRE_CRICTL to a crictl binary): %v\n%s",
			crictlPackage, CrictlVersion, err, out)
	}
	if !crictlIsCurrent(bin) {
		return "", fmt.Errorf("go install put no crictl %s at %s", CrictlVersion, bin)
	}
	return bin, nil
}

func crictlIsCurrent(bin string) bool {
	info, err := buildinfo.ReadFile(bin)
	return err == nil && info.Main.Path == crictlModule && info.Main.Version == CrictlVersion
}
