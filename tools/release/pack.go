// SPDX-License-Identifier: Apache-2.0

package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"fmt"
	"hash"
	"os"
	"path/filepath"
	"sort"
	"time"
)

// PackSpec is one architecture's tarball: the plugins in BinDir (every regular file,
// mode 0755) and Docs (mode 0644) at the top level, as the reference's release
// archives lay them out.
type PackSpec struct {
	Version string
	Arch    string
	Epoch   int64 // every entry's modification time
	BinDir  string
	Docs    []string
	OutDir  string
}

// TarballName is the file name of v's tarball for arch.
func TarballName(version, arch string) string {
	return fmt.Sprintf("podwire-%s-linux-%s.tgz", version, arch)
}

type entry struct {
	name string
	mode int64
	data []byte
}

// Pack writes s's tarball and its .sha256 and .sha512 files into s.OutDir and returns
// the tarball's path. The bytes depend only on the files' names and contents, s.Epoch
// and the Go toolchain's compress/flate: entries are sorted by name, owned by 0:0 with
// no user or group names, their modes fixed, their times s.Epoch; the gzip header has
// no name and no time.
func Pack(s PackSpec) (string, error) {
	bins, err := os.ReadDir(s.BinDir)
	if err != nil {
		return "", fmt.Errorf("reading the %s plugins: %w (run `make dist`, which builds them first)", s.Arch, err)
	}
	var files []entry
	seen := map[string]string{}
	add := func(path string, mode int64) error {
		fi, err := os.Lstat(path)
		if err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("%s is not a regular file; a release holds only plugin binaries and documents", path)
		}
		name := filepath.Base(path)
		if prev, ok := seen[name]; ok {
			return fmt.Errorf("%s and %s would both be ./%s in the tarball", prev, path, name)
		}
		seen[name] = path
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		files = append(files, entry{name: name, mode: mode, data: data})
		return nil
	}
	for _, b := range bins {
		if err := add(filepath.Join(s.BinDir, b.Name()), 0o755); err != nil {
			return "", err
		}
	}
	if len(files) == 0 {
		return "", fmt.Errorf("no plugins in %s: the %s build produced nothing", s.BinDir, s.Arch)
	}
	for _, d := range s.Docs {
		if err := add(d, 0o644); err != nil {
			return "", fmt.Errorf("adding %s: %w", d, err)
		}
	}
	sort.Slice(files, func(i, j int) bool { return files[i].name < files[j].name })

	tgz, err := tarGz(files, time.Unix(s.Epoch, 0))
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(s.OutDir, 0o755); err != nil {
		return "", err
	}
	name := TarballName(s.Version, s.Arch)
	path := filepath.Join(s.OutDir, name)
	if err := writeFile(path, tgz); err != nil {
		return "", err
	}
	for ext, h := range map[string]hash.Hash{".sha256": sha256.New(), ".sha512": sha512.New()} {
		h.Write(tgz)
		// sha256sum's format: `sha256sum -c NAME.sha256` in the tarball's directory.
		line := hex.EncodeToString(h.Sum(nil)) + "  " + name + "\n"
		if err := writeFile(path+ext, []byte(line)); err != nil {
			return "", err
		}
	}
	return path, nil
}

func tarGz(files []entry, mtime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	tw := tar.NewWriter(zw)
	hdr := func(h *tar.Header) error {
		h.ModTime, h.Format = mtime, tar.FormatUSTAR
		return tw.WriteHeader(h)
	}
	// "./" first, then "./<name>": what `tar -C dir -czf x.tgz .` makes, as the
	// reference's archives do.
	if err := hdr(&tar.Header{Typeflag: tar.TypeDir, Name: "./", Mode: 0o755}); err != nil {
		return nil, err
	}
	for _, f := range files {
		if err := hdr(&tar.Header{Typeflag: tar.TypeReg, Name: "./" + f.name, Mode: f.mode, Size: int64(len(f.data))}); err != nil {
			return nil, fmt.Errorf("tar header for %s: %w", f.name, err)
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// writeFile replaces path with data through a temporary file and a rename, so a
// failed run never leaves a truncated tarball under the final name; the mode is 0644
// whatever the umask.
func writeFile(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
