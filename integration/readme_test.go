// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/podwire/podwire/integration/nstest"
)

// readmeMaxLines is issue 28's bound on README.md: the user's page; the rest is in docs/.
const readmeMaxLines = 300

// readmeCommands are the only commands README.md's sh blocks may show, each with the
// test that runs it, the test's file, and a string that file must contain where the
// test runs the command (so an entry cannot outlive what its test does). A test may run
// a command with other paths (a temporary DESTDIR, bin dir or tarball directory) or
// with flags pointing it at the test's own node; the command itself is the same.
var readmeCommands = []struct {
	re, test, file, witness string
}{
	{`^make demo$`, "TestDemo", "demo_test.go", `"go", "run", "./integration/demo"`},
	{`^make install$`, "TestMakeInstall", "readme_test.go", `"make", "-s", "install"`},
	{`^make install DESTDIR=\S+$`, "TestMakeInstall", "readme_test.go", `"DESTDIR="`},
	{`^make dist$`, "TestDistReproducible", "dist_test.go", `"make -s dist DIST_DIR="`},
	{`^sha256sum -c podwire-\S+-linux-amd64\.tgz\.sha256$`, "TestDistReproducible", "dist_test.go", `exec.Command(sum, "-c"`},
	{`^tar -C /opt/cni/bin -xzf podwire-\S+-linux-amd64\.tgz$`, "TestDistTarball", "dist_test.go", `"tar", "-C", dir, "-xzf"`},
	{`^CNI_COMMAND=VERSION /opt/cni/bin/bridge </dev/null$`, "TestDistTarball", "dist_test.go", `"CNI_COMMAND=VERSION"`},
	{`^podwire doctor$`, "TestPodwireDoctor", "podwire_doctor_test.go", `"doctor"`},
	{`^podwire validate /\S+$`, "TestPodwireValidate", "podwire_validate_test.go", `"validate"`},
	{`^podwire inspect$`, "TestPodwireInspectAndGC", "podwire_cli_test.go", `[]string{"inspect"}`},
	{`^podwire inspect --json$`, "TestPodwireInspectAndGC", "podwire_cli_test.go", `[]string{"inspect", "--json"}`},
	{`^podwire gc --dry-run --cri /\S+\.sock$`, "TestPodwireCRI", "podwire_cri_test.go", `"gc", "--dry-run", "--json", "--cri"`},
}

// TestREADMECommands keeps README.md a page whose every command a test runs: each
// command in its sh blocks must match readmeCommands, whose tests must exist and still
// run the command; `make` targets must exist in the Makefile. It also bounds the
// README's length.
func TestREADMECommands(t *testing.T) {
	repo, err := nstest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(repo, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n > readmeMaxLines {
		t.Errorf("README.md has %d lines, more than %d: move detail into docs/", n, readmeMaxLines)
	}
	cmds := shCommands(string(b))
	if len(cmds) == 0 {
		t.Fatal("README.md has no commands in sh blocks; the parser or the README is broken")
	}
	makefile, err := os.ReadFile(filepath.Join(repo, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	used := map[int]bool{}
	for _, c := range cmds {
		i := matchReadmeCommand(c)
		if i < 0 {
			t.Errorf("README.md shows %q, which no test is listed as running: add it to readmeCommands with the test that runs it, or leave it out of README.md", c)
			continue
		}
		used[i] = true
		if f := strings.Fields(c); f[0] == "make" && !regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(f[1])+`:`).Match(makefile) {
			t.Errorf("README.md shows %q, but the Makefile has no target %s", c, f[1])
		}
	}
	for i, e := range readmeCommands {
		src, err := os.ReadFile(filepath.Join(repo, "integration", e.file))
		if err != nil {
			t.Errorf("readmeCommands[%d] (%s): %v", i, e.re, err)
			continue
		}
		if !strings.Contains(string(src), "func "+e.test+"(t *testing.T)") {
			t.Errorf("readmeCommands[%d]: integration/%s has no %s, which is listed as running %s", i, e.file, e.test, e.re)
		}
		if !strings.Contains(string(src), e.witness) {
			t.Errorf("readmeCommands[%d]: integration/%s no longer contains %s: does %s still run %s?", i, e.file, e.witness, e.test, e.re)
		}
		if !used[i] {
			t.Logf("readmeCommands[%d] (%s) matches no command in README.md", i, e.re)
		}
	}
	if !strings.Contains(string(makefile), "\t$(GO) run ./integration/demo\n") {
		t.Error("make demo no longer runs go run ./integration/demo, which TestDemo runs")
	}
}

// shCommands returns the commands in text's ```sh blocks: one per line and per `&&`,
// without comments.
func shCommands(text string) []string {
	var cmds []string
	in := false
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case !in && line == "```sh":
			in = true
			continue
		case in && strings.HasPrefix(line, "```"):
			in = false
			continue
		case !in:
			continue
		}
		if i := strings.Index(line, " #"); i >= 0 {
			line = line[:i]
		}
		if strings.HasPrefix(line, "#") {
			continue
		}
		for _, c := range strings.Split(line, "&&") {
			if c = strings.Join(strings.Fields(c), " "); c != "" {
				cmds = append(cmds, c)
			}
		}
	}
	return cmds
}

