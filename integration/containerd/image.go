// SPDX-License-Identifier: Apache-2.0

// Package containerd runs a private containerd (Debian's 1.6 series) for podwire's
// end-to-end test: its own config, root, state dir and socket under a temporary
// directory, inside a network namespace the test owns, with the CRI plugin's CNI bin
// and conf dirs pointing at the freshly built plugins. It also builds the sandbox
// ("pause") image locally, because no registry is reachable from the test machines.
package containerd

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"path"
	"runtime"
	"sort"
	"strings"
	"time"
)

// OCI media types and the annotation containerd's importer names an image by.
const (
	mediaIndex    = "application/vnd.oci.image.index.v1+json"
	mediaManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaConfig   = "application/vnd.oci.image.config.v1+json"
	mediaLayer    = "application/vnd.oci.image.layer.v1.tar"
	annImageName  = "io.containerd.image.name"
)

// File is one regular file in an image's single layer.
type File struct {
	Path string // absolute path inside the image, e.g. "/pause"
	Mode int64  // permission bits, e.g. 0o755
	Data []byte
}

// Image is a one-layer image for the host's architecture.
type Image struct {
	Name       string // full reference, e.g. "podwire.test/pause:e2e"
	Entrypoint []string
	Cmd        []string // the default arguments, when a container gives none
	Files      []File
	// Layer, when set, is the layer as an uncompressed tar (a whole root filesystem),
	// used instead of Files.
	Layer []byte
}

// descriptor is an OCI content descriptor.
type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Platform    *platform         `json:"platform,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

type manifest struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Config        descriptor   `json:"config"`
	Layers        []descriptor `json:"layers"`
}

type index struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Manifests     []descriptor `json:"manifests"`
}

type imageConfig struct {
	Created      time.Time `json:"created"`
	Architecture string    `json:"architecture"`
	OS           string    `json:"os"`
	Config       struct {
		Entrypoint []string `json:"Entrypoint,omitempty"`
		Cmd        []string `json:"Cmd,omitempty"`
		Env        []string `json:"Env,omitempty"`
	} `json:"config"`
	RootFS struct {
		Type    string   `json:"type"`
		DiffIDs []string `json:"diff_ids"`
	} `json:"rootfs"`
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// layerTar packs files (and their parent directories) into an uncompressed,
// reproducible tar: fixed times, root ownership, sorted entries.
func layerTar(files []File) ([]byte, error) {
	epoch := time.Unix(0, 0)
	dirs := map[string]bool{}
	for _, f := range files {
		if !strings.HasPrefix(f.Path, "/") || path.Clean(f.Path) != f.Path || f.Path == "/" {
			return nil, fmt.Errorf("image file path %q must be absolute and clean", f.Path)
		}
		for d := path.Dir(f.Path); d != "/"; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	var dirList []string
	for d := range dirs {
		dirList = append(dirList, d)
	}
	sort.Strings(dirList) // parents sort before children
	sorted := append([]File(nil), files...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Path < sorted[j].Path })

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, d := range dirList {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d[1:] + "/", Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
	}
	for _, f := range sorted {
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: f.Path[1:], Mode: f.Mode, Size: int64(len(f.Data)), ModTime: epoch, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.Data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// WriteOCIArchive writes img as a tarball of an OCI image layout (oci-layout,
// index.json, blobs/sha256/...) that `ctr images import` accepts. The index entry
// carries the io.containerd.image.name annotation, so the import registers the
// image under img.Name, and a linux platform for the host's architecture, so the
// import unpacks it for the default snapshotter.
func WriteOCIArchive(w io.Writer, img Image) error {
	if img.Name == "" || len(img.Entrypoint) == 0 {
		return fmt.Errorf("image needs a name and an entrypoint")
	}
	layer := img.Layer
	if layer == nil {
		var err error
		if layer, err = layerTar(img.Files); err != nil {
			return err
		}
	}
	// The layer is uncompressed, so its digest is also its diff ID.
	layerDigest := digest(layer)

	var cfg imageConfig
	cfg.Created = time.Unix(0, 0).UTC()
	cfg.Architecture = runtime.GOARCH
	cfg.OS = "linux"
	cfg.Config.Entrypoint = img.Entrypoint
	cfg.Config.Cmd = img.Cmd
	cfg.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cfg.RootFS.Type = "layers"
	cfg.RootFS.DiffIDs = []string{layerDigest}
	cfgJSON, err := json.Marshal(cfg)
	if err != nil {
		return err
	}

	man := manifest{
		SchemaVersion: 2,
		MediaType:     mediaManifest,
		Config:        descriptor{MediaType: mediaConfig, Digest: digest(cfgJSON), Size: int64(len(cfgJSON))},
		Layers:        []descriptor{{MediaType: mediaLayer, Digest: layerDigest, Size: int64(len(layer))}},
	}
	manJSON, err := json.Marshal(man)
	if err != nil {
		return err
	}
	idx := index{SchemaVersion: 2, MediaType: mediaIndex, Manifests: []descriptor{{
		MediaType:   mediaManifest,
		Digest:      digest(manJSON),
		Size:        int64(len(manJSON)),
		Platform:    &platform{Architecture: runtime.GOARCH, OS: "linux"},
		Annotations: map[string]string{annImageName: img.Name},
	}}}
	idxJSON, err := json.Marshal(idx)
	if err != nil {
		return err
	}

	tw := tar.NewWriter(w)
	epoch := time.Unix(0, 0)
	add := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: epoch}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	blob := func(data []byte) error {
		return add("blobs/sha256/"+strings.TrimPrefix(digest(data), "sha256:"), data)
	}
	for _, step := range []func() error{
		func() error { return add("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)) },
		func() error { return add("index.json", idxJSON) },
		func() error { return blob(manJSON) },
		func() error { return blob(cfgJSON) },
		func() error { return blob(layer) },
	} {
		if err := step(); err != nil {
			return fmt.Errorf("writing OCI archive for %s: %w", img.Name, err)
		}
	}
	return tw.Close()
}
