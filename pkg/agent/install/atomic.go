// SPDX-License-Identifier: Apache-2.0

package install

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// hashFile returns the hex SHA-256 of path's content; a missing file is ("", nil).
func hashFile(path string) (string, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("reading %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// hashBytes returns the hex SHA-256 of b.
func hashBytes(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// writeAtomic replaces path with content from r: a temporary file in path's directory,
// written, chmod'ed, fsync'ed and renamed over path, then the directory fsync'ed. A
// reader (a runtime executing the plugin, libcni reading the conflist) sees the old
// file or the new one, never a part; a running binary keeps its old inode, so there is
// no "text file busy".
func writeAtomic(path string, r io.Reader, mode os.FileMode) error {
	dir := filepath.Dir(path)
	var rnd [6]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return err
	}
	tmp := filepath.Join(dir, "."+filepath.Base(path)+tempInfix+hex.EncodeToString(rnd[:]))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("creating a temporary file in %s (is it mounted read-write into the agent?): %w", dir, err)
	}
	done := false
	defer func() {
		if !done {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if _, err := io.Copy(f, r); err != nil {
		return fmt.Errorf("writing %s: %w", tmp, err)
	}
	if err := f.Chmod(mode); err != nil {
		return fmt.Errorf("chmod %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("closing %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("renaming %s to %s: %w", tmp, path, err)
	}
	done = true
	return syncDir(dir)
}

// tempInfix marks writeAtomic's temporary files: "." + the target's name + tempInfix + 12
// hex digits.
const tempInfix = ".podwire-"

// isTemp reports whether name is one of writeAtomic's temporary files.
func isTemp(name string) bool {
	i := strings.LastIndex(name, tempInfix)
	if len(name) < 2 || name[0] != '.' || i < 1 {
		return false
	}
	suffix := name[i+len(tempInfix):]
	if len(suffix) != 12 {
		return false
	}
	_, err := hex.DecodeString(suffix)
	return err == nil
}

// removeTemps removes the temporary files a killed writer left in dir (SIGKILL, a node
// losing power between create and rename): nothing else removes them, and each is as
// large as a plugin. Only one agent writes a node's directories at a time (the
// DaemonSet's rolling update stops the old pod before it starts the new one), so a
// temporary file found here at start is never one being written. A missing dir has none.
func removeTemps(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var gone []string
	var errs []error
	for _, e := range ents {
		if !e.Type().IsRegular() || !isTemp(e.Name()) {
			continue
		}
		p := filepath.Join(dir, e.Name())
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("removing the leftover temporary file %s: %w", p, err))
			continue
		}
		gone = append(gone, p)
	}
	if len(gone) > 0 {
		errs = append(errs, syncDir(dir))
	}
	return gone, errors.Join(errs...)
}

// writeFileAtomic is writeAtomic for bytes in memory.
func writeFileAtomic(path string, b []byte, mode os.FileMode) error {
	return writeAtomic(path, bytes.NewReader(b), mode)
}

// copyAtomic copies src to dst atomically with mode.
func copyAtomic(src, dst string, mode os.FileMode) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	return writeAtomic(dst, f, mode)
}

// syncDir makes a rename or removal in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync directory %s: %w", dir, err)
	}
	return nil
}

// removeIfHash removes path when its content still hashes to sum; it reports whether
// it removed it. A missing file is not an error.
func removeIfHash(path, sum string) (bool, error) {
	got, err := hashFile(path)
	if err != nil || got == "" {
		return false, err
	}
	if got != sum {
		return false, nil
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, err
	}
	return true, syncDir(filepath.Dir(path))
}
