// SPDX-License-Identifier: Apache-2.0

package disk

import (
	"context"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/podwire/podwire/pkg/cniplumb"
)

// Every transaction holds two exclusive flocks, taken in this order:
//
//  1. On the network directory itself. Only podwire takes it. A directory cannot be
//     removed while it holds leases, and after locking it is checked to still be the
//     directory at its path, so removing files in it (the lock file, the index, all of
//     it) never lets two podwire calls in at once.
//  2. On <dir>/lock, the file the reference host-local flocks, so that podwire and the
//     reference exclude each other. Someone clearing the lease directory may remove
//     that file at any moment; a call that opened it just before would then lock a
//     file nobody else can find, while every later call, the reference's included,
//     locks a new one. So after taking the flock, the locked file is checked to still
//     be the one at <dir>/lock (same device and inode), and the call starts over on
//     the file now there otherwise. A missing lock file is created with
//     O_CREAT|O_NOFOLLOW, which never follows a symlink planted in its place.
//
// Filesystems that cannot flock a directory (NFS emulates flock with POSIX locks,
// which need a file opened for writing) get only the second lock; see exclusive.

// maxLockAttempts bounds how often a call starts over because the lock file or the
// directory was replaced while it waited.
const maxLockAttempts = 100

// locked is the network directory, open and locked for one transaction.
type locked struct {
	dir  int // the network directory, flocked when exclusive
	lock int // <dir>/lock, flocked
	// exclusive: the directory flock is held, so no other podwire call is inside a
	// transaction on this network, whatever happened to the lock file.
	exclusive bool
}

func (l *locked) close() {
	// Closing a descriptor drops its flock.
	if l.lock >= 0 {
		unix.Close(l.lock)
	}
	unix.Close(l.dir)
}

// lockDir opens and locks the network directory, creating it (0755, as the reference
// does) when missing.
func (s *Store) lockDir(ctx context.Context) (*locked, error) {
	for attempt := 0; attempt < maxLockAttempts; attempt++ {
		if err := os.MkdirAll(s.dir, 0o755); err != nil {
			return nil, ioError("creating the lease directory "+s.dir, err)
		}
		l, err := s.tryLock(ctx)
		if err != nil || l != nil {
			return l, err
		}
	}
	return nil, cniplumb.TryAgain("the lease directory lock", fmt.Errorf(
		"%s/lock was removed or replaced %d times while this call waited for it; stop whatever deletes files in %s",
		s.dir, maxLockAttempts, s.dir))
}

// tryLock takes both locks, or returns nil, nil when the directory or its lock file
// turned out to be replaced while it waited (the caller starts over).
func (s *Store) tryLock(ctx context.Context) (_ *locked, err error) {
	dfd, err := unix.Open(s.dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, ioError("opening the lease directory "+s.dir, err)
	}
	l := &locked{dir: dfd, lock: -1}
	ok := false
	defer func() {
		if !ok {
			l.close()
		}
	}()
	switch err := cniplumb.Flock(ctx, dfd); {
	case err == nil:
		l.exclusive = true
	case errors.Is(err, unix.EBADF), errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOLCK), errors.Is(err, unix.EOPNOTSUPP):
		// No directory flock on this filesystem: the lock file alone excludes.
	default:
		return nil, lockError(ctx, err)
	}
	var dst, pst unix.Stat_t
	if err := unix.Fstat(dfd, &dst); err != nil {
		return nil, ioError("reading the lease directory "+s.dir, err)
	}
	// The dataDir and network directory themselves are the operator's: following a
	// symlink to them is intended.
	if err := unix.Stat(s.dir, &pst); err != nil || pst.Dev != dst.Dev || pst.Ino != dst.Ino {
		return nil, nil // removed (and maybe re-created) while we waited
	}
	if l.lock, err = openLock(dfd, s.dir, l.exclusive); err != nil {
		return nil, err
	}
	if err := lockError(ctx, cniplumb.Flock(ctx, l.lock)); err != nil {
		return nil, err
	}
	var fst, lst unix.Stat_t
	if err := unix.Fstat(l.lock, &fst); err != nil {
		return nil, ioError("reading the lock file in "+s.dir, err)
	}
	if err := unix.Fstatat(dfd, lockName, &lst, unix.AT_SYMLINK_NOFOLLOW); err != nil || lst.Dev != fst.Dev || lst.Ino != fst.Ino {
		return nil, nil // the file we locked is no longer the lock file
	}
	ok = true
	return l, nil
}

// openLock opens <dir>/lock, creating it 0600 when missing, without following a
// symlink in its place. Something other than a regular file there (a symlink,
// dangling or not) is removed — the link itself — and a lock file made, but only by
// a call holding the directory lock (replace): no other podwire call can then be
// between opening and locking the lock file. (A reference call that locked the
// link's target at that moment is not excluded, once; the reference follows the
// link, podwire never does.)
func openLock(dfd int, dir string, replace bool) (int, error) {
	fd, _, err := openAt(dfd, lockName, unix.O_RDONLY|unix.O_CREAT)
	if errors.Is(err, errNotFile) && replace {
		if err = removeNonFile(dfd, lockName); err == nil || errors.Is(err, unix.ENOENT) {
			fd, _, err = openAt(dfd, lockName, unix.O_RDONLY|unix.O_CREAT)
		}
	}
	switch {
	case err == nil:
		return fd, nil
	case errors.Is(err, errNotFile), errors.Is(err, unix.EISDIR):
		return -1, ioError("opening the lock file", fmt.Errorf(
			"%s/lock is not a regular file (a symlink or directory), and podwire does not follow it: remove it (podwire creates a new one)", dir))
	}
	return -1, ioError("opening the lock file in "+dir, err)
}

// lockError turns a failed flock into the call's error: code 11 when ctx ended first
// (the runtime then retries), code 5 otherwise. nil stays nil.
func lockError(ctx context.Context, err error) error {
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		return cniplumb.TryAgain("the lease directory lock", err)
	}
	return ioError("locking the lease directory", err)
}
