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

// verdictTestFile points RunDir at a fresh directory for the test and returns a file
// to give verdicts about.
func verdictTestFile(t *testing.T) string {
	t.Helper()
	old := RunDir
	RunDir = t.TempDir()
	t.Cleanup(func() { RunDir = old })
	file := filepath.Join(t.TempDir(), "tool")
	if err := os.WriteFile(file, []byte("v1"), 0o755); err != nil {
		t.Fatal(err)
	}
	return file
}

// A verdict is computed once per file identity and extra, and again when either
// changes.
func TestFileVerdict(t *testing.T) {
	file := verdictTestFile(t)
	calls := 0
	verdict := func(want bool) func() bool { return func() bool { calls++; return want } }
	if !FileVerdict("t", file, "x", verdict(true)) || !FileVerdict("t", file, "x", verdict(false)) || calls != 1 {
		t.Fatalf("cached verdict: calls %d", calls)
	}
	if FileVerdict("t", file, "y", verdict(false)) || calls != 2 {
		t.Fatalf("another extra was not computed again: calls %d", calls)
	}
	time.Sleep(10 * time.Millisecond)
	if err := os.WriteFile(file, []byte("v2, longer"), 0o755); err != nil {
		t.Fatal(err)
	}
	if !FileVerdict("t", file, "y", verdict(true)) || calls != 3 {
		t.Fatalf("a changed file was not computed again: calls %d", calls)
	}
	if FileVerdict("t", filepath.Join(t.TempDir(), "missing"), "y", verdict(false)) || calls != 4 {
		t.Fatalf("a missing file: calls %d", calls)
	}
}

// Callers that miss the cache at once compute the verdict once: the others wait for
// it (as plugins starting together after an upgrade do).
func TestFileVerdictComputedOnceUnderConcurrency(t *testing.T) {
	file := verdictTestFile(t)
	var calls atomic.Int32
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !FileVerdict("t", file, "x", func() bool { calls.Add(1); time.Sleep(50 * time.Millisecond); return true }) {
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
// verdictLockWait they compute the verdict themselves.
func TestFileVerdictLockWaitIsBounded(t *testing.T) {
	file := verdictTestFile(t)
	oldWait := verdictLockWait
	verdictLockWait = 100 * time.Millisecond
	defer func() { verdictLockWait = oldWait }()
	unlock := lockVerdict("t") // a hung computation elsewhere
	if unlock == nil {
		t.Fatal("could not take the lock")
	}
	defer unlock()
	start := time.Now()
	if !FileVerdict("t", file, "x", func() bool { return true }) {
		t.Fatal("verdict false")
	}
	if d := time.Since(start); d < 100*time.Millisecond || d > 5*time.Second {
		t.Errorf("waited %v, want about verdictLockWait", d)
	}
}
