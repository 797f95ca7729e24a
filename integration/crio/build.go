// SPDX-License-Identifier: Apache-2.0

// Package crio runs a private CRI-O for podwire's end-to-end tests: built from the Go
// module proxy (no Debian release ships it), with its own config, storage, runroot,
// socket and netns directory under the test's directory, inside a network namespace
// the test owns, calling the freshly built plugins. Debian's conmon and runc run its
// pods; images go into its containers/storage with skopeo, because no registry is
// reachable from the test machines.
package crio

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// The CRI-O release the tests build and run. v1.34.0 is the newest release the Go
// module proxy serves whose go.mod has no replace directive, so it builds from its
// module zip with plain `go build`.
const (
	Module  = "github.com/cri-o/cri-o"
	Version = "v1.34.0"
	// BuildTags leave out what needs C libraries the test machines lack (gpgme,
	// ostree, btrfs, devicemapper), as CRI-O's own static builds do.
	BuildTags = "containers_image_openpgp containers_image_ostree_stub exclude_graphdriver_btrfs exclude_graphdriver_devicemapper"
)

// Binaries are a built CRI-O and the pinns helper it pins pod namespaces with.
type Binaries struct {
	Dir   string
	Crio  string
	Pinns string
}

// stampName is written last into the cache directory: its content names the module,
// version and tags the binaries were built from, so a half-finished build, or one at
// another version, is never taken for current.
const stampName = "BUILT"

func stamp() string { return Module + "@" + Version + " tags=" + BuildTags + "\n" }

// EnsureCRIO returns CRI-O Version and its pinns, built once from the Go module proxy
// into <repo>/.cache/crio/<version>/ (git-ignored) and reused while the stamp there
// matches. PODWIRE_CRIO_DIR, when set, names a directory with crio and pinns to use
// as they are. The cold build is about 7 CPU-minutes (crio) plus a second (pinns:
// plain C, static, needs gcc and libc6-dev).
func EnsureCRIO(repo string) (Binaries, error) {
	if dir := os.Getenv("PODWIRE_CRIO_DIR"); dir != "" {
		b := binaries(dir)
		for _, p := range []string{b.Crio, b.Pinns} {
			if fi, err := os.Stat(p); err != nil || fi.Mode()&0o111 == 0 {
				return Binaries{}, fmt.Errorf("PODWIRE_CRIO_DIR=%s has no executable %s: put CRI-O %s's crio and pinns there, or unset it to build them", dir, filepath.Base(p), Version)
			}
		}
		return b, nil
	}
	dir := filepath.Join(repo, ".cache", "crio", Version)
	if current(dir) {
		return binaries(dir), nil
	}
	if err := build(dir); err != nil {
		return Binaries{}, err
	}
	return binaries(dir), nil
}

func binaries(dir string) Binaries {
	return Binaries{Dir: dir, Crio: filepath.Join(dir, "crio"), Pinns: filepath.Join(dir, "pinns")}
}

