// SPDX-License-Identifier: Apache-2.0

package containerd

import (
	"debug/buildinfo"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// containerd 2.x is built from the Go module proxy: no Debian release ships it yet.
const (
	containerd2Module = "github.com/containerd/containerd/v2"
	// Containerd2Version is the containerd 2.x release the tests build and run.
	Containerd2Version = "v2.4.2"
)

// containerd2Programs are the packages of containerd2Module a private containerd runs.
var containerd2Programs = []string{"containerd", "containerd-shim-runc-v2", "ctr"}

// Containerd2Name is the Name of the Runtime EnsureContainerd2 returns.
var Containerd2Name = "containerd-" + majorMinor(Containerd2Version)

// EnsureContainerd2 returns containerd Containerd2Version with its runc shim and ctr,
// `go install`ed once from the Go module proxy into
// <repo>/.cache/containerd/<version>/ (git-ignored) and reused while each binary's
// module version matches. PODWIRE_CONTAINERD2_DIR, when set, names a directory with
// the three programs to use as they are.
func EnsureContainerd2(repo string) (Runtime, error) {
	dir := os.Getenv("PODWIRE_CONTAINERD2_DIR")
	if dir == "" {
		dir = filepath.Join(repo, ".cache", "containerd", Containerd2Version)
		if err := buildContainerd2(dir); err != nil {
			return Runtime{}, err
		}
	} else {
		for _, p := range containerd2Programs {
			if !found(filepath.Join(dir, p)) {
				return Runtime{}, fmt.Errorf("PODWIRE_CONTAINERD2_DIR=%s has no executable %s: put containerd %s's programs there, or unset it to build them", dir, p, Containerd2Version)
			}
		}
	}
	return Runtime{
		Name:          Containerd2Name,
		Containerd:    filepath.Join(dir, "containerd"),
		Shim:          filepath.Join(dir, "containerd-shim-runc-v2"),
		Ctr:           filepath.Join(dir, "ctr"),
		ConfigVersion: 3,
		Packages:      hostPrograms,
	}, nil
}

// buildContainerd2 installs the programs into dir unless all are there at the version.
// It builds into a temporary GOBIN and renames each binary into place, so a test run
// that is interrupted, or another one building at the same time, never leaves a
// half-written binary that a later run would take for a built one.
func buildContainerd2(dir string) error {
	if containerd2Current(dir) {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(dir, ".build-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	var pkgs []string
	for _, p := range containerd2Programs {
		pkgs = append(pkgs, containerd2Module+"/cmd/"+p+"@"+Containerd2Version)
	}
	// -p 1: the machine's cores are shared; a cold build takes a few CPU-minutes.
	cmd := exec.Command("go", append([]string{"install", "-p", "1"}, pkgs...)...)
	// Outside the module, so the install never touches podwire's go.mod. Without cgo:
	// only the btrfs snapshotter needs it, and the config disables that.
	cmd.Dir = os.TempDir()
	cmd.Env = append(os.Environ(), "GOBIN="+tmp, "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go install %s (needs the Go module proxy; or set PODWIRE_CONTAINERD2_DIR to a directory with containerd, containerd-shim-runc-v2 and ctr %s): %w\n%s",
			strings.Join(pkgs, " "), Containerd2Version, err, out)
	}
	for _, p := range containerd2Programs {
		if err := os.Rename(filepath.Join(tmp, p), filepath.Join(dir, p)); err != nil {
			return fmt.Errorf("installing %s into %s: %w", p, dir, err)
		}
	}
	if !containerd2Current(dir) {
		return fmt.Errorf("go install left no containerd %s programs in %s", Containerd2Version, dir)
	}
	return nil
}

// containerd2Current reports whether dir holds every program built from
// containerd2Module at Containerd2Version.
func containerd2Current(dir string) bool {
	for _, p := range containerd2Programs {
		info, err := buildinfo.ReadFile(filepath.Join(dir, p))
		if err != nil || info.Main.Path != containerd2Module || info.Main.Version != Containerd2Version {
			return false
		}
	}
	return true
}
