package link

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Deleting a link takes the kernel two steps. The link leaves its namespace at once
// (its name and index are free, nothing can reach it), then the deleting task waits
// in rcu_barrier() for the link's memory to be freable: ~15-20 ms on a small VM, in
// which the deleting process can neither return nor exit. DeleteDetached lets a
// helper process (this executable, re-run with helperEnv) take that wait.

// helperEnv makes a podwire binary delete one link and exit (RunHelper).
const helperEnv = "PODWIRE_LINK_DELETE"

// helperNetnsFD is where the helper finds the namespace of the link (ExtraFiles[0]).
const helperNetnsFD = 3

// RunHelper runs the link-deleting helper and exits when this process is one; plugins
// that use DeleteDetached call it first thing in main.
func RunHelper() {
	v := os.Getenv(helperEnv)
	if v == "" {
		return
	}
	if err := runHelper(v); err != nil {
		fmt.Fprintf(os.Stderr, "podwire link helper: %v\n", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func runHelper(v string) error {
	idx, name, ok := strings.Cut(v, ":")
	index, err := strconv.Atoi(idx)
	if !ok || err != nil || index <= 0 {
		return fmt.Errorf("bad %s=%q", helperEnv, v)
	}
	runtime.LockOSThread()
	h, err := netlink.NewHandleAt(netns.NsHandle(helperNetnsFD))
	if err != nil {
		return fmt.Errorf("opening netlink in the link's namespace: %w", err)
	}
	defer h.Close()
	l, err := h.LinkByIndex(index)
	if IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if l.Attrs().Name != name {
		return nil // gone, and the index reused: not ours to delete
	}
	if err := h.LinkDel(l); err != nil && !IsNotFound(err) {
		return fmt.Errorf("deleting %s: %w", name, err)
	}
	return nil
}

// DeleteDetached deletes the link name in the namespace nsPath ("" for this thread's)
// and returns once it has left the namespace, leaving the kernel's wait for its memory
// to a helper process. A missing link is success. If the helper cannot be started or
// fails, the link is deleted here, waiting as DeleteByName does.
func DeleteDetached(nsPath, name string) error {
	var nsh netns.NsHandle
	var err error
	if nsPath == "" {
		nsh, err = netns.Get()
	} else {
		nsh, err = netns.GetFromPath(nsPath)
	}
	if err != nil {
		return fmt.Errorf("opening network namespace %s: %w", nsPath, err)
	}
	defer nsh.Close()
	h, err := netlink.NewHandleAt(nsh)
	if err != nil {
		return fmt.Errorf("opening netlink in %s: %w", nsPath, err)
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	if IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("looking up %s: %w", name, err)
	}
	index := l.Attrs().Index
	if err := startHelper(nsh, index, name, func() bool {
		_, err := h.LinkByIndex(index)
		return IsNotFound(err)
	}); err == nil {
		return nil
	}
	if err := h.LinkDel(l); err != nil && !IsNotFound(err) {
		return fmt.Errorf("deleting %s: %w", name, err)
	}
	return nil
}

// startHelper runs the helper for link index and waits until gone reports the link
// has left its namespace. An error means the caller must delete the link itself.
func startHelper(nsh netns.NsHandle, index int, name string, gone func() bool) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	fd, err := procNetnsFD(nsh)
	if err != nil {
		return err
	}
	nsFile := os.NewFile(uintptr(fd), "netns")
	defer nsFile.Close() // the child has its own copy once started
	cmd := exec.Command(self)
	cmd.Env = []string{helperEnv + "=" + strconv.Itoa(index) + ":" + name}
	cmd.ExtraFiles = []*os.File{nsFile}
	// Its own session, and none of our stdio: the runtime reading our output must not
	// wait for it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if gone() {
			return nil // the helper finishes (and is reaped, or inherited) on its own
		}
		select {
		case err := <-exited:
			if gone() {
				return nil
			}
			if err == nil {
				err = errors.New("the helper exited without deleting it")
			}
			return fmt.Errorf("deleting %s through a helper: %w", name, err)
		case <-time.After(200 * time.Microsecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("deleting %s through a helper: still there after 5 s", name)
		}
	}
}

// procNetnsFD opens the namespace nsh refers to again, through /proc. The helper may
// outlive this process by a grace period; if it held a descriptor of a bind-mounted
// namespace file (/run/netns/..., the runtime's), the runtime's unmount right after
// DEL would fail with EBUSY. A /proc descriptor pins the namespace, not that mount.
func procNetnsFD(nsh netns.NsHandle) (int, error) {
	type result struct {
		fd  int
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{-1, err}
			return
		}
		defer orig.Close()
		if err := netns.Set(nsh); err != nil {
			runtime.UnlockOSThread()
			ch <- result{-1, err}
			return
		}
		fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if rerr := netns.Set(orig); rerr != nil {
			// The thread stays locked and dies with this goroutine: it is in the wrong
			// namespace.
			if err == nil {
				unix.Close(fd)
			}
			ch <- result{-1, fmt.Errorf("returning to the original namespace: %w", rerr)}
			return
		}
		runtime.UnlockOSThread()
		ch <- result{fd, err}
	}()
	r := <-ch
	return r.fd, r.err
}