// matchReadmeCommand is the index in readmeCommands of the entry c matches, or -1.
func matchReadmeCommand(c string) int {
	for i, e := range readmeCommands {
		if regexp.MustCompile(e.re).MatchString(c) {
			return i
		}
	}
	return -1
}

// TestREADMECommandsParser checks the parser and the matcher the README check rests on:
// a command it does not know fails, comments and && chains are split as a shell would.
func TestREADMECommandsParser(t *testing.T) {
	text := "x\n```sh\nmake demo   # two pods\n# a comment\ncd dist && podwire doctor\n```\n```json\n{\"a\": 1}\n```\n"
	got := shCommands(text)
	want := []string{"make demo", "cd dist", "podwire doctor"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("shCommands = %q, want %q", got, want)
	}
	for c, known := range map[string]bool{"make demo": true, "podwire doctor": true, "cd dist": false,
		"rm -rf /opt/cni/bin": false, "make demo FOO=1": false, "podwire gc --cri /run/containerd/containerd.sock": false} {
		if (matchReadmeCommand(c) >= 0) != known {
			t.Errorf("matchReadmeCommand(%q) known = %v, want %v", c, !known, known)
		}
	}
}

// TestMakeInstall runs README.md's `make install DESTDIR=...` into a temporary root (and
// bin dir): the five plugins, and only they, land in DESTDIR/opt/cni/bin as 0755 files
// that answer CNI_COMMAND=VERSION, and `make build` put the podwire CLI in the bin dir.
func TestMakeInstall(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		nstest.Missing(t, "make install needs make (.ci/run installs it): %v", err)
	}
	repo, err := nstest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	root, bin := t.TempDir(), t.TempDir()
	cmd := exec.Command("make", "-s", "install", "DESTDIR="+root, "BIN_DIR="+bin, "VERSION=v0.0.0-readme")
	cmd.Dir = repo
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make install: %v\n%s", err, out)
	}
	dir := filepath.Join(root, "opt", "cni", "bin")
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != 0o755 {
			t.Errorf("%s is %v, want -rwxr-xr-x", e.Name(), fi.Mode())
		}
		checkPluginVersion(t, []string{filepath.Join(dir, e.Name())}, "v0.0.0-readme")
	}
	if got, want := strings.Join(names, " "), "bandwidth bridge host-local loopback portmap"; got != want {
		t.Errorf("make install put %q into %s, want %q", got, dir, want)
	}
	if _, err := os.Stat(filepath.Join(bin, "podwire")); err != nil {
		t.Errorf("make install (through make build) did not build the podwire CLI: %v", err)
	}
}
