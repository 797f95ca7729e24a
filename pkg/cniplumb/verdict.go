// SPDX-License-Identifier: Apache-2.0

package cniplumb

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultVerdictLockWait bounds the wait for another process's computation of a
// verdict: a compute that hangs must not stall every later plugin.
const DefaultVerdictLockWait = 2 * time.Second

// Verdicts caches verdicts about files (is this nft new enough, is this host-local the
// same build) in Dir, keyed by the file's identity (device, inode, size, mtime, ctime)
// plus an extra string, so that only the first call after the file (or extra) changed
// computes one. Dir is a tmpfs on a node (DefaultRunDir): a reboot (or a new kernel)
// computes again. The zero value uses DefaultRunDir and DefaultVerdictLockWait; tests
// pass their own directory.
type Verdicts struct {
	Dir      string        // "" is DefaultRunDir
	LockWait time.Duration // 0 is DefaultVerdictLockWait
}

// FileVerdict is Verdicts{}.File: the node's verdict cache in DefaultRunDir.
func FileVerdict(name, path, extra string, compute func() bool) bool {
	return Verdicts{}.File(name, path, extra, compute)
}

func (v Verdicts) dir() string {
	if v.Dir == "" {
		return DefaultRunDir
	}
	return v.Dir
}

// File returns compute's verdict about the file at path, cached under name. Without a
// usable Dir the verdict is computed every time.
func (v Verdicts) File(name, path, extra string, compute func() bool) bool {
	yes, found, key := v.cached(name, path, extra)
	if found {
		return yes
	}
	if key == "" {
		return compute()
	}
	// Many plugins starting at once after an upgrade would all compute the same
	// verdict: one does, the others wait for it and read the cache.
	if unlock := v.lock(name); unlock != nil {
		defer unlock()
		if yes, found, key = v.cached(name, path, extra); found {
			return yes
		}
	}
	ok := compute()
	verdict := "no"
	if ok {
		verdict = "yes"
	}
	dir := v.dir()
	cache := filepath.Join(dir, name)
	if os.MkdirAll(dir, 0o700) == nil {
		tmp := fmt.Sprintf("%s.%d", cache, os.Getpid())
		if os.WriteFile(tmp, []byte(key+"\n"+verdict+"\n"), 0o600) == nil {
			if os.Rename(tmp, cache) != nil {
				_ = os.Remove(tmp)
			}
		}
	}
	return ok
}

// Cached returns the verdict File cached for the file as it is now; found is false
// when there is none (compute it with File).
func (v Verdicts) Cached(name, path, extra string) (yes, found bool) {
	yes, found, _ = v.cached(name, path, extra)
	return yes, found
}

// cached also returns the key for the file as it is now ("" if it cannot be stat'ed).
func (v Verdicts) cached(name, path, extra string) (yes, found bool, key string) {
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil {
		return false, false, ""
	}
	key = fmt.Sprintf("%s %d %d %d %d %d %s", path, st.Dev, st.Ino, st.Size, st.Mtim.Nano(), st.Ctim.Nano(), extra)
	if b, err := os.ReadFile(filepath.Join(v.dir(), name)); err == nil {
		if k, val, ok := strings.Cut(strings.TrimSpace(string(b)), "\n"); ok && k == key {
			return val == "yes", true, key
		}
	}
	return false, false, key
}

// lock takes an exclusive flock on Dir/name.lock, waiting at most LockWait; nil when
// it cannot, and the verdict is then computed unserialized.
func (v Verdicts) lock(name string) (unlock func()) {
	dir := v.dir()
	if os.MkdirAll(dir, 0o700) != nil {
		return nil
	}
	fd, err := unix.Open(filepath.Join(dir, name+".lock"), unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil
	}
	wait := v.LockWait
	if wait == 0 {
		wait = DefaultVerdictLockWait
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if Flock(ctx, fd) != nil {
		unix.Close(fd)
		return nil
	}
	return func() { unix.Close(fd) }
}
