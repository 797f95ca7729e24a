// SPDX-License-Identifier: Apache-2.0

// Command pid1 is TestPluginsUnderPID1's runtime: started as PID 1 of a fresh pid
// namespace, it runs CNI verbs through libcni as containerd and CRI-O do, and after each
// call lists every other process of its pid namespace, alive or zombie. Like a runtime
// run as PID 1 (a kind or k3s-in-docker node, a test harness), it reaps only the
// children it started itself (os/exec's Wait: wait4 on their pids); anything a plugin
// leaves behind is reparented to it and stays visible.
//
// It needs CLONE_NEWNS as well, to mount its own /proc. It reads one JSON request per line on stdin and answers each with one JSON line on
// stdout (the test's pid1Request and pid1Response mirror the types here); it exits when
// stdin closes, and the kernel then ends whatever is left in the namespace.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
)

// request is one libcni call.
type request struct {
	Verb           string // ADD, CHECK, DEL, GC, STATUS
	HostNS         string // the netns the plugins run in
	BinDir         string
	CacheDir       string
	Conflist       json.RawMessage
	ContainerID    string
	NetNS          string
	IfName         string
	CapabilityArgs map[string]any
	Valid          []types.GCAttachment // GC's cni.dev/valid-attachments
}

// response is the call's outcome and the namespace's other processes afterwards.
type response struct {
	Err    string   // the call's error, "" on success
	Others []string // every process of the pid namespace but this one: "pid comm state"
}

func main() {
	if os.Getpid() != 1 {
		fmt.Fprintf(os.Stderr, "pid1: I am pid %d, not PID 1 of my pid namespace: start me with CLONE_NEWPID\n", os.Getpid())
		os.Exit(2)
	}
	// A /proc of this pid namespace, in a mount namespace of our own (CLONE_NEWNS) made
	// a slave first, so nothing propagates back to the host while the netns the test
	// mounts later still appear here. The plugins need it: they find their own netns
	// as /proc/<getpid()>/task/<tid>/ns/net, as in any container.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		fmt.Fprintln(os.Stderr, "pid1: making / a slave mount (start me with CLONE_NEWNS):", err)
		os.Exit(2)
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		fmt.Fprintln(os.Stderr, "pid1: mounting /proc:", err)
		os.Exit(2)
	}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(nil, 1<<20)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var req request
		var resp response
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			resp.Err = fmt.Sprintf("bad request: %v", err)
		} else if err := call(req); err != nil {
			resp.Err = err.Error()
		}
		var err error
		if resp.Others, err = others(); err != nil {
			resp.Err = fmt.Sprintf("%s; listing processes: %v", resp.Err, err)
		}
		if err := out.Encode(resp); err != nil {
			fmt.Fprintln(os.Stderr, "pid1:", err)
			os.Exit(1)
		}
	}
}

func call(req request) error {
	list, err := libcni.ConfListFromBytes(req.Conflist)
	if err != nil {
		return err
	}
	cni := libcni.NewCNIConfigWithCacheDir([]string{req.BinDir}, req.CacheDir, nil)
	rt := &libcni.RuntimeConf{ContainerID: req.ContainerID, NetNS: req.NetNS, IfName: req.IfName, CapabilityArgs: req.CapabilityArgs}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	host, err := ns.GetNS(req.HostNS)
	if err != nil {
		return err
	}
	defer host.Close()
	// Plugins exec'd from inside Do inherit the locked thread's netns.
	return host.Do(func(ns.NetNS) error {
		switch req.Verb {
		case "ADD":
			_, err := cni.AddNetworkList(ctx, list, rt)
			return err
		case "CHECK":
			return cni.CheckNetworkList(ctx, list, rt)
		case "DEL":
			return cni.DelNetworkList(ctx, list, rt)
		case "GC":
			return cni.GCNetworkList(ctx, list, &libcni.GCArgs{ValidAttachments: req.Valid})
		case "STATUS":
			return cni.GetStatusNetworkList(ctx, list)
		}
		return fmt.Errorf("unknown verb %q", req.Verb)
	})
}

// others lists the processes in this pid namespace but this one: everything in our
// /proc (the ns/pid check only guards against a /proc that is not ours; a zombie keeps
// its pid namespace until it is reaped).
func others() ([]string, error) {
	self, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return nil, err
	}
	me, err := os.Readlink("/proc/self") // "1"
	if err != nil {
		return nil, err
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil || e.Name() == me {
			continue
		}
		if l, err := os.Readlink(filepath.Join("/proc", e.Name(), "ns/pid")); err != nil || l != self {
			continue // gone meanwhile, or another namespace's
		}
		out = append(out, e.Name()+" "+stat(e.Name()))
	}
	sort.Strings(out)
	return out, nil
}

// stat is "comm state" from /proc/<pid>/stat (comm may hold spaces and parentheses).
func stat(pid string) string {
	b, err := os.ReadFile(filepath.Join("/proc", pid, "stat"))
	if err != nil {
		return "? ?"
	}
	s := string(b)
	open, close := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || close < open {
		return "? ?"
	}
	rest := strings.Fields(s[close+1:])
	state := "?"
	if len(rest) > 0 {
		state = rest[0]
	}
	return s[open+1:close] + " " + state
}
