// SPDX-License-Identifier: Apache-2.0

package disk

import (
	"strconv"
	"strings"

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

// spareDir is the descriptor of .podwire/spare, opened (and made, if missing) on
// first use; -2 when it cannot be, and then nothing is recycled.
func (t *tx) spareDir() int {
	if t.spare == -1 {
		fd, _, err := openDirAt(t.side, spareDirName)
		if err != nil {
			fd = -2
		}
		t.spare = fd
	}
	return t.spare
}

// spareNames lists .podwire/spare once per transaction. Names starting with "." are
// spares being emptied by a call (see recycle): never taken, and removed as crash
// leftovers by a call holding the directory lock.
func (t *tx) spareNames() []string {
	if t.spares == nil {
		t.spares = []string{}
		if sd := t.spareDir(); sd >= 0 {
			names, _ := listAt(sd)
			for _, n := range names {
				switch {
				case !strings.HasPrefix(n, "."):
					t.spares = append(t.spares, n)
				case t.lk.exclusive:
					_ = unix.Unlinkat(sd, n, 0)
				}
			}
		}
	}
	return t.spares
}

// takeSpare moves a spare inode to name in dir (which must not exist) and reports
// whether it did. The caller opens it with createAt, which replaces anything but a
// regular file, so a symlink planted among the spares is never written through.
func (t *tx) takeSpare(dir int, name string) bool {
	for len(t.spareNames()) > 0 {
		n := len(t.spares) - 1
		spare := t.spares[n]
		t.spares = t.spares[:n]
		if renameNoReplace(t.spareDir(), spare, dir, name) == nil {
			return true
		}
	}
	return false
}

// recycle removes name from dir by moving it to the spare pool (or unlinking it when
// the pool is full or unusable). A file that is already gone is ENOENT, as from
// unlink. The spare is emptied, so a released lease's content lingers nowhere (the
// reference's CHECK walks subdirectories too). It is emptied under a name of this
// call's own and only then given its slot: truncating it under its slot could empty
// a lease that a concurrent call took from the pool and placed in the meantime.
func (t *tx) recycle(dir int, name string) error {
	names := t.spareNames()
	if sd := t.spareDir(); sd >= 0 && len(names) < maxSpares {
		used := map[string]bool{}
		for _, n := range names {
			used[n] = true
		}
		slot := 0
		for used[strconv.Itoa(slot)] {
			slot++
		}
		private := "." + t.tmpName()
		if renameNoReplace(dir, name, sd, private) == nil {
			if emptySpare(sd, private) == nil && renameNoReplace(sd, private, sd, strconv.Itoa(slot)) == nil {
				t.spares = append(t.spares, strconv.Itoa(slot))
			} else {
				// Not a regular file after all, or the slot taken by a concurrent call.
				_ = unix.Unlinkat(sd, private, 0)
			}
			return nil
		}
		// Gone (ENOENT), or a concurrent call's: unlink says which.
	}
	return unix.Unlinkat(dir, name, 0)
}

// emptySpare truncates a spare to zero length through a no-follow open.
func emptySpare(sd int, name string) error {
	fd, _, err := openAt(sd, name, unix.O_WRONLY)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Ftruncate(fd, 0)
}
