// SPDX-License-Identifier: Apache-2.0

package containerd

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// stopOnSignal handles SIGINT and SIGTERM while the daemon runs. Without it a ^C ends
// the test binary without running any cleanup, leaving containerd, its shims and the
// pods running; with it they are stopped first, and then the binary exits as the
// signal would have made it.
func (d *Daemon) stopOnSignal() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case s := <-sigs:
			fmt.Fprintf(os.Stderr, "%v: stopping the test's containerd (%s) before exiting\n", s, d.Socket)
			d.stop()
			os.Exit(130)
		case <-done:
		}
	}()
	d.t.Cleanup(func() {
		signal.Stop(sigs)
		close(done)
	})
}

// stop removes every pod through CRI (as kubelet would on drain), stops containerd,
// then kills any shim (and its container processes) that outlived it and removes the
// test's cgroups. It logs what it had to force, since that means an unclean stop.
// It runs once, from the test's cleanup or from the signal handler.
func (d *Daemon) stop() { d.stopOnce.Do(d.doStop) }

func (d *Daemon) doStop() {
	t := d.t
	if d.running() {
		if out, err := d.Crictl("pods", "-q"); err == nil {
			for _, id := range strings.Fields(out) {
				if _, err := d.Crictl("stopp", id); err != nil {
					t.Logf("cleanup: %v", err)
				}
				if _, err := d.Crictl("rmp", id); err != nil {
					t.Logf("cleanup: %v", err)
				}
			}
		}
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.exited:
		case <-time.After(15 * time.Second):
			t.Logf("cleanup: containerd ignored SIGTERM for 15s; killing it")
			_ = d.cmd.Process.Kill()
			<-d.exited
		}
	}
	d.killShims()
	d.removeCgroups()
	for i := len(d.machineDirs) - 1; i >= 0; i-- {
		_ = os.Remove(d.machineDirs[i]) // only if empty: never anything we did not create
	}
}

// killShims finds shims serving this containerd (their -address is our socket) and
// kills their children (the pods' pause processes) and then the shims themselves.
func (d *Daemon) killShims() {
	procs, _ := filepath.Glob("/proc/[0-9]*")
	ppid := map[int]int{}
	var shims []int
	var leftovers []string // files the killed shims' sandboxes leave outside Dir
	for _, p := range procs {
		pid, _ := strconv.Atoi(filepath.Base(p))
		if stat, err := os.ReadFile(p + "/stat"); err == nil {
			// "pid (comm) state ppid ...": comm may contain spaces, so cut after ')'.
			if i := bytes.LastIndexByte(stat, ')'); i > 0 {
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
		if !strings.HasPrefix(filepath.Base(args[0]), "containerd-shim") {
			continue
		}
		var addr, ns, id string
		for i := 0; i+1 < len(args); i++ {
			switch args[i] {
			case "-address":
				addr = args[i+1]
			case "-namespace":
				ns = args[i+1]
			case "-id":
				id = args[i+1]
			}
		}
		if addr != d.Socket {
			continue
		}
		shims = append(shims, pid)
		// containerd 1.6 puts shim sockets in /run/containerd/s/ under a hash of
		// (address, namespace, id); a killed shim leaves its socket behind.
		sum := sha256.Sum256([]byte(filepath.Join(addr, ns, id)))
		leftovers = append(leftovers, filepath.Join(shimSocketDir, hex.EncodeToString(sum[:])))
		// A sandbox whose CNI DEL never ran leaves libcni's cached result behind
		// (sandbox IDs are 64 hex digits, so the pattern matches only its entries).
		if len(id) == 64 {
			cached, _ := filepath.Glob(filepath.Join(LibcniCacheDir, "results", "*-"+id+"-*"))
			leftovers = append(leftovers, cached...)
		}
	}
	for _, shim := range shims {
		for pid, parent := range ppid {
			if parent == shim {
				d.t.Logf("cleanup: killing pid %d left running under containerd shim %d", pid, shim)
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		d.t.Logf("cleanup: killing containerd shim %d that outlived containerd", shim)
		_ = syscall.Kill(shim, syscall.SIGKILL)
	}
	for deadline := time.Now().Add(10 * time.Second); len(shims) > 0 && time.Now().Before(deadline); {
		alive := shims[:0]
		for _, pid := range shims {
			if syscall.Kill(pid, 0) == nil {
				alive = append(alive, pid)
			}
		}
		shims = alive
		time.Sleep(100 * time.Millisecond)
	}
	for _, f := range leftovers {
		if err := os.Remove(f); err == nil {
			d.t.Logf("cleanup: removed %s", f)
		}
	}
}

// removeCgroups removes CgroupParent and everything below it in every hierarchy,
// deepest first (cgroup directories are removed with rmdir, never recursively).
func (d *Daemon) removeCgroups() {
	dirs := d.cgroupDirs(true)
	for i := len(dirs) - 1; i >= 0; i-- {
		// Walk order puts parents first, so reverse order removes children first.
		if err := os.Remove(dirs[i]); err != nil && !os.IsNotExist(err) {
			d.t.Errorf("cleanup: removing cgroup %s: %v", dirs[i], err)
		}
	}
}
