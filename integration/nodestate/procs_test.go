// SPDX-License-Identifier: Apache-2.0

package nodestate

import (
	"os"
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestParseStat(t *testing.T) {
	p, err := parseStat("4242 (a (weird) name) Z 17 4242 4242 0 -1 4194560 90 0 0 0 0 0 0 0 20 0 1 0 987654 0 0\n")
	if err != nil {
		t.Fatal(err)
	}
	if want := (Proc{PID: 4242, PPID: 17, Comm: "a (weird) name", State: "Z", Start: 987654}); p != want {
		t.Errorf("parseStat = %+v, want %+v", p, want)
	}
	if _, err := parseStat("4242 (short) S 1"); err == nil {
		t.Error("a short line parsed")
	}
}

// A child and its own child show as descendants while they run, and a child that
// exited is still one, as a zombie, until it is waited for.
func TestDescendants(t *testing.T) {
	before, err := Descendants(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-c", "sleep 30 & wait")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	var got []Proc
	for i := 0; i < 100; i++ {
		now, err := Descendants(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		if got = NewProcs(before, now); len(got) == 2 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(got) != 2 || got[0].PID != cmd.Process.Pid || got[1].PPID != cmd.Process.Pid || got[1].Comm != "sleep" {
		t.Fatalf("new descendants %v; want sh (pid %d) and its sleep", got, cmd.Process.Pid)
	}
	// Kill the sleep only: sh reaps it and exits; until Wait, sh is a zombie.
	if err := unix.Kill(got[1].PID, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var left []Proc
	for i := 0; i < 200; i++ {
		now, _ := Descendants(os.Getpid())
		if left = NewProcs(before, now); len(left) == 1 && left[0].State == "Z" {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(left) != 1 || left[0].State != "Z" || left[0].PID != cmd.Process.Pid {
		t.Fatalf("after the sleep was killed: %v; want sh as a zombie", left)
	}
	_ = cmd.Wait()
	now, _ := Descendants(os.Getpid())
	if left := NewProcs(before, now); len(left) != 0 {
		t.Errorf("after Wait: %v", left)
	}
}
