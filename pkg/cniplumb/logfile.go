// SPDX-License-Identifier: Apache-2.0

package cniplumb

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// logWriter appends slog's lines to a log file shared by every plugin process of the
// node. slog's handler calls Write once per line; the file is opened O_APPEND, so each
// line lands whole at the end whatever other processes write at the same moment (a
// write to a regular file moves its offset under the inode's lock). When the file
// would grow past maxBytes it is renamed to <path>.1 (replacing the previous one)
// under an flock on <path>.lock, so the log takes at most about twice maxBytes; a
// process that finds the file already rotated by another just reopens it. A failure
// turns this call's log off and is reported once on stderr; Write never fails.
type logWriter struct {
	path     string
	maxBytes int64
	plugin   string

	f      *os.File
	failed bool
}

// logLockWait bounds the wait for another process's rotation.
const logLockWait = 2 * time.Second

func (w *logWriter) Write(p []byte) (int, error) {
	if w.failed {
		return len(p), nil
	}
	if err := w.write(p); err != nil {
		w.failed = true
		warnLog(w.plugin, "writing %s: %v", w.path, err)
	}
	return len(p), nil
}

func (w *logWriter) write(p []byte) error {
	if w.f == nil {
		if err := w.open(); err != nil {
			return err
		}
	}
	st, err := w.f.Stat()
	if err != nil {
		return err
	}
	if st.Size() > 0 && st.Size()+int64(len(p)) > w.maxBytes {
		if err := w.rotate(int64(len(p))); err != nil {
			return fmt.Errorf("rotating: %w", err)
		}
	}
	_, err = w.f.Write(p)
	return err
}

// open opens (creating) the log file for appending, and its directory if missing.
// O_NOFOLLOW: a log in a shared directory is never a way to append to another file.
func (w *logWriter) open() error {
	if err := os.MkdirAll(filepath.Dir(w.path), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(w.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	w.f = f
	return nil
}

// rotate renames the file to <path>.1 if it is still the one this process has open and
// still too large for the next line, then reopens the path.
func (w *logWriter) rotate(next int64) error {
	lock, err := os.OpenFile(w.path+".lock", os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	defer lock.Close()
	ctx, cancel := context.WithTimeout(context.Background(), logLockWait)
	defer cancel()
	if err := Flock(ctx, int(lock.Fd())); err != nil {
		return fmt.Errorf("locking %s.lock: %w", w.path, err)
	}
	mine, err := w.f.Stat()
	if err != nil {
		return err
	}
	cur, err := os.Lstat(w.path)
	switch {
	case err == nil && os.SameFile(cur, mine) && cur.Size()+next > w.maxBytes:
		if err := os.Rename(w.path, w.path+".1"); err != nil {
			return err
		}
	case err != nil && !os.IsNotExist(err):
		return err
	}
	w.f.Close()
	w.f = nil
	return w.open()
}

// close closes the file, if open.
func (w *logWriter) close() {
	if w.f != nil {
		w.f.Close()
		w.f = nil
	}
}
