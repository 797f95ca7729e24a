package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"

	"github.com/podwire/podwire/integration/nstest"
)

// TestDistTarball builds the release tarball with `make dist`, unpacks it into an
// empty directory and runs the plugins from there through libcni, as an install script
// followed by a runtime would.
func TestDistTarball(t *testing.T) {
	nstest.RequireRoot(t)
	root, err := nstest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	cmd := exec.Command("make", "-s", "dist", "DIST_DIR="+out, "VERSION=v0.0.0-test")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make dist: %v\n%s", err, b)
	}
	tgz := filepath.Join(out, "podwire-v0.0.0-test-linux-amd64.tgz")
	if _, err := os.Stat(tgz); err != nil {
		t.Fatalf("tarball not produced: %v", err)
	}
	dir := t.TempDir()
	if b, err := exec.Command("tar", "-C", dir, "-xzf", tgz).CombinedOutput(); err != nil {
		t.Fatalf("unpacking: %v\n%s", err, b)
	}
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
		if e.IsDir() {
			t.Errorf("tarball has directory %s; plugins must sit at the top level", e.Name())
		}
	}
	t.Logf("tarball contents: %s", strings.Join(names, " "))
	for _, want := range []string{"loopback", "LICENSE", "README.md"} {
		if _, err := os.Stat(filepath.Join(dir, want)); err != nil {
			t.Errorf("tarball lacks %s", want)
		}
	}
	// Every plugin in the tarball answers VERSION with the version stamped at build.
	for _, n := range names {
		if n == "LICENSE" || n == "README.md" {
			continue
		}
		c := exec.Command(filepath.Join(dir, n))
		c.Env = []string{"CNI_COMMAND=VERSION"}
		b, err := c.Output()
		if err != nil || !strings.Contains(string(b), `"1.1.0"`) {
			t.Errorf("%s VERSION: %v %s", n, err, b)
		}
		c = exec.Command(filepath.Join(dir, n))
		var stderr strings.Builder
		c.Stderr = &stderr
		_ = c.Run()
		if !strings.Contains(stderr.String(), "v0.0.0-test") {
			t.Errorf("%s does not report the build version; stderr %q", n, stderr.String())
		}
	}

	h := nstest.New(t)
	pod := h.NewPod()
	c := libcni.NewCNIConfigWithCacheDir([]string{dir}, t.TempDir(), nil)
	list := h.Conflist(loopbackConf)
	rt := h.RT(pod, "lo")
	err = h.InHost(func() error {
		if _, err := c.AddNetworkList(context.Background(), list, rt); err != nil {
			return err
		}
		return c.DelNetworkList(context.Background(), list, rt)
	})
	if err != nil {
		t.Fatalf("loopback from the unpacked tarball: %v", err)
	}
	t.Log("loopback from the unpacked tarball: ADD and DEL through libcni work")
}
