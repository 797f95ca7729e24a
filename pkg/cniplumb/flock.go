// SPDX-License-Identifier: Apache-2.0

package cniplumb

import (
	"context"
	"errors"

	"golang.org/x/sys/unix"
)

// Flock takes an exclusive flock on fd, waiting until ctx ends; then it returns
// ctx's error, and the caller must close fd (a lock the abandoned wait may still get
// belongs to that closed file and is dropped when the wait returns). A context that
// never ends (Done nil) waits in the calling thread; Done is asked for only once the
// lock is found taken.
func Flock(ctx context.Context, fd int) error {
	err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
	if !errors.Is(err, unix.EWOULDBLOCK) {
		return err
	}
	cancelled := ctx.Done() // before the wait starts: a signal handler may go in here
	if cancelled == nil {
		return flockWait(fd)
	}
	done := make(chan error, 1)
	go func() { done <- flockWait(fd) }()
	select {
	case err := <-done:
		return err
	case <-cancelled:
		return ctx.Err()
	}
}

func flockWait(fd int) error {
	for {
		if err := unix.Flock(fd, unix.LOCK_EX); err != unix.EINTR {
			return err
		}
	}
}
