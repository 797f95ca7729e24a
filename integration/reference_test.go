// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/podwire/podwire/integration/nstest"
)

// referenceVersion is the containernetworking/plugins release podwire is a drop-in for.
const referenceVersion = "v1.10.0"

// referencePkgs are the reference's main packages, by binary name.
var referencePkgs = map[string]string{
	"bridge":     "plugins/main/bridge",
	"host-local": "plugins/ipam/host-local",
	"loopback":   "plugins/main/loopback",
	"portmap":    "plugins/meta/portmap",
	"bandwidth":  "plugins/meta/bandwidth",
	"ptp":        "plugins/main/ptp", // not shipped by podwire: kindnet's main plugin
}

// referenceDir returns a directory holding only the named reference plugins (links
// into <repo>/.cache/reference-v1.10.0, or $PODWIRE_BENCH_CACHE/reference-v1.10.0,
// where make bench keeps the whole set). The plugins missing there are installed with
// `go install` first; when that is impossible the test reports nstest.Missing, a
// failure under CI=true, since tests proving compatibility must never quietly not run.
func referenceDir(t *testing.T, plugins ...string) string {
	t.Helper()
	root, err := nstest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, ".cache", "reference-"+referenceVersion)
	if d := os.Getenv("PODWIRE_BENCH_CACHE"); d != "" {
		dir = filepath.Join(d, "reference-"+referenceVersion)
	}
	var missing []string
	for _, p := range plugins {
		pkg, ok := referencePkgs[p]
		if !ok {
			t.Fatalf("no reference plugin %q", p)
		}
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			missing = append(missing, "github.com/containernetworking/plugins/"+pkg+"@"+referenceVersion)
		}
	}
	if len(missing) > 0 {
		cmd := exec.Command("go", append([]string{"install", "-trimpath"}, missing...)...)
		cmd.Env = append(os.Environ(), "GOBIN="+dir, "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			nstest.Missing(t, "cannot install the reference plugins %v %s (needed to prove drop-in compatibility): %v\n%s", plugins, referenceVersion, err, out)
		}
	}
	only := t.TempDir()
	for _, p := range plugins {
		if err := os.Symlink(filepath.Join(dir, p), filepath.Join(only, p)); err != nil {
			t.Fatal(err)
		}
	}
	return only
}
