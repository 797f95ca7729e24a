// SPDX-License-Identifier: Apache-2.0

package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestVersionScript runs .ci/version in a scratch repository through a release's life:
// before the tag, at the tag, commits after it, a modified tree, outside git, and a
// VERSION that is not a semver.
func TestVersionScript(t *testing.T) {
	script := mustRead(t, "../../.ci/version")
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, ".ci"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ".ci/version"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	env := append(os.Environ(), "GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=safe.directory", "GIT_CONFIG_VALUE_0=*",
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com")
	git := func(args ...string) string {
		cmd := exec.Command("git", args...)
		cmd.Dir, cmd.Env = dir, env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	version := func() (string, error) {
		cmd := exec.Command("bash", filepath.Join(dir, ".ci/version"))
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	expect := func(what, want string) {
		t.Helper()
		got, err := version()
		if err != nil || got != want {
			t.Errorf("%s: version %q (%v), want %q", what, got, err, want)
		}
	}

	write("VERSION", "0.1.0\n")
	expect("outside git", "0.1.0")
	git("init", "-q")
	git("add", ".")
	git("commit", "-q", "-m", "one")
	h := git("rev-parse", "--short=12", "HEAD")
	expect("before the tag exists", "0.1.0-g"+h)
	git("tag", "v0.1.0")
	expect("at the tag", "0.1.0")
	write("x", "x")
	git("add", "x")
	git("commit", "-q", "-m", "two")
	git("commit", "-q", "--allow-empty", "-m", "three")
	h = git("rev-parse", "--short=12", "HEAD")
	expect("two commits after the tag", "0.1.0-2-g"+h)
	write("x", "changed")
	expect("modified tree", "0.1.0-2-g"+h+"-dirty")
	git("checkout", "-q", "x")

	semver := regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$`)
	for _, v := range []string{"0.1.0", "0.1.0-2-g" + h, "0.1.0-2-g" + h + "-dirty"} {
		if !semver.MatchString(v) {
			t.Errorf("%q is not a semver", v)
		}
	}

	write("VERSION", "v0.2\n")
	if got, err := version(); err == nil || !strings.Contains(got, "not a semver") {
		t.Errorf("VERSION v0.2: %q (%v), want a refusal naming the VERSION file", got, err)
	}
}