func current(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, stampName))
	if err != nil || string(b) != stamp() {
		return false
	}
	for _, p := range []string{"crio", "pinns"} {
		if fi, err := os.Stat(filepath.Join(dir, p)); err != nil || fi.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// moduleDir downloads mod@version into the module cache and returns its directory.
func moduleDir(mod, version string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", mod+"@"+version)
	cmd.Dir = os.TempDir() // outside podwire's module: never touches its go.mod
	out, err := cmd.Output()
	var info struct{ Dir, Error string }
	if jerr := json.Unmarshal(out, &info); jerr != nil || info.Dir == "" {
		return "", fmt.Errorf("go mod download %s@%s (needs the Go module proxy): %v %s %s", mod, version, err, info.Error, out)
	}
	return info.Dir, nil
}

// build compiles crio and pinns from a writable copy of the module (the module cache
// is read-only and pinns' Makefile writes beside its sources), into a temporary
// directory inside dir, then renames them into place and writes the stamp. `go
// install mod@version` cannot be used: it asks the proxy for the module's version
// list (for deprecation notices), which the proxy refuses for cri-o.
func build(dir string) error {
	src, err := moduleDir(Module, Version)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(dir, ".build-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	work := filepath.Join(tmp, "src")
	if err := copyTree(src, work); err != nil {
		return fmt.Errorf("copying %s: %w", src, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Minute)
	defer cancel()
	// -p 2: the machine's cores are shared; the cold build is about 7 CPU-minutes.
	gob := exec.CommandContext(ctx, "go", "build", "-p", "2", "-trimpath", "-tags", BuildTags, "-o", filepath.Join(tmp, "crio"), "./cmd/crio")
	gob.Dir = work
	gob.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false", "GOWORK=off")
	if out, err := gob.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s@%s ./cmd/crio (needs the Go module proxy; or set PODWIRE_CRIO_DIR to a directory with crio and pinns): %w\n%s", Module, Version, err, out)
	}
	mk := exec.CommandContext(ctx, "make", "-C", filepath.Join(work, "pinns"))
	if out, err := mk.CombinedOutput(); err != nil {
		return fmt.Errorf("make -C pinns of %s@%s (needs gcc and libc6-dev: apt-get install gcc libc6-dev): %w\n%s", Module, Version, err, out)
	}
	if err := os.Rename(filepath.Join(work, "bin", "pinns"), filepath.Join(tmp, "pinns")); err != nil {
		return err
	}
	for _, p := range []string{"crio", "pinns"} {
		if err := os.Rename(filepath.Join(tmp, p), filepath.Join(dir, p)); err != nil {
			return fmt.Errorf("installing %s into %s: %w", p, dir, err)
		}
	}
	st := filepath.Join(tmp, stampName)
	if err := os.WriteFile(st, []byte(stamp()), 0o644); err != nil {
		return err
	}
	return os.Rename(st, filepath.Join(dir, stampName))
}

// copyTree copies the regular files and directories below src to dst, writable.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		target := filepath.Join(dst, rel)
		if e.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if !e.Type().IsRegular() {
			return nil
		}
		fi, err := e.Info()
		if err != nil {
			return err
		}
		in, err := os.Open(path)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, fi.Mode().Perm()|0o200)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	})
}

// critest is cri-tools' validation suite: a Ginkgo test package (cmd/critest has only
// a _test.go file), so it is built with `go test -c`, from the module's own directory
// (its go.mod has no replace directive).
const (
	criToolsModule  = "sigs.k8s.io/cri-tools"
	CritestVersion  = "v1.37.0"
	critestStampFmt = "%s@%s critest\n"
)

// EnsureCritest returns the path of critest CritestVersion. PODWIRE_CRITEST, when set,
// names a critest to use as is. Otherwise it is built once into <repo>/.cache/bin
// (beside crictl) and reused while its stamp matches.
func EnsureCritest(repo string) (string, error) {
	if p := os.Getenv("PODWIRE_CRITEST"); p != "" {
		return p, nil
	}
	dir := filepath.Join(repo, ".cache", "bin")
	bin := filepath.Join(dir, "critest")
	want := fmt.Sprintf(critestStampFmt, criToolsModule, CritestVersion)
	if b, err := os.ReadFile(bin + ".built"); err == nil && string(b) == want {
		if _, err := os.Stat(bin); err == nil {
			return bin, nil
		}
	}
	src, err := moduleDir(criToolsModule, CritestVersion)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(dir, ".critest-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	// -vet=off: go test -c vets by default, which is most of the time and checks nothing of ours.
	cmd := exec.CommandContext(ctx, "go", "test", "-c", "-p", "2", "-vet=off", "-trimpath", "-o", filepath.Join(tmp, "critest"), "./cmd/critest")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go test -c %s@%s/cmd/critest (needs the Go module proxy; or set PODWIRE_CRITEST to a critest binary): %w\n%s",
			criToolsModule, CritestVersion, err, strings.TrimSpace(string(out)))
	}
	if err := os.Rename(filepath.Join(tmp, "critest"), bin); err != nil {
		return "", err
	}
	if err := os.WriteFile(bin+".built", []byte(want), 0o644); err != nil {
		return "", err
	}
	return bin, nil
}
