// SPDX-License-Identifier: Apache-2.0

package disk

import (
	"errors"
	"io"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
)

// Files under the network directory are reached only through a descriptor of their
// directory and a single name: the network directory (opened by Do), .podwire,
// .podwire/owners and .podwire/spare (each opened with O_DIRECTORY|O_NOFOLLOW). Files
// are opened with O_NOFOLLOW, and rename(2), link(2) and unlink(2) act on a symlink
// itself, never on its target. With a single name per call there is no intermediate
// component a symlink could redirect, so this is exactly what openat2's
// RESOLVE_NO_SYMLINKS|RESOLVE_BENEATH would enforce, on every kernel: nothing planted in
// the directory — a symlink, a FIFO, a device node — makes podwire read, write,
// create or remove anything outside <dataDir>/<network>. (The dataDir and network
// directory themselves are the operator's configuration; a symlink to them is
// followed.)
//
// Where podwire finds something other than what it needs (a symlink in place of
// .podwire, of one of its files, of the lock file or of last_reserved_ip), it removes
// that thing — the link, never what it points to — and makes its own. Lease files are
// different: whose they were cannot be read without following the link; see
// ipam.Lease.Unreadable.

// errNotFile: a name holds something other than a regular file (a symlink, a
// directory, a device node, a FIFO).
var errNotFile = errors.New("not a regular file")

// noFollow goes into every open: no symlink is followed, opening a FIFO does not
// block, and a terminal does not become the process's controlling terminal.
const noFollow = unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_NOCTTY | unix.O_CLOEXEC

// openAt opens the regular file name in dir with flags (O_RDONLY, or O_WRONLY with
// O_CREAT...), creating it 0600. It returns fs.ErrNotExist when name is absent and
// errNotFile when it is not a regular file.
func openAt(dir int, name string, flags int) (int, *unix.Stat_t, error) {
	fd, err := unix.Openat(dir, name, flags|noFollow, 0o600)
	switch {
	case errors.Is(err, unix.ENOENT):
		return -1, nil, fs.ErrNotExist
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENXIO), errors.Is(err, unix.EISDIR):
		return -1, nil, errNotFile // a symlink; a socket; a directory opened for writing
	case err != nil:
		return -1, nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return -1, nil, errNotFile
	}
	return fd, &st, nil
}

// createAt is openAt for writing a file podwire owns: something other than a regular
// file in the way is removed first (see removeNonFile).
func createAt(dir int, name string, flags int) (*os.File, *unix.Stat_t, error) {
	fd, st, err := openAt(dir, name, flags|unix.O_CREAT)
	if errors.Is(err, errNotFile) {
		if err = removeNonFile(dir, name); err == nil {
			fd, st, err = openAt(dir, name, flags|unix.O_CREAT)
		}
	}
	if err != nil {
		return nil, nil, err
	}
	return os.NewFile(uintptr(fd), name), st, nil
}

// readAt reads up to limit bytes of the regular file name in dir (a bound, so that a
// huge planted file cannot exhaust memory).
func readAt(dir int, name string, limit int64) ([]byte, *unix.Stat_t, error) {
	fd, st, err := openAt(dir, name, unix.O_RDONLY)
	if err != nil {
		return nil, nil, err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit))
	return b, st, err
}

// writeAt rewrites the file name in dir in place, creating it 0600: write at offset
// 0, then cut the file to the new length. Not truncating to zero first matters: ext4
// flushes a file truncated to zero when it is closed (auto_da_alloc), which made every
// call several times slower. A crash in between leaves a torn file; each caller says
// why that is harmless for its file.
func writeAt(dir int, name string, data []byte) error {
	f, _, err := createAt(dir, name, unix.O_WRONLY)
	if err != nil {
		return err
	}
	if _, err := f.WriteAt(data, 0); err != nil {
		f.Close()
		return err
	}
	if err := f.Truncate(int64(len(data))); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// removeNonFile removes name from dir when it is neither a regular file nor a
// directory (a symlink is removed itself, never its target). A regular file is left
// alone (nil); a directory is left alone too (unix.EISDIR): it may hold anything, and
// is not podwire's to delete.
func removeNonFile(dir int, name string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		return nil
	case unix.S_IFDIR:
		return unix.EISDIR
	}
	return unix.Unlinkat(dir, name, 0)
}

// openDirAt opens the directory name in parent, creating it 0700 when missing. Anything
// else in its place (a symlink, a file) is podwire's to replace: it is removed (the
// link itself) and the directory made. made reports that the directory is new.
func openDirAt(parent int, name string) (fd int, made bool, err error) {
	for attempt := 0; ; attempt++ {
		fd, err := unix.Openat(parent, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err == nil || attempt == 2 {
			return fd, made, err
		}
		switch {
		case errors.Is(err, unix.ENOENT):
		case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR):
			if err := unix.Unlinkat(parent, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
				return -1, false, err
			}
		default:
			return -1, false, err
		}
		if err := unix.Mkdirat(parent, name, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
			return -1, false, err
		}
		made = true
	}
}

// listAt lists the names in the directory dir, through a descriptor of its own (so
// listings never share an offset). It returns names only: the types os.ReadDir
// reports come from an lstat by path where the filesystem does not record them, which
// would not be relative to dir.
func listAt(dir int) ([]string, error) {
	fd, err := unix.Openat(dir, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), ".")
	defer f.Close()
	return f.Readdirnames(-1)
}

// renameNoReplace is rename(2) that fails with EEXIST when the destination exists.
// Filesystems without renameat2 flags get link(2)+unlink(2), which has the same
// guarantee.
func renameNoReplace(fromDir int, from string, toDir int, to string) error {
	err := unix.Renameat2(fromDir, from, toDir, to, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
		if err = unix.Linkat(fromDir, from, toDir, to, 0); err == nil {
			_ = unix.Unlinkat(fromDir, from, 0)
		}
	}
	return err
}
