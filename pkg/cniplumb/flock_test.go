// SPDX-License-Identifier: Apache-2.0

package cniplumb

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestFlock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	open := func() int {
		fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		return fd
	}
	holder := open()
	if err := Flock(context.Background(), holder); err != nil {
		t.Fatalf("free lock: %v", err)
	}
	waiter := open()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := Flock(ctx, waiter); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("held lock with a deadline: %v, want the deadline's error", err)
	}
	unix.Close(waiter)
	// A wait without an end returns once the holder lets go.
	go func() { time.Sleep(50 * time.Millisecond); unix.Close(holder) }()
	again := open()
	defer unix.Close(again)
	if err := Flock(context.Background(), again); err != nil {
		t.Fatalf("after release: %v", err)
	}
}
