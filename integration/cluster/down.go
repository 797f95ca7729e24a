// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Down removes everything the lab in dir made, in reverse: the nodes' daemons and
// whatever they left in the nodes' cgroups (pods, shims), the control plane, the
// namespaces, links, cgroups and directories, then the run dir. It keeps going past
// errors and returns them all; with no lab in dir it does nothing.
func Down(dir string, log io.Writer) error {
	if os.Geteuid() != 0 {
		return errNotRoot
	}
	s, err := loadState(filepath.Join(dir, "state.json"))
	if err != nil || s == nil {
		if s == nil && err == nil {
			fmt.Fprintln(log, "no lab in", dir)
		}
		return err
	}
	var errs []error
	// The kubelets and kube-proxies first, so nothing recreates a pod, then the runtimes
	// (CRI-O leaves its pods' conmons running: they go with the node's cgroups below).
	for _, kind := range []string{"-kubelet", "-kube-proxy", "-containerd", "-crio"} {
		for _, p := range s.Procs {
			if strings.HasSuffix(p.Name, kind) {
				errs = append(errs, p.stop(10*time.Second))
			}
		}
	}
	// Pods and shims live on in the nodes' cgroups.
	for _, n := range s.Plan.Nodes {
		for _, cg := range []string{n.Cgroup, n.sysCgroup()} {
			errs = append(errs, killCgroup(cg))
		}
	}
	for i := len(s.Procs) - 1; i >= 0; i-- {
		errs = append(errs, s.Procs[i].stop(15*time.Second))
	}
	errs = append(errs, killCgroup("/"+s.Plan.Prefix+"-cp"))
	for i := len(s.Mounts) - 1; i >= 0; i-- {
		if err := unix.Unmount(s.Mounts[i], unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", s.Mounts[i], err))
		}
	}
	for i := len(s.Links) - 1; i >= 0; i-- {
		if l, err := netlink.LinkByName(s.Links[i]); err == nil {
			if err := netlink.LinkDel(l); err != nil {
				errs = append(errs, fmt.Errorf("deleting link %s: %w", s.Links[i], err))
			}
		}
	}
	for i := len(s.Cgroups) - 1; i >= 0; i-- {
		errs = append(errs, removeCgroup(s.Cgroups[i]))
	}
	for i := len(s.Dirs) - 1; i >= 0; i-- {
		// Removing a directory detaches every mount on it in other mount namespaces:
		// another lab's node (or other work) binding the same path would lose it.
		if pid := mountedElsewhere(s.Dirs[i]); pid != 0 {
			fmt.Fprintf(log, "left %s: the lab made it, but process %d's mount namespace has a mount on it\n", s.Dirs[i], pid)
			continue
		}
		err := os.Remove(s.Dirs[i])
		switch {
		case err == nil, errors.Is(err, os.ErrNotExist):
		case errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EBUSY):
			// Made by the lab, used by something else since (the lab's own files were
			// in the node's bind, never here): it is no longer the lab's to remove.
			fmt.Fprintf(log, "left %s: the lab made it, but other work uses it now\n", s.Dirs[i])
		default:
			errs = append(errs, fmt.Errorf("removing %s (the lab made it): %w", s.Dirs[i], err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w (state kept in %s: make cluster-down again)", err, s.Plan.StateFile)
	}
	// The node roots hold overlay snapshots whose files are root-only; nothing is
	// mounted there any more.
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("removing the run dir: %w", err)
	}
	fmt.Fprintln(log, "the lab in", dir, "is gone")
	return nil
}

// cgroupPids lists every pid in path and below, in the first hierarchy that has it.
func cgroupPids(path string) ([]int, error) {
	hs, err := hierarchies()
	if err != nil {
		return nil, err
	}
	seen := map[int]bool{}
	for _, h := range hs {
		root := filepath.Join(h, path)
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
			if err != nil {
				return nil
			}
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					seen[pid] = true
				}
			}
			return nil
		})
	}
	var pids []int
	for pid := range seen {
		pids = append(pids, pid)
	}
	sort.Ints(pids)
	return pids, nil
}

// killCgroup SIGKILLs every process in path and below until none is left.
func killCgroup(path string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		pids, err := cgroupPids(path)
		if err != nil {
			return err
		}
		var live []int
		for _, pid := range pids {
			if !zombie(pid) {
				live = append(live, pid)
			}
		}
		if len(live) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v survive in cgroup %s", live, path)
		}
		for _, pid := range live {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func zombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := strings.LastIndexByte(string(b), ')')
	return i >= 0 && strings.HasPrefix(strings.TrimSpace(string(b[i+1:])), "Z")
}

// removeCgroup removes path and every cgroup below it (the kubelet's kubepods tree),
// deepest first, in every hierarchy. A cgroup whose last process is a zombie not yet
// reaped cannot be removed yet: it retries for a while.
func removeCgroup(path string) error {
	hs, err := hierarchies()
	if err != nil {
		return err
	}
	var errs []error
	for _, h := range hs {
		root := filepath.Join(h, path)
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
		for _, d := range dirs {
			var err error
			for try := 0; try < 50; try++ {
				if err = os.Remove(d); err == nil || errors.Is(err, os.ErrNotExist) {
					err = nil
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("removing cgroup %s: %w", d, err))
			}
		}
	}
	return errors.Join(errs...)
}

// mountedElsewhere returns a process whose mount namespace has a mount on dir or below
// it, or 0.
func mountedElsewhere(dir string) int {
	ents, _ := os.ReadDir("/proc")
	seen := map[string]bool{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
		if err != nil || seen[ns] {
			continue
		}
		seen[ns] = true
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) > 4 {
				if mp := unescapeMount(f[4]); mp == dir || strings.HasPrefix(mp, dir+"/") {
					return pid
				}
			}
		}
	}
	return 0
}
