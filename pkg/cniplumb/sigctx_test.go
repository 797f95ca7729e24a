// SPDX-License-Identifier: Apache-2.0

package cniplumb

import (
	"context"
	"errors"
	"os"
	"syscall"
	"testing"
	"time"
)

// TestSignalContextInstallsOnDone: SIGTERM after Done ends the context and its
// children (without the handler the signal would kill the test binary).
func TestSignalContextInstallsOnDone(t *testing.T) {
	c := newSignalContext()
	defer c.release()
	if c.Err() != nil || c.Value("k") != nil {
		t.Fatal("a fresh context is not done and has no values")
	}
	if _, ok := c.Deadline(); ok {
		t.Fatal("a fresh context has no deadline")
	}
	done := c.Done()
	if c.Done() != done {
		t.Fatal("Done returns a different channel the second time")
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("SIGTERM did not end the context")
	}
	if !errors.Is(c.Err(), context.Canceled) {
		t.Fatalf("Err after SIGTERM: %v", c.Err())
	}
	// A derived context follows it.
	child, cancel := context.WithCancel(c)
	defer cancel()
	select {
	case <-child.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a derived context did not end")
	}
}

func TestSignalContextReleaseWithoutDone(t *testing.T) {
	c := newSignalContext()
	c.release() // nothing was installed; must not panic
	if c.Err() != nil {
		t.Fatal(c.Err())
	}
}
