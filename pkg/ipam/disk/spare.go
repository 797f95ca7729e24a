package disk

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// Spare inodes. Allocating and freeing inodes is what costs most on a journaling
// filesystem (over a millisecond each on the ext4 we measured), so a released lease
// file or index entry is not unlinked but renamed into .podwire/spare/ (at most
// maxSpares of them), and the next new lease or index entry is written into one of
// those. The lease the reference sees appears and disappears exactly as with
// create/unlink: rename(2) is atomic, and a lease is placed with RENAME_NOREPLACE,
// which fails like link(2) when the name exists.
const (
	spareDirName = "spare"
	maxSpares    = 16
)

// spareNames lists .podwire/spare once per transaction.
func (t *tx) spareNames() []string {
	if t.spares == nil {
		t.spares = []string{}
		ents, err := os.ReadDir(filepath.Join(t.s.side, spareDirName))
		if err == nil {
			for _, e := range ents {
				if e.Type().IsRegular() {
					t.spares = append(t.spares, e.Name())
				}
			}
		}
	}
	return t.spares
}

// takeSpare moves a spare inode to dst (which must not exist) and reports whether
// it did.
func (t *tx) takeSpare(dst string) bool {
	for len(t.spareNames()) > 0 {
		n := len(t.spares) - 1
		name := t.spares[n]
		t.spares = t.spares[:n]
		if renameNoReplace(filepath.Join(t.s.side, spareDirName, name), dst) == nil {
			return true
		}
	}
	return false
}

// recycle removes path from its directory by moving it to the spare pool (or
// unlinking it when the pool is full). A file that is already gone is ENOENT, as from
// unlink. The spare is emptied, so a released lease's content lingers nowhere (the
// reference's CHECK walks subdirectories too).
func (t *tx) recycle(path string) error {
	names := t.spareNames()
	if len(names) < maxSpares {
		used := map[string]bool{}
		for _, n := range names {
			used[n] = true
		}
		slot := 0
		for used[strconv.Itoa(slot)] {
			slot++
		}
		dir := filepath.Join(t.s.side, spareDirName)
		dst := filepath.Join(dir, strconv.Itoa(slot))
		err := renameNoReplace(path, dst)
		if errors.Is(err, unix.ENOENT) {
			if _, serr := os.Lstat(path); serr != nil {
				return unix.ENOENT
			}
			// The spare directory is missing (an index made by an older podwire).
			if os.Mkdir(dir, 0o700) == nil {
				err = renameNoReplace(path, dst)
			}
		}
		if err == nil {
			t.spares = append(t.spares, strconv.Itoa(slot))
			_ = unix.Truncate(dst, 0)
			return nil
		}
	}
	return unix.Unlink(path)
}

// renameNoReplace is rename(2) that fails with EEXIST when dst exists. Filesystems
// without renameat2 flags get link(2)+unlink(2), which has the same guarantee.
func renameNoReplace(src, dst string) error {
	err := unix.Renameat2(unix.AT_FDCWD, src, unix.AT_FDCWD, dst, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
		if err = unix.Link(src, dst); err == nil {
			_ = unix.Unlink(src)
		}
	}
	return err
}
