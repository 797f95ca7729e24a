package cniplumb

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// FileVerdict returns compute's verdict about the file at path, cached in RunDir under
// name and keyed by the file's identity (device, inode, size, mtime, ctime) plus
// extra, so that only the first call after the file (or extra) changed computes it.
// RunDir is a tmpfs: a reboot (or a new kernel) computes again. Without a usable
// RunDir the verdict is computed every time.
func FileVerdict(name, path, extra string, compute func() bool) bool {
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil {
		return compute()
	}
	key := fmt.Sprintf("%s %d %d %d %d %d %s", path, st.Dev, st.Ino, st.Size, st.Mtim.Nano(), st.Ctim.Nano(), extra)
	cache := filepath.Join(RunDir, name)
	if b, err := os.ReadFile(cache); err == nil {
		if k, v, ok := strings.Cut(strings.TrimSpace(string(b)), "\n"); ok && k == key {
			return v == "yes"
		}
	}
	ok := compute()
	verdict := "no"
	if ok {
		verdict = "yes"
	}
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
