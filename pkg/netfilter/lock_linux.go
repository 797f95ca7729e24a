package netfilter

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/podwire/podwire/pkg/cniplumb"
)

// LockDir holds podwire's netfilter lock files. The lock serializes podwire's own
// read-modify-write cycles per backend and feature (list our chain, then change it), so
// two plugins never decide on the same stale listing; other programs are not
// affected. It is released by the kernel when the process dies, even by SIGKILL.
var LockDir = "/run/podwire"

func lockFeature(backend string, f Feature) (unlock func(), err error) {
	if err := os.MkdirAll(LockDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating lock directory %s: %w", LockDir, err)
	}
	return LockFile(filepath.Join(LockDir, backend+"-"+f.Name+".lock"))
}

// LockFile takes an exclusive flock on path (created 0600 if missing), waiting as
// long as it takes; unlock releases it, and so does the process's death.
func LockFile(path string) (unlock func(), err error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening lock %s: %w", path, err)
	}
	if err := cniplumb.Flock(context.Background(), fd); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	return func() { unix.Close(fd) }, nil
}
