// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// startDaemon starts argv as a daemon that outlives the lab command (the lab stays up
// until Down): its own session, output appended to logs/<name>.log, recorded in the
// state before Start returns. A node's daemons are entered into the node's network and
// mount namespaces by nsenter, which execs in place, so the pid is the daemon's own.
func (s *State) startDaemon(name, cgroup string, argv []string, env []string) (Proc, error) {
	logFile := filepath.Join(s.Plan.Logs, name+".log")
	if err := os.MkdirAll(s.Plan.Logs, 0o755); err != nil {
		return Proc{}, err
	}
	f, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return Proc{}, err
	}
	defer f.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Dir = s.Plan.Dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return Proc{}, fmt.Errorf("starting %s (%s): %w", name, argv[0], err)
	}
	p := Proc{Name: name, Pid: cmd.Process.Pid, Log: logFile, Argv: argv, Env: env, Cgroup: cgroup}
	p.Start, _ = startTime(p.Pid)
	s.Procs = append(s.Procs, p)
	// Released, not waited for: the daemon lives on after this command exits.
	_ = cmd.Process.Release()
	if err := s.save(); err != nil {
		return p, err
	}
	// Its children (containerd's shims) start in the same cgroup: Down finds them there.
	return p, enterCgroup(cgroup, p.Pid)
}

// Restart stops the lab's daemon name (e.g. "pwlab-2-kubelet") and starts it again as
// it was started.
func Restart(dir, name string) error {
	if err := Stop(dir, name); err != nil {
		return err
	}
	return Start(dir, name)
}

// Stop stops the lab's daemon name (SIGTERM, then SIGKILL after 15 s) and keeps it in the
// state, so that Start brings it back as it was started (an API server outage) and Down
// still knows it.
func Stop(dir, name string) error {
	_, p, err := daemon(dir, name)
	if err != nil {
		return err
	}
	return p.stop(15 * time.Second)
}

// Start starts the lab's daemon name again as it was started, when it is not running.
func Start(dir, name string) error {
	s, p, err := daemon(dir, name)
	if err != nil {
		return err
	}
	if p.alive() {
		return fmt.Errorf("%s is running (pid %d): lab restart %s", name, p.Pid, name)
	}
	s.Procs = slices.DeleteFunc(s.Procs, func(q Proc) bool { return q.Name == name })
	_, err = s.startDaemon(p.Name, p.Cgroup, p.Argv, p.Env)
	return err
}

// daemon loads the lab's state and finds its daemon name.
func daemon(dir, name string) (*State, Proc, error) {
	s, err := loadState(filepath.Join(dir, "state.json"))
	if err != nil {
		return nil, Proc{}, err
	}
	if s == nil {
		return nil, Proc{}, fmt.Errorf("no lab in %s: run make cluster", dir)
	}
	for _, p := range s.Procs {
		if p.Name == name {
			return s, p, nil
		}
	}
	return nil, Proc{}, fmt.Errorf("the lab in %s runs no %s", dir, name)
}

// startTime reads field 22 of /proc/<pid>/stat (after the parenthesised comm).
func startTime(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("unparsable /proc/%d/stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// alive reports whether p is still the process the lab started and has not exited (a
// zombie counts as gone: its parent, PID 1 here, reaps it in its own time).
func (p Proc) alive() bool {
	st, err := startTime(p.Pid)
	if err != nil || st != p.Start {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i < 0 || !strings.HasPrefix(strings.TrimSpace(string(b[i+1:])), "Z")
}

// stop sends SIGTERM and escalates to SIGKILL after grace (a kube-apiserver was seen
// ignoring SIGTERM for over a minute).
func (p Proc) stop(grace time.Duration) error {
	if !p.alive() {
		return nil
	}
	_ = syscall.Kill(p.Pid, syscall.SIGTERM)
	if waitGone(p, grace) {
		return nil
	}
	_ = syscall.Kill(p.Pid, syscall.SIGKILL)
	if waitGone(p, 10*time.Second) {
		return nil
	}
	return fmt.Errorf("%s (pid %d) survived SIGKILL", p.Name, p.Pid)
}

func waitGone(p Proc, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if !p.alive() {
			return true
		}
		time.Sleep(100 * time.Millisecond)
	}
	return !p.alive()
}

// run runs a short command and returns its combined output in the error.
func run(argv ...string) (string, error) {
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// inNode prefixes argv so that it runs in n's network and mount namespaces.
func inNode(n Node, argv ...string) []string {
	return append([]string{"nsenter", "--net=" + n.NetNS, "--mount=" + n.MountNS, "--"}, argv...)
}

var errNotRoot = errors.New("the lab needs root (network and mount namespaces, cgroups)")
