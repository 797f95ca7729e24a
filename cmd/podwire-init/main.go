// SPDX-License-Identifier: Apache-2.0

// Command podwire-init is PID 1 of podwire-agent's container:
//
//	/podwire-init /podwire-agent [agent flags...]
//
// It starts the command it is given (the agent), forwards SIGTERM, SIGINT, SIGHUP,
// SIGQUIT, SIGUSR1 and SIGUSR2 to it, reaps every child that comes its way (the agent,
// and the orphans of whatever the agent runs: CNI plugins for GC and STATUS, and
// anything those leave behind), and exits with the agent's exit status (128+signal when
// a signal killed it). Orphans still running then get SIGTERM and, after a short grace,
// SIGKILL, so the container stops cleanly. See README.md next to this file for why the
// agent does not reap for itself.
package main

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// forwarded are the signals a container runtime or an operator sends to stop, reload or
// debug the agent; init passes each on and acts on none itself.
var forwarded = []os.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}

// orphanGrace is how long orphans have to exit on SIGTERM once the agent has exited,
// before SIGKILL; well inside the DaemonSet's terminationGracePeriodSeconds.
const orphanGrace = 2 * time.Second

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: podwire-init COMMAND [ARG...] (the image runs /podwire-init /podwire-agent)")
		os.Exit(2)
	}
	os.Exit(supervise(os.Args[1:], &os.ProcAttr{Env: os.Environ(), Files: []*os.File{os.Stdin, os.Stdout, os.Stderr}}, orphanGrace))
}

// supervise runs argv as the main child and returns the exit code init should exit
// with. Outside PID 1 (a test, `docker run --init`, a shared pid namespace) it makes
// itself a child subreaper, so orphans still come to it.
func supervise(argv []string, attr *os.ProcAttr, grace time.Duration) int {
	// Subscribe before starting the child: a child that dies at once must not be missed.
	sigs := make(chan os.Signal, 32)
	signal.Notify(sigs, append([]os.Signal{syscall.SIGCHLD}, forwarded...)...)
	defer signal.Stop(sigs)
	if os.Getpid() != 1 {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			fmt.Fprintf(os.Stderr, "podwire-init: becoming a child subreaper (orphans would escape): %v\n", err)
		}
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		fmt.Fprintf(os.Stderr, "podwire-init: %v\n", err)
		return 127
	}
	// os.StartProcess, not exec.Cmd: init must be the only waiter (wait4(-1) below), and
	// the *os.Process signals through a pidfd, which cannot hit a reused pid.
	child, err := os.StartProcess(path, argv, attr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "podwire-init: starting %s: %v\n", path, err)
		return 126
	}
	code := -1
	for code < 0 {
		s := <-sigs
		if s != syscall.SIGCHLD {
			// ESRCH (the child is exiting) is fine: its SIGCHLD is on its way.
			_ = child.Signal(s)
			continue
		}
		done, _ := reap()
		for _, r := range done {
			if r.pid == child.Pid {
				code = exitCode(r.status)
			}
		}
	}
	_ = child.Release()
	stopOrphans(sigs, grace)
	return code
}

type reaped struct {
	pid    int
	status syscall.WaitStatus
}

// reap collects every child that has exited, any child, and returns them, and whether
// children are left (running, or exiting right now).
func reap() (out []reaped, left bool) {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, unix.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || pid <= 0 { // ECHILD: none left; 0: none exited yet
			return out, err != syscall.ECHILD
		}
		out = append(out, reaped{pid, ws})
	}
}

// exitCode is the shell's convention: the exit status, or 128+signal.
func exitCode(ws syscall.WaitStatus) int {
	switch {
	case ws.Exited():
		return ws.ExitStatus()
	case ws.Signaled():
		return 128 + int(ws.Signal())
	}
	return 1
}

// stopOrphans ends what is left once the main child exited: SIGTERM to every remaining
// process, SIGKILL after grace, each reaped.
func stopOrphans(sigs <-chan os.Signal, grace time.Duration) {
	if _, left := reap(); !left {
		return
	}
	signalRest(syscall.SIGTERM)
	deadline := time.NewTimer(grace)
	defer deadline.Stop()
	for {
		select {
		case s := <-sigs:
			if s != syscall.SIGCHLD {
				continue
			}
			if _, left := reap(); !left {
				return
			}
		case <-deadline.C:
			// Again until none is left: outside PID 1 a killed child's own children come
			// to init only after it died.
			for {
				signalRest(syscall.SIGKILL)
				if _, left := reap(); !left {
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
}

// signalRest sends sig to every process init may have to wait for. As PID 1 that is
// kill(-1): every process of the pid namespace but init. Elsewhere kill(-1) would reach
// the whole host, so only init's own children (orphans included, as a subreaper) get it.
func signalRest(sig syscall.Signal) {
	if os.Getpid() == 1 {
		_ = syscall.Kill(-1, sig)
		return
	}
	for _, pid := range children() {
		_ = syscall.Kill(pid, sig)
	}
}

// children lists init's children from /proc/self/task/*/children (each thread's own:
// Go forks from any thread). Orphans reparented to a subreaper appear there too.
func children() []int {
	files, _ := filepath.Glob("/proc/self/task/*/children")
	var pids []int
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // the thread exited
		}
		for _, field := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(field); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}
