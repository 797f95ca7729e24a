// SPDX-License-Identifier: Apache-2.0

package cniplumb

import (
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// verdictTestFile returns a verdict cache in a fresh directory for the test and a file
// to give verdicts about.
func verdictTestFile(t *testing.T) (Verdicts, string) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "tool")
	if err := os.WriteFile(file, []byte("v1"), 0o755); err != nil {
		t.Fatal(err)
	}
	return Verdicts{Dir: t.TempDir()}, file
}

// A verdict is computed once per file identity and extra, and again when either
// changes.
func TestVerdictsFile(t *testing.T) {
	v, file := verdictTestFile(t)
	calls := 0
	verdict := func(want bool) func() bool { return func() bool { calls++; return want } }
	if !v.File("t", file, "x", verdict(true)) || !v.File("t", file, "x", verdict(false)) || calls != 1 {
		t.Fatalf("cached verdict: calls %d", calls)
	}
	if v.File("t", file, "y", verdict(false)) || calls != 2 {
		t.Fatalf("another extra was not computed again: calls %d", calls)
	}
	if yes, found := v.Cached("t", file, "y"); yes || !found {
		t.Fatalf("Cached = %v, %v; want the computed false", yes, found)
	}
	if _, found := (Verdicts{Dir: t.TempDir()}).Cached("t", file, "y"); found {
		t.Fatal("a verdict is found in another directory: the cache is not in Dir")
	}
	time.Sleep(10 * time.Millisecond)
	if err := os.WriteFile(file, []byte("v2, longer"), 0o755); err != nil {
		t.Fatal(err)
	}
	if !v.File("t", file, "y", verdict(true)) || calls != 3 {
		t.Fatalf("a changed file was not computed again: calls %d", calls)
	}
	if v.File("t", filepath.Join(t.TempDir(), "missing"), "y", verdict(false)) || calls != 4 {
		t.Fatalf("a missing file: calls %d", calls)
	}
}

// Callers that miss the cache at once compute the verdict once: the others wait for
// it (as plugins starting together after an upgrade do).
func TestVerdictsFileComputedOnceUnderConcurrency(t *testing.T) {
	v, file := verdictTestFile(t)
	var calls atomic.Int32
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !v.File("t", file, "x", func() bool { calls.Add(1); time.Sleep(50 * time.Millisecond); return true }) {
				t.Error("verdict false")
			}
		}()
	}
	wg.Wait()
	if n := calls.Load(); n != 1 {
		t.Errorf("computed %d times, want once", n)
	}
}

// A computation that holds the lock too long does not stall the others: after
// LockWait they compute the verdict themselves.
func TestVerdictsFileLockWaitIsBounded(t *testing.T) {
	v, file := verdictTestFile(t)
	v.LockWait = 100 * time.Millisecond
	unlock := v.lock("t") // a hung computation elsewhere
	if unlock == nil {
		t.Fatal("could not take the lock")
	}
	defer unlock()
	start := time.Now()
	if !v.File("t", file, "x", func() bool { return true }) {
		t.Fatal("verdict false")
	}
	if d := time.Since(start); d < 100*time.Millisecond || d > 5*time.Second {
		t.Errorf("waited %v, want about LockWait", d)
	}
}
