// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/podwire/podwire/integration/nodestate"
)

// sysctlDirs are the /proc/sys trees a lab's programs could write: the kubelet's kernel
// defaults and keyring limits, kube-proxy's conntrack and forwarding settings, the
// bridge netfilter switches.
var sysctlDirs = []string{"vm", "kernel/keys", "net/ipv4/conf/all", "net/ipv4/conf/default", "net/ipv4/ip_forward",
	"net/ipv4/ip_local_port_range", "net/bridge", "net/netfilter", "fs/inotify", "kernel/panic", "kernel/panic_on_oops"}

// volatileSysctls change on their own.
var volatileSysctls = map[string]bool{"net/netfilter/nf_conntrack_count": true, "vm/stat_refresh": true}

// MachineSnapshot is the machine's state that the lab could change, as sorted text: the
// network (links, addresses, routes, rules in both backends, qdiscs, sysctls, via
// nodestate), mounts, cgroups, the sysctls the kubelet and kube-proxy write, the bind
// targets of the node dirs, and the processes in the lab's cgroups or naming its prefix.
func MachineSnapshot(prefix, dir string) (string, error) {
	snap, err := nodestate.Take("")
	if err != nil {
		return "", err
	}
	var b strings.Builder
	keys := make([]string, 0, len(snap))
	for k := range snap {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "== %s\n%s\n", k, strings.TrimRight(snap[k], "\n"))
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	var mounts []string
	for _, l := range strings.Split(string(mi), "\n") {
		if f := strings.Fields(l); len(f) > 4 {
			mounts = append(mounts, f[4]+" "+fstype(f))
		}
	}
	section(&b, "mounts", mounts)
	hs, err := hierarchies()
	if err != nil {
		return "", err
	}
	var cgs []string
	for _, h := range hs {
		ents, _ := os.ReadDir(h)
		for _, e := range ents {
			if e.IsDir() {
				cgs = append(cgs, filepath.Join(h, e.Name()))
			}
		}
	}
	section(&b, "cgroups", cgs)
	var sys []string
	for _, d := range sysctlDirs {
		_ = filepath.Walk(filepath.Join("/proc/sys", d), func(p string, info os.FileInfo, err error) error {
			if err != nil || info.IsDir() || volatileSysctls[strings.TrimPrefix(p, "/proc/sys/")] {
				return nil
			}
			if v, err := os.ReadFile(p); err == nil {
				sys = append(sys, strings.TrimPrefix(p, "/proc/sys/")+" = "+strings.Join(strings.Fields(string(v)), " "))
			}
			return nil
		})
	}
	section(&b, "kernel sysctls", sys)
	var dirs []string
	for _, d := range append(NodeDirs, "/opt/containerd") {
		if _, err := os.Stat(d); err == nil {
			dirs = append(dirs, d)
		}
	}
	if ents, err := os.ReadDir("/run/netns"); err == nil {
		for _, e := range ents {
			dirs = append(dirs, "/run/netns/"+e.Name())
		}
	}
	section(&b, "dirs", dirs)
	section(&b, "lab processes", labProcs(prefix, dir))
	return b.String(), nil
}

func fstype(f []string) string {
	for i, x := range f {
		if x == "-" && i+1 < len(f) {
			return f[i+1]
		}
	}
	return "?"
}

// labProcs are the processes in a cgroup of prefix's or whose command line names a file
// in the run dir (not another lab's: each has its own prefix and dir).
func labProcs(prefix, dir string) []string {
	ents, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || zombie(pid) { // a zombie is gone; PID 1 reaps it in its own time
			continue
		}
		cg, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		line := strings.ReplaceAll(string(cmd), "\x00", " ")
		if strings.Contains(string(cg), ":/"+prefix+"-") || strings.Contains(line, filepath.Clean(dir)+"/") {
			out = append(out, e.Name()+" "+line)
		}
	}
	return out
}

func section(b *strings.Builder, name string, lines []string) {
	sort.Strings(lines)
	fmt.Fprintf(b, "== %s\n%s\n", name, strings.Join(lines, "\n"))
}
