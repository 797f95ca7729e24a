package netfilter

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/podwire/podwire/pkg/forkchild"
)

// releaseEnv makes the binary wait for EOF on stdin and exit: the fallback child of
// DetachSockets when no `cat` is installed (see RunSocketHolder).
const releaseEnv = "PODWIRE_PORTMAP_RELEASE"

// RunSocketHolder makes this process the socket-holding child of DetachSockets when it
// was started as one: it waits for its parent to exit, then exits. Plugins that call
// DetachSockets call it first thing in main.
func RunSocketHolder() {
	if os.Getenv(releaseEnv) == "1" {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}
}

// DetachSockets hands every NETLINK_NETFILTER socket of this process to a short-lived
// child, so that this process can exit without waiting. Call it after the process's
// last netfilter call.
//
// Why: nf_tables frees deleted rules after an RCU grace period, in a work item; the
// release of *any* nfnetlink socket waits for that work to finish
// (nft_rcv_nl_event -> nf_tables_trans_destroy_flush_work). A DEL that has just deleted
// rules would otherwise pay one grace period (~10 ms) at exit, when its socket closes,
// though its rules are already gone (the batch was acknowledged). The child holds the
// last reference to the sockets and pays the wait instead, off the runtime's path; it
// exits after this process.
// Nothing depends on the child: if it cannot start, the wait simply stays here.
//
// Where the kernel expedites RCU grace periods (/sys/kernel/rcu_expedited), the wait
// is a few microseconds and forking costs more than it saves: nothing is handed off;
// neither when every CPU is busy (forkchild.Worthwhile).
func DetachSockets() {
	if graceIsExpedited() || !forkchild.Worthwhile() {
		return
	}
	fds := netfilterSocketFDs()
	if len(fds) == 0 {
		return
	}
	// A forked child (no exec) holds them; where that cannot run, `cat` (or this
	// binary, see RunSocketHolder) on a pipe.
	if forkchild.Hold(fds) == nil {
		return
	}
	var files []*os.File
	for _, fd := range fds {
		d, err := unix.Dup(fd)
		if err != nil {
			continue
		}
		files = append(files, os.NewFile(uintptr(d), "nfnetlink"))
	}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	// The child must outlive this process: it blocks reading a pipe whose only
	// writer is this process, and gets EOF when this process exits.
	r, w, err := os.Pipe()
	if err != nil {
		return
	}
	defer r.Close()
	var cmd *exec.Cmd
	if p, err := exec.LookPath("cat"); err == nil {
		cmd = exec.Command(p)
	} else if self, err := os.Executable(); err == nil {
		cmd = exec.Command(self)
		cmd.Env = []string{releaseEnv + "=1"}
	} else {
		w.Close()
		return
	}
	cmd.Stdin = r
	cmd.ExtraFiles = files
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		return
	}
	// Neither the child nor w is waited for or closed: w closes when this process
	// exits, the child then reads EOF and exits, and whoever inherits it reaps it.
	// The runtime does not wait for it: it holds none of our output pipes.
	detachedWriter = w
	_ = cmd.Process.Release()
}

// graceIsExpedited reports whether synchronize_rcu is expedited on this kernel
// (rcu_expedited set and rcu_normal not), which makes the socket release wait short.
func graceIsExpedited() bool {
	exp, err := os.ReadFile("/sys/kernel/rcu_expedited")
	if err != nil || strings.TrimSpace(string(exp)) != "1" {
		return false
	}
	normal, err := os.ReadFile("/sys/kernel/rcu_normal")
	return err != nil || strings.TrimSpace(string(normal)) != "1"
}

// detachedWriter keeps the child's pipe open until exit (and from the collector).
var detachedWriter *os.File

// netfilterSocketFDs lists this process's file descriptors that are netlink sockets of
// protocol NETLINK_NETFILTER, matched by inode against /proc/self/net/netlink.
func netfilterSocketFDs() []int {
	inodes := map[string]bool{}
	f, err := os.Open("/proc/self/net/netlink")
	if err != nil {
		return nil
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fl := strings.Fields(sc.Text())
		if len(fl) >= 10 && fl[1] == "12" { // NETLINK_NETFILTER
			inodes[fl[9]] = true
		}
	}
	f.Close()
	if len(inodes) == 0 {
		return nil
	}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil
	}
	var fds []int
	for _, e := range ents {
		link, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err != nil || !strings.HasPrefix(link, "socket:[") {
			continue
		}
		if inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] {
			if fd, err := strconv.Atoi(e.Name()); err == nil {
				fds = append(fds, fd)
			}
		}
	}
	return fds
}
