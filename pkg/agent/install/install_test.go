// SPDX-License-Identifier: Apache-2.0

package install

import (
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"testing"
)

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o755); err != nil {
		t.Fatal(err)
	}
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		return "<" + err.Error() + ">"
	}
	return string(b)
}

func actions(rs []Result) map[string]Action {
	m := map[string]Action{}
	for _, r := range rs {
		m[filepath.Base(r.Path)] = r.Action
	}
	return m
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	sort.Strings(out)
	return out
}

func TestInstallUpgradeUninstall(t *testing.T) {
	root := t.TempDir()
	src, bin, conf, state := filepath.Join(root, "src"), filepath.Join(root, "bin"), filepath.Join(root, "net.d"), filepath.Join(root, "state")
	write(t, filepath.Join(src, "bridge"), "bridge v1")
	write(t, filepath.Join(src, "host-local"), "host-local v1")
	write(t, filepath.Join(src, "portmap"), "portmap v1")
	write(t, filepath.Join(bin, "portmap"), "someone else's portmap") // foreign
	write(t, filepath.Join(bin, "flannel"), "flannel")                // not shipped

	in, err := New(state, false)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := in.Binaries(src, bin)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]Action{"bridge": Installed, "host-local": Installed, "portmap": Foreign}
	if got := actions(rs); !equal(got, want) {
		t.Errorf("first install: %v, want %v", got, want)
	}
	if read(t, filepath.Join(bin, "portmap")) != "someone else's portmap" {
		t.Error("foreign portmap was replaced")
	}
	if fi, _ := os.Stat(filepath.Join(bin, "bridge")); fi.Mode().Perm() != 0o755 {
		t.Errorf("bridge mode %v", fi.Mode())
	}
	if _, err := in.Conflist(filepath.Join(conf, "10-podwire.conflist"), []byte("{}\n")); err != nil {
		t.Fatal(err)
	}
	// No temporary files left behind.
	if got := dirNames(t, bin); len(got) != 4 {
		t.Errorf("bin dir holds %v", got)
	}

	// A second agent run (restart) reads the manifest: nothing changes.
	in, _ = New(state, false)
	rs, _ = in.Binaries(src, bin)
	if got := actions(rs); got["bridge"] != Unchanged || got["host-local"] != Unchanged {
		t.Errorf("restart: %v", got)
	}
	// Upgrade: new bridge shipped; our old one is replaced.
	write(t, filepath.Join(src, "bridge"), "bridge v2")
	// Someone replaced our host-local: no longer ours, left alone.
	write(t, filepath.Join(bin, "host-local"), "distro host-local")
	rs, _ = in.Binaries(src, bin)
	want = map[string]Action{"bridge": Installed, "host-local": Foreign, "portmap": Foreign}
	if got := actions(rs); !equal(got, want) {
		t.Errorf("upgrade: %v, want %v", got, want)
	}
	if read(t, filepath.Join(bin, "bridge")) != "bridge v2" {
		t.Error("bridge not upgraded")
	}

	// --replace-foreign takes portmap over, backing up the original.
	in, _ = New(state, true)
	rs, _ = in.Binaries(src, bin)
	if got := actions(rs); got["portmap"] != Replaced || got["host-local"] != Replaced {
		t.Errorf("replace-foreign: %v", got)
	}
	if read(t, filepath.Join(bin, "portmap")) != "portmap v1" {
		t.Error("portmap not replaced")
	}

	// Uninstall: our bridge and conflist go, portmap's and host-local's originals come
	// back, flannel stays, the manifest goes.
	in, _ = New(state, false)
	rs, err = in.Uninstall()
	if err != nil {
		t.Fatal(err)
	}
	want = map[string]Action{"bridge": Removed, "portmap": Restored, "host-local": Restored, "10-podwire.conflist": Removed}
	if got := actions(rs); !equal(got, want) {
		t.Errorf("uninstall: %v, want %v", got, want)
	}
	if got := dirNames(t, bin); !equalS(got, []string{"flannel", "host-local", "portmap"}) {
		t.Errorf("bin dir after uninstall: %v", got)
	}
	if read(t, filepath.Join(bin, "portmap")) != "someone else's portmap" || read(t, filepath.Join(bin, "host-local")) != "distro host-local" {
		t.Error("foreign files not as before")
	}
	if got := dirNames(t, conf); len(got) != 0 {
		t.Errorf("conf dir after uninstall: %v", got)
	}
	if got := dirNames(t, state); len(got) != 0 {
		t.Errorf("state dir after uninstall: %v", got)
	}
}

