// SPDX-License-Identifier: Apache-2.0

package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestNoticeCurrent fails when NOTICE is not what `make notice` writes now: a module
// added, removed or upgraded in what the plugins compile in must show there.
func TestNoticeCurrent(t *testing.T) {
	want, err := Notice("../..")
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../../NOTICE")
	if err != nil {
		t.Fatalf("%v: run `make notice`", err)
	}
	if string(got) != want {
		t.Fatalf("NOTICE is out of date with the modules the plugins compile in: run `make notice` and commit NOTICE\n%s", lineDiff(string(got), want))
	}
	for _, m := range []string{"github.com/vishvananda/netlink", "golang.org/x/sys", "Go standard library"} {
		if !strings.Contains(want, "\n"+m) {
			t.Errorf("NOTICE does not list %s", m)
		}
	}
	if strings.Contains(want, "github.com/google/go-cmp") || strings.Contains(want, "github.com/google/licensecheck") {
		t.Errorf("NOTICE lists a module only tests or tools use")
	}
}

func lineDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := 0; i < len(al) && i < len(bl); i++ {
		if al[i] != bl[i] {
			return "first difference at line " + strconv.Itoa(i+1) + ":\n- " + al[i] + "\n+ " + bl[i]
		}
	}
	return "one is a prefix of the other"
}

// TestPackReproducible packs the same files twice, with different file times, modes
// and umask-made permissions on disk, and requires identical bytes, the reference's
// layout and checksum files sha256sum -c accepts.
func TestPackReproducible(t *testing.T) {
	var outs [][]byte
	for i, mode := range []os.FileMode{0o755, 0o700} {
		dir := t.TempDir()
		bin := filepath.Join(dir, "stage", "arm64")
		if err := os.MkdirAll(bin, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, n := range []string{"portmap", "bridge", "loopback"} {
			p := filepath.Join(bin, n)
			if err := os.WriteFile(p, []byte("binary "+n), mode); err != nil {
				t.Fatal(err)
			}
			_ = os.Chmod(p, mode)
			_ = os.Chtimes(p, time.Unix(int64(1000*i), 0), time.Unix(int64(1000*i), 0))
		}
		doc := filepath.Join(dir, "LICENSE")
		if err := os.WriteFile(doc, []byte("license"), mode&0o666); err != nil {
			t.Fatal(err)
		}
		path, err := Pack(PackSpec{Version: "1.2.3", Arch: "arm64", Epoch: 1700000000, BinDir: bin, Docs: []string{doc}, OutDir: filepath.Join(dir, "out")})
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Base(path) != "podwire-1.2.3-linux-arm64.tgz" {
			t.Errorf("tarball name %s", path)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		line, err := os.ReadFile(path + ".sha256")
		if err != nil {
			t.Fatal(err)
		}
		if want := hex.EncodeToString(sum[:]) + "  podwire-1.2.3-linux-arm64.tgz\n"; string(line) != want {
			t.Errorf(".sha256 is %q, want %q", line, want)
		}
		if s5, err := os.ReadFile(path + ".sha512"); err != nil || len(s5) != 128+2+len("podwire-1.2.3-linux-arm64.tgz")+1 {
			t.Errorf(".sha512 is %q (%v)", s5, err)
		}
		outs = append(outs, b)
	}
	if !bytes.Equal(outs[0], outs[1]) {
		t.Fatal("two packs of the same contents differ")
	}

	// gzip: no name, no time; tar: "./" then sorted names, 0:0, fixed modes and time.
	zr, err := gzip.NewReader(bytes.NewReader(outs[0]))
	if err != nil {
		t.Fatal(err)
	}
	if zr.Name != "" || !zr.ModTime.IsZero() {
		t.Errorf("gzip header has name %q, time %v", zr.Name, zr.ModTime)
	}
	tr := tar.NewReader(zr)
	var got []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" || h.ModTime.Unix() != 1700000000 {
			t.Errorf("%s: owner %d:%d %q:%q time %v", h.Name, h.Uid, h.Gid, h.Uname, h.Gname, h.ModTime)
		}
		got = append(got, h.Name+" "+os.FileMode(h.Mode).String())
	}
	want := []string{"./ -rwxr-xr-x", "./LICENSE -rw-r--r--", "./bridge -rwxr-xr-x", "./loopback -rwxr-xr-x", "./portmap -rwxr-xr-x"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("entries %v, want %v", got, want)
	}
}

func TestPackRefusesEmptyAndDuplicates(t *testing.T) {
	dir := t.TempDir()
	if _, err := Pack(PackSpec{Version: "1", Arch: "s390x", BinDir: dir, OutDir: dir}); err == nil || !strings.Contains(err.Error(), "no plugins") {
		t.Errorf("empty stage: %v", err)
	}
	_ = os.WriteFile(filepath.Join(dir, "README.md"), nil, 0o644)
	other := t.TempDir()
	_ = os.WriteFile(filepath.Join(other, "README.md"), nil, 0o644)
	if _, err := Pack(PackSpec{Version: "1", Arch: "s390x", BinDir: dir, Docs: []string{filepath.Join(other, "README.md")}, OutDir: other}); err == nil || !strings.Contains(err.Error(), "would both be") {
		t.Errorf("duplicate name: %v", err)
	}
}
