// SPDX-License-Identifier: Apache-2.0

package containerd

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// readTar returns every regular file of a tarball by name.
func readTar(t *testing.T, b []byte) (map[string][]byte, map[string]*tar.Header) {
	t.Helper()
	files := map[string][]byte{}
	hdrs := map[string]*tar.Header{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files, hdrs
		}
		if err != nil {
			t.Fatalf("reading tar: %v", err)
		}
		hdrs[h.Name] = h
		if h.Typeflag == tar.TypeReg {
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			files[h.Name] = data
		}
	}
}

// TestWriteOCIArchive reads an archive back the way an importer does: from index.json
// through the manifest to config and layer, checking every digest and size.
func TestWriteOCIArchive(t *testing.T) {
	var buf bytes.Buffer
	img := Image{
		Name:       "podwire.test/pause:e2e",
		Entrypoint: []string{"/pause"},
		Files:      []File{{Path: "/pause", Mode: 0o755, Data: []byte("#!binary")}, {Path: "/etc/x/y", Mode: 0o644, Data: []byte("y")}},
	}
	if err := WriteOCIArchive(&buf, img); err != nil {
		t.Fatal(err)
	}
	files, _ := readTar(t, buf.Bytes())
	if got := string(files["oci-layout"]); got != `{"imageLayoutVersion":"1.0.0"}` {
		t.Errorf("oci-layout = %q", got)
	}
	blob := func(d descriptor) []byte {
		t.Helper()
		data, ok := files["blobs/sha256/"+strings.TrimPrefix(d.Digest, "sha256:")]
		if !ok {
			t.Fatalf("blob %s missing", d.Digest)
		}
		if digest(data) != d.Digest || int64(len(data)) != d.Size {
			t.Fatalf("blob %s: digest %s size %d, descriptor says size %d", d.Digest, digest(data), len(data), d.Size)
		}
		return data
	}
	var idx index
	if err := json.Unmarshal(files["index.json"], &idx); err != nil {
		t.Fatal(err)
	}
	if len(idx.Manifests) != 1 {
		t.Fatalf("index has %d manifests", len(idx.Manifests))
	}
	md := idx.Manifests[0]
	if md.Annotations[annImageName] != img.Name || md.Platform == nil || md.Platform.Architecture != runtime.GOARCH || md.Platform.OS != "linux" {
		t.Errorf("index entry = %+v", md)
	}
	var man manifest
	if err := json.Unmarshal(blob(md), &man); err != nil {
		t.Fatal(err)
	}
	var cfg imageConfig
	if err := json.Unmarshal(blob(man.Config), &cfg); err != nil {
		t.Fatal(err)
	}
	if len(man.Layers) != 1 || man.Layers[0].MediaType != mediaLayer {
		t.Fatalf("layers = %+v", man.Layers)
	}
	layer := blob(man.Layers[0])
	if diff := cmp.Diff([]string{man.Layers[0].Digest}, cfg.RootFS.DiffIDs); diff != "" {
		t.Errorf("diff_ids (-layer digest +config): %s", diff)
	}
	if diff := cmp.Diff(img.Entrypoint, cfg.Config.Entrypoint); diff != "" {
		t.Errorf("entrypoint: %s", diff)
	}
	lfiles, lhdrs := readTar(t, layer)
	if string(lfiles["pause"]) != "#!binary" || lhdrs["pause"].Mode != 0o755 {
		t.Errorf("layer /pause = %q mode %o", lfiles["pause"], lhdrs["pause"].Mode)
	}
	for _, d := range []string{"etc/", "etc/x/"} {
		if h := lhdrs[d]; h == nil || h.Typeflag != tar.TypeDir {
			t.Errorf("layer lacks parent directory %s", d)
		}
	}

	// Reproducible: the same image gives the same bytes.
	var again bytes.Buffer
	if err := WriteOCIArchive(&again, img); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), again.Bytes()) {
		t.Error("two archives of the same image differ")
	}
}

func TestWriteOCIArchiveRejects(t *testing.T) {
	for name, img := range map[string]Image{
		"no name":       {Entrypoint: []string{"/pause"}},
		"no entrypoint": {Name: "x.test/p:1"},
		"relative path": {Name: "x.test/p:1", Entrypoint: []string{"/p"}, Files: []File{{Path: "p"}}},
		"unclean path":  {Name: "x.test/p:1", Entrypoint: []string{"/p"}, Files: []File{{Path: "/a/../p"}}},
	} {
		if err := WriteOCIArchive(io.Discard, img); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