func TestUninstallKeepsEditedFiles(t *testing.T) {
	root := t.TempDir()
	conf := filepath.Join(root, "10-podwire.conflist")
	in, _ := New(filepath.Join(root, "state"), false)
	if _, err := in.Conflist(conf, []byte("ours")); err != nil {
		t.Fatal(err)
	}
	write(t, conf, "edited by the operator")
	rs, err := in.Uninstall()
	if err != nil {
		t.Fatal(err)
	}
	if got := actions(rs); got["10-podwire.conflist"] != Kept || read(t, conf) != "edited by the operator" {
		t.Errorf("uninstall of an edited conflist: %v, content %q", got, read(t, conf))
	}
}

func TestCorruptManifest(t *testing.T) {
	state := t.TempDir()
	write(t, filepath.Join(state, manifestName), "{nope")
	if _, err := New(state, false); err == nil {
		t.Fatal("a corrupt manifest was accepted")
	}
}

func equal(a, b map[string]Action) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func equalS(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestKilledInstallCompletes is what an agent SIGKILLed mid-install leaves (a partial
// temporary file, one plugin renamed into place, one still the old version, one never
// written) and the next start: every plugin current, no temporary file left.
func TestKilledInstallCompletes(t *testing.T) {
	root := t.TempDir()
	src, bin, state := filepath.Join(root, "src"), filepath.Join(root, "bin"), filepath.Join(root, "state")
	for _, p := range []string{"bridge", "host-local", "portmap"} {
		write(t, filepath.Join(src, p), p+" v1")
	}
	in, err := New(state, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := in.Binaries(src, bin); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"bridge", "host-local", "portmap"} {
		write(t, filepath.Join(src, p), p+" v2")
	}
	// The killed v2 install: bridge renamed into place (the manifest not saved yet),
	// host-local half-copied into its temporary file, portmap removed by someone.
	write(t, filepath.Join(bin, "bridge"), "bridge v2")
	write(t, filepath.Join(bin, ".host-local.podwire-0123456789ab"), "host-lo")
	write(t, filepath.Join(state, ".manifest.json.podwire-ba9876543210"), "{")
	write(t, filepath.Join(bin, ".other.podwire-tmp"), "not ours") // not our pattern: kept
	if err := os.Remove(filepath.Join(bin, "portmap")); err != nil {
		t.Fatal(err)
	}

	in, err = New(state, false)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := in.Binaries(src, bin)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]Action{"bridge": Unchanged, "host-local": Installed, "portmap": Installed,
		".host-local.podwire-0123456789ab": Swept, ".manifest.json.podwire-ba9876543210": Swept}
	if got := actions(rs); !reflect.DeepEqual(got, want) {
		t.Errorf("actions: got %v, want %v", got, want)
	}
	for _, p := range []string{"bridge", "host-local", "portmap"} {
		if got := read(t, filepath.Join(bin, p)); got != p+" v2" {
			t.Errorf("%s: got %q, want %q", p, got, p+" v2")
		}
	}
	if got := dirNames(t, bin); !reflect.DeepEqual(got, []string{".other.podwire-tmp", "bridge", "host-local", "portmap"}) {
		t.Errorf("bin dir after the next start: %v", got)
	}
	if got := dirNames(t, state); !reflect.DeepEqual(got, []string{"manifest.json"}) {
		t.Errorf("state dir after the next start: %v", got)
	}
	// The sweep is once per start: a second call finds nothing to do.
	rs, err = in.Binaries(src, bin)
	if err != nil || len(rs) != 3 {
		t.Errorf("second Binaries: %v %v", rs, err)
	}
}

func TestIsTemp(t *testing.T) {
	for name, want := range map[string]bool{
		".bridge.podwire-0123456789ab": true, ".10-podwire.conflist.podwire-abcdefabcdef": true,
		"bridge": false, ".bridge.podwire-0123": false, "bridge.podwire-0123456789ab": false,
		".bridge.podwire-0123456789xy": false, ".podwire-0123456789ab": false,
	} {
		if got := isTemp(name); got != want {
			t.Errorf("isTemp(%q) = %v, want %v", name, got, want)
		}
	}
}
