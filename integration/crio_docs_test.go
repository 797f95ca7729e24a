// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/podwire/podwire/integration/crio"
	"github.com/podwire/podwire/integration/nstest"
	"github.com/podwire/podwire/pkg/agent/cri"
)

// TestCRIODocsCommands keeps docs/crio.md's commands the ones the CRI-O tests run: the
// node's localhost prerequisites, the build tags and version, the pod's pid namespace,
// critest's flags and the agent's socket flag.
func TestCRIODocsCommands(t *testing.T) {
	repo, err := nstest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(repo, "docs", "crio.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := strings.Join(strings.Fields(string(b)), " ")
	want := []string{crio.Module + "@" + crio.Version, `-tags "` + crio.BuildTags + `"`, "make -C pinns",
		"sigs.k8s.io/cri-tools@" + crio.CritestVersion, "-ginkgo.focus=Networking", "-test-images-file=",
		`"namespace_options": {"pid": 1}`, "--cri-socket=" + cri.DefaultSockets, "containers-storage:[overlay@"}
	for _, args := range crioLocalhostPrereqs {
		want = append(want, strings.Join(args, " "))
	}
	for _, w := range want {
		if !strings.Contains(doc, w) {
			t.Errorf("docs/crio.md does not show %q, which the CRI-O tests run", w)
		}
	}
}
