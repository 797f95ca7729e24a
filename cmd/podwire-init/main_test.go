// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// The tests run supervise in the test process, with this test binary as the "agent"
// (and its orphans), chosen by $PODWIRE_INIT_TEST_CHILD. Each child reports on fd 3.
const childEnv = "PODWIRE_INIT_TEST_CHILD"

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(child(mode))
	}
	os.Exit(m.Run())
}

func child(mode string) int {
	report := os.NewFile(3, "report")
	switch mode {
	case "exit3":
		return 3
	case "sigkill":
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	case "signals":
		// Exit with the number of the first forwarded signal that arrives.
		c := make(chan os.Signal, 1)
		signal.Notify(c, forwarded...)
		fmt.Fprintln(report, "ready")
		return int((<-c).(syscall.Signal))
	case "orphan", "stubborn-orphan":
		// Leave a grandchild running and exit once it is ready: it is reparented to init.
		gc := exec.Command(os.Args[0])
		gc.Env = append(os.Environ(), childEnv+"=sleep")
		if mode == "stubborn-orphan" {
			gc.Env = append(os.Environ(), childEnv+"=ignore-term")
		}
		r, w, err := os.Pipe()
		if err != nil {
			return 1
		}
		gc.ExtraFiles = []*os.File{w}
		if err := gc.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		w.Close()
		ready := bufio.NewScanner(r)
		if !ready.Scan() {
			return 1
		}
		fmt.Fprintln(report, ready.Text())
		return 0
	case "sleep":
		fmt.Fprintln(report, os.Getpid())
		time.Sleep(time.Minute)
		return 0
	case "ignore-term":
		signal.Ignore(syscall.SIGTERM)
		fmt.Fprintln(report, os.Getpid())
		time.Sleep(time.Minute)
		return 0
	}
	return 99
}

// start runs supervise on this test binary in the given mode, in a goroutine; report
// yields the child's lines on fd 3 and code supervise's result.
func start(t *testing.T, mode string, grace time.Duration) (report *bufio.Scanner, code <-chan int) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	attr := &os.ProcAttr{Env: append(os.Environ(), childEnv+"="+mode), Files: []*os.File{os.Stdin, os.Stdout, os.Stderr, w}}
	c := make(chan int, 1)
	go func() {
		c <- supervise([]string{os.Args[0]}, attr, grace)
		w.Close() // a child that never reported ends the scan
	}()
	return bufio.NewScanner(r), c
}

func wait(t *testing.T, code <-chan int, within time.Duration) int {
	t.Helper()
	select {
	case c := <-code:
		return c
	case <-time.After(within):
		t.Fatalf("supervise did not return within %v", within)
	}
	return 0
}

func TestExitStatus(t *testing.T) {
	for _, tc := range []struct {
		mode string
		want int
	}{
		{"exit3", 3},
		{"sigkill", 128 + 9},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			_, code := start(t, tc.mode, time.Second)
			if got := wait(t, code, 10*time.Second); got != tc.want {
				t.Errorf("exit code %d, want %d", got, tc.want)
			}
		})
	}
}

func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		ws   syscall.WaitStatus
		want int
	}{
		{0, 0},
		{3 << 8, 3},
		{255 << 8, 255},
		{syscall.WaitStatus(syscall.SIGTERM), 143},
		{syscall.WaitStatus(syscall.SIGKILL) | 0x80, 137}, // with a core dump flag
	} {
		if got := exitCode(tc.ws); got != tc.want {
			t.Errorf("exitCode(%#x) = %d, want %d", uint32(tc.ws), got, tc.want)
		}
	}
}

func TestNotFound(t *testing.T) {
	if got := supervise([]string{"podwire-init-no-such-command"}, &os.ProcAttr{}, time.Second); got != 127 {
		t.Errorf("exit code %d, want 127", got)
	}
}

// TestForwardsSignals: each forwarded signal init receives reaches the agent (which
// exits with its number, so the code proves which one arrived).
func TestForwardsSignals(t *testing.T) {
	for _, sig := range forwarded {
		t.Run(sig.String(), func(t *testing.T) {
			report, code := start(t, "signals", time.Second)
			if !report.Scan() || report.Text() != "ready" {
				t.Fatalf("child did not get ready: %v", report.Err())
			}
			if err := syscall.Kill(os.Getpid(), sig.(syscall.Signal)); err != nil {
				t.Fatal(err)
			}
			if got, want := wait(t, code, 10*time.Second), int(sig.(syscall.Signal)); got != want {
				t.Errorf("exit code %d, want %d (the signal's number)", got, want)
			}
		})
	}
}

// TestOrphans: an orphan the agent left running is reaped after the agent exits, by
// SIGTERM, or by SIGKILL after the grace when it ignores SIGTERM; init returns the
// agent's status.
func TestOrphans(t *testing.T) {
	for _, tc := range []struct {
		mode     string
		min, max time.Duration
	}{
		{"orphan", 0, 1500 * time.Millisecond},
		{"stubborn-orphan", 700 * time.Millisecond, 5 * time.Second},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			begin := time.Now()
			report, code := start(t, tc.mode, 700*time.Millisecond)
			if !report.Scan() {
				t.Fatalf("no orphan pid: %v", report.Err())
			}
			pid, err := strconv.Atoi(report.Text())
			if err != nil {
				t.Fatal(err)
			}
			if got := wait(t, code, 10*time.Second); got != 0 {
				t.Errorf("exit code %d, want the agent's 0", got)
			}
			if d := time.Since(begin); d < tc.min || d > tc.max {
				t.Errorf("supervise returned after %v, want %v-%v", d, tc.min, tc.max)
			}
			// Reaped, not merely killed: a zombie would still answer kill(pid, 0).
			if err := syscall.Kill(pid, 0); err != syscall.ESRCH {
				t.Errorf("orphan %d still exists after init returned (kill: %v)", pid, err)
			}
		})
	}
}
