// SPDX-License-Identifier: Apache-2.0

package main

import (
	"go/build"
	"go/format"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// TestSPDXScript runs .ci/spdx on a scratch git repository: --check lists exactly the
// tracked Go files and shell scripts without a header and exits 1; --fix adds the
// header without changing what Go sees (package documentation, build constraints,
// gofmt) or how a script starts; then --check passes and a second --fix changes nothing.
func TestSPDXScript(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Fatalf("git is needed: %v", err)
	}
	script, err := filepath.Abs("../../.ci/spdx")
	if err != nil {
		t.Fatal(err)
	}
	lic, err := os.ReadFile("../../LICENSE")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	files := map[string]string{
		"LICENSE": string(lic),
		// Without its own header, so --fix rewrites the running script too.
		".ci/spdx":                  strings.Replace(mustRead(t, script), "# SPDX-License-Identifier: Apache-2.0\n", "", 1),
		"pkg/a/doc.go":              "// Package a does things.\npackage a\n",
		"pkg/a/ignored.go":          "//go:build ignore\n\npackage a\n",
		"pkg/a/has.go":              "// SPDX-License-Identifier: Apache-2.0\n\npackage a\n",
		"pkg/a/testdata/fixture.go": "package fixture\n",
		"scripts/run":               "#!/usr/bin/env bash\necho run\n",
		"scripts/lib.sh":            "echo lib\n",
		"scripts/data.txt":          "#!not a shell\n",
		"untracked.go":              "package untracked\n",
	}
	for name, text := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		mode := os.FileMode(0o644)
		if name == ".ci/spdx" || name == "scripts/run" {
			mode = 0o755
		}
		if err := os.WriteFile(p, []byte(text), mode); err != nil {
			t.Fatal(err)
		}
	}
	git := func(args ...string) {
		cmd := exec.Command("git", append([]string{"-c", "safe.directory=*"}, args...)...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	git("init", "-q")
	for name := range files {
		if name != "untracked.go" {
			git("add", name)
		}
	}
	run := func(arg string) (string, int) {
		cmd := exec.Command(filepath.Join(dir, ".ci/spdx"), arg)
		cmd.Env = append(os.Environ(), "GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=safe.directory", "GIT_CONFIG_VALUE_0=*")
		out, err := cmd.Output()
		if ee, ok := err.(*exec.ExitError); ok {
			return string(out), ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return string(out), 0
	}

	out, rc := run("--check")
	listed := strings.Fields(out)
	sort.Strings(listed)
	if want := ".ci/spdx pkg/a/doc.go pkg/a/ignored.go scripts/lib.sh scripts/run"; rc != 1 || strings.Join(listed, " ") != want {
		t.Fatalf("--check: exit %d, listed %v; want exit 1 and %s", rc, listed, want)
	}
	if _, rc := run("--fix"); rc != 0 {
		t.Fatalf("--fix exit %d", rc)
	}
	if out, rc := run("--check"); rc != 0 || out != "" {
		t.Fatalf("--check after --fix: exit %d, %q", rc, out)
	}
	before := snapshot(t, dir)
	if _, rc := run("--fix"); rc != 0 || snapshot(t, dir) != before {
		t.Fatal("a second --fix changed files")
	}

	const h = "// SPDX-License-Identifier: Apache-2.0\n\n"
	for name, orig := range map[string]string{"pkg/a/doc.go": files["pkg/a/doc.go"], "pkg/a/ignored.go": files["pkg/a/ignored.go"]} {
		got := mustRead(t, filepath.Join(dir, name))
		if got != h+orig {
			t.Errorf("%s after --fix:\n%s", name, got)
		}
		if f, err := format.Source([]byte(got)); err != nil || string(f) != got {
			t.Errorf("%s is not gofmt-clean after --fix: %v", name, err)
		}
	}
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(dir, "pkg/a/doc.go"), nil, parser.ParseComments)
	if err != nil || f.Doc == nil || f.Doc.Text() != "Package a does things.\n" {
		t.Errorf("package documentation changed by the header: %v %v", err, f.Doc)
	}
	if ok, err := build.Default.MatchFile(filepath.Join(dir, "pkg/a"), "ignored.go"); err != nil || ok {
		t.Errorf("//go:build ignore no longer applies after the header (match %v, %v)", ok, err)
	}
	if got := mustRead(t, filepath.Join(dir, "scripts/run")); got != "#!/usr/bin/env bash\n# SPDX-License-Identifier: Apache-2.0\necho run\n" {
		t.Errorf("scripts/run after --fix: %q", got)
	}
	if fi, _ := os.Stat(filepath.Join(dir, "scripts/run")); fi.Mode().Perm() != 0o755 {
		t.Errorf("scripts/run lost its mode: %v", fi.Mode())
	}
	if got := mustRead(t, filepath.Join(dir, "scripts/lib.sh")); got != "# SPDX-License-Identifier: Apache-2.0\necho lib\n" {
		t.Errorf("scripts/lib.sh after --fix: %q", got)
	}
	for _, name := range []string{"pkg/a/testdata/fixture.go", "scripts/data.txt", "untracked.go", "pkg/a/has.go"} {
		if mustRead(t, filepath.Join(dir, name)) != files[name] {
			t.Errorf("%s was changed; it must be left alone", name)
		}
	}
}

func mustRead(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func snapshot(t *testing.T, dir string) string {
	var b strings.Builder
	_ = filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() && !strings.Contains(p, "/.git/") {
			b.WriteString(p + "\n" + mustRead(t, p))
		}
		return nil
	})
	return b.String()
}
