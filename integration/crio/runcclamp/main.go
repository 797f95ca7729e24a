// SPDX-License-Identifier: Apache-2.0

// Command runcclamp is the OCI runtime path of the CRI-O harness and of the lab's
// CRI-O nodes (see integration/crio). It takes out of a bundle's spec what this kind of
// machine cannot honour, as containerd does itself, then execs runc in its place with
// the same arguments: no process of its own is left.
//
//   - Where root lacks CAP_SYS_RESOURCE the kernel refuses any oom_score_adj below the
//     caller's own, so runc fails every infra container CRI-O asks for with
//     oom_score_adj -998 ("can't get final child's PID from pipe: EOF"): it raises
//     process.oomScoreAdj to its own score (containerd's restrict_oom_score_adj).
//   - Where the kernel has the hugetlb controller but no hierarchy mounts it, runc fails
//     the hugetlb limits CRI-O copies from the kubelet: it drops them (containerd's
//     tolerate_missing_hugetlb_controller).
//
// On a machine with neither quirk it changes nothing.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

const runc = "/usr/sbin/runc"

func main() {
	if err := clamp(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "runcclamp: %v\n", err)
		os.Exit(1)
	}
	args := append([]string{runc}, os.Args[1:]...)
	if err := syscall.Exec(runc, args, os.Environ()); err != nil {
		fmt.Fprintf(os.Stderr, "runcclamp: exec %s: %v\n", runc, err)
		os.Exit(1)
	}
}

// runcValueFlags are runc's global flags that take their value as the next argument.
var runcValueFlags = map[string]bool{"--root": true, "--log": true, "--log-format": true, "--criu": true, "--rootless": true}

// clamp rewrites <bundle>/config.json when the command is create or run and the
// spec asks for a lower oom_score_adj than this process has, or for hugetlb limits
// without a hugetlb cgroup.
func clamp(args []string) error {
	cmd, bundle := "", "."
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case cmd == "" && runcValueFlags[a] && i+1 < len(args):
			i++ // a global flag's value (conmon passes --root DIR), not the command
		case cmd == "" && !strings.HasPrefix(a, "-"):
			cmd = a
		case cmd != "" && (a == "--bundle" || a == "-b") && i+1 < len(args):
			bundle = args[i+1]
			i++
		case cmd != "" && strings.HasPrefix(a, "--bundle="):
			bundle = strings.TrimPrefix(a, "--bundle=")
		}
	}
	if cmd != "create" && cmd != "run" {
		return nil
	}
	own, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		return err
	}
	floor, err := strconv.Atoi(strings.TrimSpace(string(own)))
	if err != nil {
		return err
	}
	path := filepath.Join(bundle, "config.json")
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	// UseNumber: a spec's 64-bit limits must come back as they were, not as float64.
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var spec map[string]any
	if err := dec.Decode(&spec); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	changed := false
	if proc, _ := spec["process"].(map[string]any); proc != nil {
		if n, ok := proc["oomScoreAdj"].(json.Number); ok {
			v, err := n.Int64()
			if err != nil {
				return err
			}
			if int(v) < floor {
				proc["oomScoreAdj"] = floor
				changed = true
			}
		}
	}
	// CRI-O asks for hugetlb limits (the kubelet sends one per page size) whenever
	// /proc/cgroups lists the controller, even where no hugetlb hierarchy is mounted
	// (this machine), and runc then fails with "cannot set hugetlb limit: container
	// could not join or create cgroup". containerd drops them in that case
	// (tolerate_missing_hugetlb_controller); so does this.
	if linux, _ := spec["linux"].(map[string]any); linux != nil && !hugetlbMounted() {
		if res, _ := linux["resources"].(map[string]any); res != nil {
			if _, ok := res["hugepageLimits"]; ok {
				delete(res, "hugepageLimits")
				changed = true
			}
		}
	}
	if !changed {
		return nil
	}
	out, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	return os.WriteFile(path, out, 0o644)
}

// hugetlbMounted reports whether a cgroup v1 hierarchy with the hugetlb controller, or
// the unified hierarchy with hugetlb enabled, is mounted here.
func hugetlbMounted() bool {
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return true // cannot tell: leave the spec as CRI-O wrote it
	}
	for _, l := range strings.Split(string(mi), "\n") {
		pre, post, ok := strings.Cut(l, " - ")
		if !ok {
			continue
		}
		f := strings.Fields(post)
		if len(f) < 3 {
			continue
		}
		switch f[0] {
		case "cgroup":
			for _, o := range strings.Split(f[2], ",") {
				if o == "hugetlb" {
					return true
				}
			}
		case "cgroup2":
			// Only the unified mode's /sys/fs/cgroup: a hybrid machine's
			// /sys/fs/cgroup/unified lists every controller no v1 hierarchy took
			// (hugetlb among them), but runc then sets limits in v1 hierarchies only.
			if mp := strings.Fields(pre); len(mp) > 4 && mp[4] == "/sys/fs/cgroup" {
				if b, err := os.ReadFile(filepath.Join(mp[4], "cgroup.controllers")); err == nil && strings.Contains(string(b), "hugetlb") {
					return true
				}
			}
		}
	}
	return false
}
