// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"debug/buildinfo"
	"debug/elf"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"

	"github.com/podwire/podwire/integration/nstest"
)

// distArches are `make dist`'s architectures with what their ELF header must say.
var distArches = map[string]struct {
	machine elf.Machine
	class   elf.Class
	order   elf.Data
}{
	"amd64":   {elf.EM_X86_64, elf.ELFCLASS64, elf.ELFDATA2LSB},
	"arm64":   {elf.EM_AARCH64, elf.ELFCLASS64, elf.ELFDATA2LSB},
	"arm":     {elf.EM_ARM, elf.ELFCLASS32, elf.ELFDATA2LSB},
	"ppc64le": {elf.EM_PPC64, elf.ELFCLASS64, elf.ELFDATA2LSB},
	"s390x":   {elf.EM_S390, elf.ELFCLASS64, elf.ELFDATA2MSB},
	"riscv64": {elf.EM_RISCV, elf.ELFCLASS64, elf.ELFDATA2LSB},
}

var distDocs = []string{"LICENSE", "NOTICE", "README.md"}

// makeDist runs `make dist` into dir with extra make arguments; shell is a prefix run
// before make (e.g. "umask 077").
func makeDist(t *testing.T, dir, shell string, args ...string) {
	t.Helper()
	root, err := nstest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	line := "make -s dist DIST_DIR=" + dir + " " + strings.Join(args, " ")
	if shell != "" {
		line = shell + " && " + line
	}
	cmd := exec.Command("sh", "-c", line)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", line, err, b)
	}
}

