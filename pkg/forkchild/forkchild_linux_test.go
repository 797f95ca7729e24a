package forkchild

import (
	"bufio"
	"errors"
	"io"
	"os"
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The test binary doubles as a process that calls Hold on its descriptor 3 and exits
// a moment later.
func TestMain(m *testing.M) {
	if os.Getenv("FORKCHILD_TEST_HOLD") == "1" {
		if err := Hold([]int{3}); err != nil {
			os.Stdout.WriteString("error " + err.Error() + "\n")
			os.Exit(1)
		}
		unix.Close(3) // our own copy: the child's keeps the pipe open
		os.Stdout.WriteString("ready\n")
		time.Sleep(300 * time.Millisecond)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestSupported(t *testing.T) {
	if !Supported() {
		t.Skip("close_range(2) missing: the plugins fall back to other ways")
	}
}

// TestSend: the child writes the message, and keeps none of the parent's other
// descriptors (a pipe the parent closes reads EOF at once), through clone(CLONE_VM)
// where the architecture has it and through a plain fork.
func TestSend(t *testing.T) {
	before := vmNext.Load()
	t.Run("default", testSend)
	if haveCloneVM && vmNext.Load() == before {
		t.Error("Send did not use clone(CLONE_VM)")
	}
	vmOff = true
	defer func() { vmOff = false }()
	t.Run("fork", testSend)
}

func testSend(t *testing.T) {
	if !Supported() {
		t.Skip("close_range(2) missing")
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	or, ow, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer or.Close()
	if _, err := Send(int(w.Fd()), []byte("hello")); err != nil {
		t.Fatal(err)
	}
	w.Close()
	ow.Close()
	got, err := io.ReadAll(r)
	if err != nil || string(got) != "hello" {
		t.Errorf("read %q, %v", got, err)
	}
	done := make(chan error, 1)
	go func() { _, err := or.Read(make([]byte, 1)); done <- err }()
	select {
	case err := <-done:
		if !errors.Is(err, io.EOF) {
			t.Errorf("other pipe: %v, want EOF", err)
		}
	case <-time.After(2 * time.Second):
		t.Error("the child kept a descriptor it was not given")
	}
}

// TestHold: after the holding process closed its own copy, the child keeps the pipe
// open until that process has exited; then it closes it.
func TestHold(t *testing.T) {
	if !Supported() {
		t.Skip("close_range(2) missing")
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "FORKCHILD_TEST_HOLD=1")
	cmd.ExtraFiles = []*os.File{w}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	line, _ := bufio.NewReader(out).ReadString('\n')
	if line != "ready\n" {
		t.Fatalf("holder said %q", line)
	}
	rfd := int(r.Fd()) // Fd() sets blocking mode: take it once
	if err := unix.SetNonblock(rfd, true); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Read(rfd, make([]byte, 1)); !errors.Is(err, unix.EAGAIN) {
		t.Errorf("pipe while the holder runs: %v, want EAGAIN (still open)", err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		n, err := unix.Read(rfd, make([]byte, 1))
		if n == 0 && err == nil {
			return // EOF: the child let go
		}
		if time.Now().After(deadline) {
			t.Fatalf("pipe still open 2 s after the holder exited (%v)", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
