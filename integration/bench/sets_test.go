// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/podwire/podwire/integration/nstest"
)

// ReferenceVersion is the containernetworking/plugins release we measure against.
const ReferenceVersion = "v1.10.0"

// pluginTypes are the binaries every set provides.
var pluginTypes = []string{"bridge", "host-local", "portmap", "bandwidth", "loopback"}

// set is one plugin suite under test.
type set struct {
	Name string
	Dir  string
	// has reports whether the set ships a plugin (ours may be partial while in progress).
	has map[string]bool
}

// Has reports whether the set ships every one of types.
func (s *set) Has(types ...string) bool { return len(s.missing(types...)) == 0 }

func (s *set) missing(types ...string) []string {
	var out []string
	for _, t := range types {
		if !s.has[t] {
			out = append(out, t)
		}
	}
	return out
}

func newSet(name, dir string) *set {
	s := &set{Name: name, Dir: dir, has: map[string]bool{}}
	for _, p := range pluginTypes {
		if fi, err := os.Stat(filepath.Join(dir, p)); err == nil && fi.Mode()&0o111 != 0 {
			s.has[p] = true
		}
	}
	return s
}

// cacheDir is where reference binaries are installed: $PODWIRE_BENCH_CACHE or
// <repo>/.cache.
func cacheDir(t testing.TB) string {
	if d := os.Getenv("PODWIRE_BENCH_CACHE"); d != "" {
		return d
	}
	root, err := nstest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, ".cache")
}

// referenceSet installs the reference plugins at ReferenceVersion from the module proxy
// (go install, into the cache; never vendored) and returns them as a set.
func referenceSet(t testing.TB) *set {
	dir := filepath.Join(cacheDir(t), "reference-"+ReferenceVersion)
	missing := false
	for _, p := range pluginTypes {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			missing = true
		}
	}
	if missing {
		var pkgs []string
		for _, p := range []string{"main/bridge", "ipam/host-local", "meta/portmap", "meta/bandwidth", "main/loopback"} {
			pkgs = append(pkgs, "github.com/containernetworking/plugins/plugins/"+p+"@"+ReferenceVersion)
		}
		cmd := exec.Command("go", append([]string{"install", "-trimpath", "-ldflags=-s -w"}, pkgs...)...)
		cmd.Env = append(os.Environ(), "GOBIN="+dir, "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("installing reference plugins %s: %v\n%s", ReferenceVersion, err, out)
		}
	}
	return newSet("reference", dir)
}

// floorSet builds the no-op plugin and links it under every plugin name, so a chain of
// the same shape measures only the runtime's own cost: one process start per plugin in
// the conflist (the floor's bridge starts no host-local). It also returns a directory holding the
// no-op as "bench-noop", which every set gets on its CNI_PATH (a first plugin that
// hands a fixed result to a chained plugin measured alone), and the rsswrap binary.
func floorSet(t testing.TB) (floor *set, helpers, rsswrap string) {
	root, err := nstest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	noop := filepath.Join(dir, "noop")
	rsswrap = filepath.Join(dir, "rsswrap")
	for bin, pkg := range map[string]string{noop: "./integration/bench/noop", rsswrap: "./integration/bench/rsswrap"} {
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, pkg)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("building %s: %v\n%s", pkg, err, out)
		}
	}
	floorDir := filepath.Join(dir, "floor")
	helpers = filepath.Join(dir, "helpers")
	for _, d := range []string{floorDir, helpers} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range pluginTypes {
		if err := os.Symlink(noop, filepath.Join(floorDir, p)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(noop, filepath.Join(helpers, "bench-noop")); err != nil {
		t.Fatal(err)
	}
	return newSet("floor", floorDir), helpers, rsswrap
}

// ourSet builds podwire's plugins the way `make build` does (stripped) and describes
// what was built. By default that is the working tree, uncommitted changes included;
// PODWIRE_BENCH_REV=<rev> builds a clean export of that git revision instead (what the
// committed BENCHMARKS.md is made from).
func ourSet(t testing.TB) (*set, string) {
	root, err := nstest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	src := root
	var desc string
	if rev := os.Getenv("PODWIRE_BENCH_REV"); rev != "" {
		sha := strings.TrimSpace(gitOut(t, root, "rev-parse", "--short=12", rev+"^{commit}"))
		src = t.TempDir()
		archive := exec.Command("sh", "-c", fmt.Sprintf("git -C %q archive %s | tar -x -C %q", root, sha, src))
		if out, err := archive.CombinedOutput(); err != nil {
			t.Fatalf("exporting %s: %v\n%s", rev, err, out)
		}
		desc = fmt.Sprintf("commit %s, a clean `git archive` export built with `make build`", sha)
		cmd := exec.Command("make", "-s", "build", "BIN_DIR="+dir, "VERSION="+sha)
		cmd.Dir = src
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("make build of %s: %v\n%s", sha, err, out)
		}
		return newSet("podwire", dir), desc
	}
	sha := strings.TrimSpace(gitOut(t, root, "rev-parse", "--short=12", "HEAD"))
	desc = "the working tree at commit " + sha + ", built with `make build`"
	if dirty := strings.TrimSpace(gitOut(t, root, "status", "--porcelain", "--", "plugins", "pkg")); dirty != "" {
		desc += fmt.Sprintf(" with %d uncommitted file(s) under plugins/ and pkg/", len(strings.Split(dirty, "\n")))
	}
	cmd := exec.Command("make", "-s", "build", "BIN_DIR="+dir)
	cmd.Dir = src
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	return newSet("podwire", dir), desc
}

func gitOut(t testing.TB, dir string, args ...string) string {
	out, err := exec.Command("git", append([]string{"-C", dir}, args...)...).Output()
	if err != nil {
		t.Fatalf("git %s: %v", strings.Join(args, " "), err)
	}
	return string(out)
}

func ctxBG() context.Context { return context.Background() }

func must(t testing.TB, err error, what string, a ...any) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", fmt.Sprintf(what, a...), err)
	}
}