// TestDistTarball builds the amd64 release tarball with `make dist`, unpacks it into an
// empty directory and runs the plugins from there through libcni, as an install script
// followed by a runtime would.
func TestDistTarball(t *testing.T) {
	nstest.RequireRoot(t)
	out := t.TempDir()
	makeDist(t, out, "", "VERSION=v0.0.0-test", "DIST_ARCHES=amd64")
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
	for _, want := range append([]string{"loopback"}, distDocs...) {
		if _, err := os.Stat(filepath.Join(dir, want)); err != nil {
			t.Errorf("tarball lacks %s", want)
		}
	}
	// Every plugin in the tarball answers VERSION with the version stamped at build.
	for _, n := range names {
		if isDoc(n) {
			continue
		}
		checkPluginVersion(t, []string{filepath.Join(dir, n)}, "v0.0.0-test")
	}

	h := nstest.New(t)
	pod := h.NewPod()
	c := libcni.NewCNIConfigWithCacheDir([]string{dir}, t.TempDir(), nil)
	list := h.Conflist(loopbackConf)
	rt := h.RT(pod, "lo")
	err := h.InHost(func() error {
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

func isDoc(name string) bool {
	for _, d := range distDocs {
		if name == d {
			return true
		}
	}
	return false
}

// checkPluginVersion runs the plugin (argv, e.g. through qemu) with CNI_COMMAND=VERSION
// and without a command: the first must print the CNI version JSON the reference's
// plugins print, the second the podwire version on stderr.
func checkPluginVersion(t *testing.T, argv []string, version string) {
	t.Helper()
	c := exec.Command(argv[0], argv[1:]...)
	c.Env = []string{"CNI_COMMAND=VERSION"}
	b, err := c.Output()
	var info struct {
		CNIVersion        string   `json:"cniVersion"`
		SupportedVersions []string `json:"supportedVersions"`
	}
	if err != nil || json.Unmarshal(b, &info) != nil || info.CNIVersion != "1.1.0" || len(info.SupportedVersions) == 0 {
		t.Errorf("%v with CNI_COMMAND=VERSION: %v %s", argv, err, b)
	}
	c = exec.Command(argv[0], argv[1:]...)
	c.Env = []string{}
	var stderr strings.Builder
	c.Stderr = &stderr
	_ = c.Run()
	if !strings.Contains(stderr.String(), "(podwire "+version+",") {
		t.Errorf("%v does not report podwire %s; stderr %q", argv, version, stderr.String())
	}
}

// TestDistReproducible runs `make dist` for every release architecture twice, the
// second time into another directory under another umask, and requires identical
// tarballs and checksum files; checks the checksum files with sha256sum -c and
// sha512sum -c, every tarball's layout, every binary's ELF header and build settings,
// and runs the arm64 plugins under qemu-user for VERSION.
func TestDistReproducible(t *testing.T) {
	nstest.RequireRoot(t)
	root, err := nstest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	vb, err := exec.Command("bash", filepath.Join(root, ".ci/version")).Output()
	if err != nil {
		t.Fatalf(".ci/version: %v", err)
	}
	version := strings.TrimSpace(string(vb))
	a, b := t.TempDir(), filepath.Join(t.TempDir(), "second")
	makeDist(t, a, "umask 022")
	makeDist(t, b, "umask 077")

	var want []string
	for arch := range distArches {
		n := "podwire-" + version + "-linux-" + arch + ".tgz"
		want = append(want, n, n+".sha256", n+".sha512")
	}
	sort.Strings(want)
	for _, dir := range []string{a, b} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range entries {
			got = append(got, e.Name())
		}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Fatalf("make dist made %v, want %v", got, want)
		}
		for _, sum := range []string{"sha256sum", "sha512sum"} {
			ext := "." + strings.TrimSuffix(sum, "sum")
			for _, n := range want {
				if !strings.HasSuffix(n, ext) {
					continue
				}
				c := exec.Command(sum, "-c", "--strict", n)
				c.Dir = dir
				if out, err := c.CombinedOutput(); err != nil {
					t.Errorf("%s -c %s: %v\n%s", sum, n, err, out)
				}
			}
		}
	}
	for _, n := range want {
		x, _ := os.ReadFile(filepath.Join(a, n))
		y, _ := os.ReadFile(filepath.Join(b, n))
		if len(x) == 0 || !bytes.Equal(x, y) {
			t.Errorf("%s differs between two `make dist` runs of one commit (%d and %d bytes)", n, len(x), len(y))
		}
	}

	for arch, w := range distArches {
		dir := t.TempDir()
		tgz := filepath.Join(a, "podwire-"+version+"-linux-"+arch+".tgz")
		bins := checkLayout(t, tgz, dir)
		for _, bin := range bins {
			p := filepath.Join(dir, bin)
			f, err := elf.Open(p)
			if err != nil {
				t.Errorf("%s/%s: %v", arch, bin, err)
				continue
			}
			if f.Machine != w.machine || f.Class != w.class || f.Data != w.order || f.OSABI != elf.ELFOSABI_NONE || f.Type != elf.ET_EXEC {
				t.Errorf("%s/%s is %v %v %v %v %v, want %v %v %v an executable", arch, bin, f.Machine, f.Class, f.Data, f.OSABI, f.Type, w.machine, w.class, w.order)
			}
			for _, prog := range f.Progs {
				if prog.Type == elf.PT_INTERP {
					t.Errorf("%s/%s has a program interpreter: it must be static", arch, bin)
				}
			}
			f.Close()
			info, err := buildinfo.ReadFile(p)
			if err != nil {
				t.Errorf("%s/%s build info: %v", arch, bin, err)
				continue
			}
			settings := map[string]string{}
			for _, s := range info.Settings {
				settings[s.Key] = s.Value
			}
			wantSet := map[string]string{"GOOS": "linux", "GOARCH": arch, "CGO_ENABLED": "0", "-trimpath": "true"}
			if arch == "arm" {
				wantSet["GOARM"] = "7" // the reference's arm release is GOARM=7 too
			}
			for k, v := range wantSet {
				if settings[k] != v {
					t.Errorf("%s/%s built with %s=%q, want %q", arch, bin, k, settings[k], v)
				}
			}
		}
		t.Logf("%s: %d plugins, ELF %v %v %v", arch, len(bins), w.machine, w.class, w.order)
		if arch == "arm64" {
			qemu, err := exec.LookPath("qemu-aarch64-static")
			if err != nil {
				nstest.Missing(t, "qemu-aarch64-static (Debian package qemu-user-static) is needed to run the arm64 plugins: %v", err)
				continue
			}
			for _, bin := range bins {
				checkPluginVersion(t, []string{qemu, filepath.Join(dir, bin)}, version)
			}
			t.Logf("arm64: %s VERSION under %s answered for every plugin", strings.Join(bins, " "), qemu)
		}
	}
}

// checkLayout unpacks tgz into dir and checks the reference's layout: "./", then
// every file at the top level, owned by 0:0, documents 0644, plugins 0755. It returns
// the plugins' names.
func checkLayout(t *testing.T, tgz, dir string) []string {
	t.Helper()
	f, err := os.Open(tgz)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	if zr.Name != "" || !zr.ModTime.IsZero() {
		t.Errorf("%s: gzip header has name %q and time %v", tgz, zr.Name, zr.ModTime)
	}
	tr := tar.NewReader(zr)
	var names, bins []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s: %s owned by %d:%d", tgz, h.Name, h.Uid, h.Gid)
		}
		if h.Name == "./" {
			continue
		}
		n := strings.TrimPrefix(h.Name, "./")
		if h.Typeflag != tar.TypeReg || strings.Contains(n, "/") {
			t.Errorf("%s: %s is not a file at the top level", tgz, h.Name)
			continue
		}
		mode := int64(0o755)
		if isDoc(n) {
			mode = 0o644
		} else {
			bins = append(bins, n)
		}
		if h.Mode != mode {
			t.Errorf("%s: %s has mode %o, want %o", tgz, h.Name, h.Mode, mode)
		}
		out, err := os.OpenFile(filepath.Join(dir, n), os.O_CREATE|os.O_WRONLY, os.FileMode(h.Mode))
		if err != nil {
			t.Fatal(err)
		}
		_, err = io.Copy(out, tr)
		out.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(names) == 0 || names[0] != "./" || !sort.StringsAreSorted(names) {
		t.Errorf("%s: entries %v, want ./ first and sorted names", tgz, names)
	}
	for _, d := range distDocs {
		if _, err := os.Stat(filepath.Join(dir, d)); err != nil {
			t.Errorf("%s lacks %s", tgz, d)
		}
	}
	wantBins := []string{"bandwidth", "bridge", "host-local", "loopback", "portmap"}
	for _, w := range wantBins {
		if _, err := os.Stat(filepath.Join(dir, w)); err != nil {
			t.Errorf("%s lacks plugin %s", tgz, w)
		}
	}
	return bins
}
