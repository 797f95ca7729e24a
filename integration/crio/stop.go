// SPDX-License-Identifier: Apache-2.0

package crio

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// stopOnSignal handles SIGINT and SIGTERM while the daemon runs: without it a ^C ends
// the test binary without any cleanup, leaving CRI-O, conmon and the pods running.
func (d *Daemon) stopOnSignal() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case s := <-sigs:
			fmt.Fprintf(os.Stderr, "%v: stopping the test's CRI-O (%s) before exiting\n", s, d.Socket)
			d.stop()
			d.unpinMountNS(filepath.Dir(d.mntNS), d.mntNS)
			os.Exit(130)
		case <-done:
		}
	}()
	d.t.Cleanup(func() {
		signal.Stop(sigs)
		close(done)
	})
}

// stop removes every pod through CRI (as the kubelet does on a drain), stops CRI-O,
// kills any conmon (and its container) that outlived it and removes the test's
// cgroups. It runs once, from the test's cleanup or from the signal handler; the
// mount namespace pin is released after it.
func (d *Daemon) stop() { d.stopOnce.Do(d.doStop) }

func (d *Daemon) doStop() {
	t := d.t
	if d.running() {
		if out, err := d.Crictl("pods", "-q"); err == nil {
			for _, id := range strings.Fields(out) {
				if _, err := d.Crictl("stopp", id); err != nil {
					t.Logf("cleanup: %v", err)
				}
				if _, err := d.Crictl("rmp", "-f", id); err != nil {
					t.Logf("cleanup: %v", err)
				}
			}
		}
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.exited:
		case <-time.After(30 * time.Second):
			t.Logf("cleanup: CRI-O ignored SIGTERM for 30s; killing it")
			_ = d.cmd.Process.Kill()
			<-d.exited
		}
	}
	d.killMonitors()
	d.removeCgroups()
	d.removeDefaultCgroups()
}

// defaultCgroupParent is where CRI-O with cgroupfs puts pods that name no cgroup
// parent (critest's do).
const defaultCgroupParent = "crio"

// existingDefaultCgroups lists the hierarchies that already have CRI-O's default
// parent, so that stop removes only the ones this daemon made.
func existingDefaultCgroups() map[string]bool {
	m := map[string]bool{}
	found, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", defaultCgroupParent))
	for _, f := range found {
		m[f] = true
	}
	return m
}

// removeDefaultCgroups removes CRI-O's default cgroup parent, deepest first, from the
// hierarchies where it did not exist before Start.
func (d *Daemon) removeDefaultCgroups() {
	found, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", defaultCgroupParent))
	for _, top := range found {
		if d.cgroupsBefore[top] {
			continue
		}
		var dirs []string
		_ = filepath.WalkDir(top, func(path string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := os.Remove(dirs[i]); err != nil && !os.IsNotExist(err) {
				d.t.Errorf("cleanup: removing cgroup %s: %v", dirs[i], err)
			}
		}
	}
}

// killMonitors kills conmon processes working for this CRI-O (their arguments name
// paths below Dir) and their children, which only an unclean stop leaves.
func (d *Daemon) killMonitors() {
	procs, _ := filepath.Glob("/proc/[0-9]*")
	ppid := map[int]int{}
	var mons []int
	for _, p := range procs {
		pid, _ := strconv.Atoi(filepath.Base(p))
		if stat, err := os.ReadFile(p + "/stat"); err == nil {
			if i := strings.LastIndexByte(string(stat), ')'); i > 0 {
				if f := strings.Fields(string(stat[i+1:])); len(f) > 1 {
					ppid[pid], _ = strconv.Atoi(f[1])
				}
			}
		}
		cmdline, err := os.ReadFile(p + "/cmdline")
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		if filepath.Base(args[0]) == "conmon" && strings.Contains(string(cmdline), d.Dir+"/") {
			mons = append(mons, pid)
		}
	}
	for _, m := range mons {
		for pid, parent := range ppid {
			if parent == m {
				d.t.Logf("cleanup: killing pid %d left running under conmon %d", pid, m)
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		d.t.Logf("cleanup: killing conmon %d that outlived CRI-O", m)
		_ = syscall.Kill(m, syscall.SIGKILL)
	}
}

// Cgroups lists the directories below CgroupParent in every hierarchy.
func (d *Daemon) Cgroups() []string { return d.cgroupDirs(false) }

func (d *Daemon) cgroupDirs(withParent bool) []string {
	var out []string
	parents, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", d.CgroupParent))
	for _, p := range parents {
		_ = filepath.WalkDir(p, func(path string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() && (withParent || path != p) {
				out = append(out, path)
			}
			return nil
		})
	}
	return out
}

// removeCgroups removes CgroupParent and everything below it, deepest first (cgroup
// directories are removed with rmdir, never recursively). A cgroup that still has a
// process gets a few tries: a killed conmon takes a moment to leave.
func (d *Daemon) removeCgroups() {
	dirs := d.cgroupDirs(true)
	for i := len(dirs) - 1; i >= 0; i-- {
		var err error
		for try := 0; try < 20; try++ {
			if err = os.Remove(dirs[i]); err == nil || os.IsNotExist(err) {
				err = nil
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			d.t.Errorf("cleanup: removing cgroup %s: %v", dirs[i], err)
		}
	}
}
