package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/containernetworking/cni/libcni"

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

func (s *set) Has(types ...string) bool {
	for _, t := range types {
		if !s.has[t] {
			return false
		}
	}
	return true
}

// CNI returns a libcni client using this set's binaries and a private cache dir.
func (s *set) CNI(t testing.TB) *libcni.CNIConfig {
	return libcni.NewCNIConfigWithCacheDir([]string{s.Dir}, t.TempDir(), nil)
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
// the same shape measures only process starts.
func floorSet(t testing.TB) *set {
	root, err := nstest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	noop := filepath.Join(dir, "noop")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", noop, "./integration/bench/noop")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building noop plugin: %v\n%s", err, out)
	}
	for _, p := range pluginTypes {
		if err := os.Symlink(noop, filepath.Join(dir, p)); err != nil {
			t.Fatal(err)
		}
	}
	return newSet("floor", dir)
}

// ourSet builds podwire's plugins the way `make build` does (stripped).
func ourSet(t testing.TB) *set {
	root, err := nstest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cmd := exec.Command("make", "-s", "build", "BIN_DIR="+dir)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	return newSet("podwire", dir)
}

func ctxBG() context.Context { return context.Background() }

func must(t testing.TB, err error, what string, a ...any) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", fmt.Sprintf(what, a...), err)
	}
}
