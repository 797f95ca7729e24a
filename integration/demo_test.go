package integration

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/podwire/podwire/integration/nstest"
)

// TestDemo runs `make demo`'s program end to end and requires it to exit 0 with every
// step reported, so the main job cannot silently break.
func TestDemo(t *testing.T) {
	nstest.RequireRoot(t)
	root, err := nstest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "run", "./integration/demo")
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("demo failed: %v\n%s", err, out)
	}
	for _, want := range []string{
		"[7/7]", "pod-a -> pod-b", "from outside client", "via 127.0.0.1",
		"every 1-second interval within 10 Mbit/s", "equals the snapshot before the pods", "✓ demo finished",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out)
		}
	}
}
