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

// FileVerdict returns compute's verdict about the file at path, cached in RunDir under
// name and keyed by the file's identity (device, inode, size, mtime, ctime) plus
// extra, so that only the first call after the file (or extra) changed computes it.
// RunDir is a tmpfs: a reboot (or a new kernel) computes again. Without a usable
// RunDir the verdict is computed every time.
func FileVerdict(name, path, extra string, compute func() bool) bool {
	yes, found, key := cachedVerdict(name, path, extra)
	if found {
		return yes
	}
	if key == "" {
		return compute()
	}
	// Many plugins starting at once after an upgrade would all compute the same
	// verdict: one does, the others wait for it and read the cache.
	if unlock := lockVerdict(name); unlock != nil {
		defer unlock()
		if yes, found, key = cachedVerdict(name, path, extra); found {
			return yes
		}
	}
	ok := compute()
	verdict := "no"
	if ok {
		verdict = "yes"
	}
	cache := filepath.Join(RunDir, name)
	if os.MkdirAll(RunDir, 0o700) == nil {
		tmp := fmt.Sprintf("%s.%d", cache, os.Getpid())
		if os.WriteFile(tmp, []byte(key+"\n"+verdict+"\n"), 0o600) == nil {
			if os.Rename(tmp, cache) != nil {
				_ = os.Remove(tmp)
			}
		}
	}
	return ok
}

// CachedVerdict returns the verdict FileVerdict cached for the file as it is now;
// found is false when there is none (compute it with FileVerdict).
func CachedVerdict(name, path, extra string) (yes, found bool) {
	yes, found, _ = cachedVerdict(name, path, extra)
	return yes, found
}

// cachedVerdict also returns the key for the file as it is now ("" if it cannot be
// stat'ed).
func cachedVerdict(name, path, extra string) (yes, found bool, key string) {
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil {
		return false, false, ""
	}
	key = fmt.Sprintf("%s %d %d %d %d %d %s", path, st.Dev, st.Ino, st.Size, st.Mtim.Nano(), st.Ctim.Nano(), extra)
	if b, err := os.ReadFile(filepath.Join(RunDir, name)); err == nil {
		if k, v, ok := strings.Cut(strings.TrimSpace(string(b)), "\n"); ok && k == key {
			return v == "yes", true, key
		}
	}
	return false, false, key
}

// lockVerdict takes an exclusive flock on RunDir/name.lock, waiting at most
// verdictLockWait (a compute that hangs must not stall every later plugin); nil when
// it cannot, and the verdict is then computed unserialized.
func lockVerdict(name string) (unlock func()) {
	if os.MkdirAll(RunDir, 0o700) != nil {
		return nil
	}
	fd, err := unix.Open(filepath.Join(RunDir, name+".lock"), unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), verdictLockWait)
	defer cancel()
	if Flock(ctx, fd) != nil {
		unix.Close(fd)
		return nil
	}
	return func() { unix.Close(fd) }
}

// verdictLockWait bounds the wait for another process's computation of a verdict.
var verdictLockWait = 2 * time.Second
