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
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/podwire/podwire/pkg/forkchild"
)

// Deleting a link takes the kernel two steps. The link leaves its namespace at once
// (its name and index are free, nothing can reach it), then the deleting task waits
// in rcu_barrier() for the link's memory to be freable: ~15-20 ms on a small VM, in
// which the deleting process can neither return nor exit. DeleteDetached lets another
// process take that wait: a forked child that only sends the request (forkDelete), or,
// where that cannot run, this executable re-run as a helper (helperEnv).

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

// DeleteDetached deletes the link name in the namespace nsPath ("" for the calling
// thread's: the process's own, since podwire switches namespaces only on locked
// threads) and returns once it has left the namespace, leaving the kernel's wait for
// its memory to a child process. A missing link is success. If no child can do it, or
// a fork would not pay for itself (forkchild.Worthwhile: every CPU busy, as when many
// pods are deleted at once), the link is deleted here, waiting as DeleteByName does. The child of a plugin that
// exits first is reaped by whoever inherits it (init, or the runtime if it is a
// subreaper).
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
	gone := func() bool {
		_, err := h.LinkByIndex(index)
		return IsNotFound(err)
	}
	if forkchild.Worthwhile() {
		if pid, err := forkDelete(nsh, index); err == nil && waitGone(pid, gone) == nil {
			return nil
		}
		if err := startHelper(nsh, index, name, gone); err == nil {
			return nil
		}
	}
	if err := h.LinkDel(l); err != nil && !IsNotFound(err) {
		return fmt.Errorf("deleting %s: %w", name, err)
	}
	return nil
}

// waitGone waits until gone reports the link has left its namespace, after the
// forked child pid sent the deletion. If the child has exited and the link is still
// there, the deletion failed (the child cannot say why): the caller deletes it itself.
func waitGone(pid int, gone func() bool) error {
	deadline := time.Now().Add(10 * time.Second)
	pause := 50 * time.Microsecond
	for !gone() {
		if forkchild.Exited(pid) {
			if gone() {
				return nil
			}
			return errors.New("the forked deletion did not delete it")
		}
		if time.Now().After(deadline) {
			return errors.New("the link is still there 10 s after the forked deletion")
		}
		time.Sleep(pause)
		pause = min(2*pause, 2*time.Millisecond)
	}
	return nil
}

// forkDelete sends RTM_DELLINK for index, on a netlink socket in nsh, from a forked
// child (forkchild.Send) that exits once the kernel is done; it returns as soon as
// the child exists, with its pid.
func forkDelete(nsh netns.NsHandle, index int) (int, error) {
	fd, err := netlinkSocketIn(nsh)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd) // the child has its own copy
	req := nl.NewNetlinkRequest(unix.RTM_DELLINK, 0)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(index)
	req.AddData(msg)
	return forkchild.Send(fd, req.Serialize())
}

// netlinkSocketIn opens a NETLINK_ROUTE socket in nsh (a socket belongs to the
// namespace it was created in).
func netlinkSocketIn(nsh netns.NsHandle) (int, error) {
	var fd int
	err := inNetns(nsh, func() error {
		var err error
		fd, err = unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
		return err
	})
	return fd, err
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
	deadline := time.Now().Add(10 * time.Second)
	pause := 100 * time.Microsecond
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
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("deleting %s through a helper: still there after 10 s", name)
		}
		time.Sleep(pause)
		pause = min(2*pause, 2*time.Millisecond)
	}
}

// procNetnsFD opens the namespace nsh refers to again, through /proc. The helper may
// outlive this process by a grace period; if it held a descriptor of a bind-mounted
// namespace file (/run/netns/..., the runtime's), the runtime's unmount right after
// DEL would fail with EBUSY. A /proc descriptor pins the namespace, not that mount.
func procNetnsFD(nsh netns.NsHandle) (int, error) {
	var fd int
	err := inNetns(nsh, func() error {
		var err error
		fd, err = unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		return err
	})
	return fd, err
}

// inNetns runs f on a thread switched into nsh, and switches it back. A thread that
// cannot be switched back is not reused: its goroutine ends with it locked.
func inNetns(nsh netns.NsHandle, f func() error) error {
	ch := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			ch <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(nsh); err != nil {
			runtime.UnlockOSThread()
			ch <- err
			return
		}
		ferr := f()
		if err := netns.Set(orig); err != nil {
			ch <- fmt.Errorf("returning to the original namespace: %w", err)
			return
		}
		runtime.UnlockOSThread()
		ch <- ferr
	}()
	return <-ch
}
