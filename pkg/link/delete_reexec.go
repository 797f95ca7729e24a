// SPDX-License-Identifier: Apache-2.0

package link

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Deleting a link takes the kernel two steps: the link leaves its namespace at once
// (RTM_DELLINK goes out, its name and index are free), then the deleting task waits for
// its memory to be freeable (an RCU barrier, ~15-35 ms on a small VM). DeleteOffExit
// leaves that second wait to a child: this executable run again (os/exec, never a raw
// fork) with deleteEnv set, which sends the deletion; the caller returns on the
// kernel's RTM_DELLINK for the link.

// deleteEnv makes a podwire binary delete one link and exit (RunDeleteChild); its value
// is "<ifindex>:<name>", the namespace is the child's fd 3.
const deleteEnv = "PODWIRE_LINK_DELETE"

// RunDeleteChild deletes the link named in deleteEnv and exits, when this process was
// started by DeleteOffExit; otherwise it returns at once. Plugins that use
// DeleteOffExit call it first thing in main.
func RunDeleteChild() {
	v, ok := os.LookupEnv(deleteEnv)
	if !ok {
		return
	}
	if err := runDeleteChild(v); err != nil {
		fmt.Fprintf(os.Stderr, "podwire link delete: %v\n", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func runDeleteChild(v string) error {
	idx, name, ok := strings.Cut(v, ":")
	index, err := strconv.Atoi(idx)
	if !ok || err != nil || index <= 0 {
		return fmt.Errorf("bad %s=%q", deleteEnv, v)
	}
	h, err := netlink.NewHandleAt(netns.NsHandle(3), unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("opening netlink in the link's namespace: %w", err)
	}
	l, err := h.LinkByIndex(index)
	if IsNotFound(err) || err == nil && l.Attrs().Name != name {
		return nil // gone already (and maybe the index reused): not ours
	}
	if err == nil {
		err = h.LinkDel(l)
	}
	if err != nil && !IsNotFound(err) {
		return fmt.Errorf("deleting %s: %w", name, err)
	}
	return nil
}

// DeleteOffExit deletes the link name in the namespace at nsPath ("" for the calling
// thread's) and returns once the kernel has announced that the link left it (its
// RTM_DELLINK, on a subscription opened before the deletion). The kernel's wait after
// that is a child's: this executable re-run through /proc/self/exe (the same binary,
// even if replaced on disk since; the plugin's main must call RunDeleteChild). Nobody
// waits for the child to finish: it usually outlives the plugin, which exits right
// after DEL, and is then orphaned to init, or to the nearest ancestor that made itself
// a child subreaper (PR_SET_CHILD_SUBREAPER; the runtime, if it did), which reaps it;
// if it exits first, the goroutine started here reaps it. It gets none of the plugin's
// stdio (its own session, /dev/null), so a runtime reading the plugin's output does
// not wait for it.
//
// A missing link is success; a missing namespace is an error matching fs.ErrNotExist.
// If the child cannot be started, fails, or sends nothing within 10 s, the link is
// deleted here, and the call waits out the kernel's wait itself.
func DeleteOffExit(nsPath, name string) error {
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
	h, err := netlink.NewHandleAt(nsh, unix.NETLINK_ROUTE)
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
	if waitChildDelete(nsh, l.Attrs().Index, name) == nil {
		return nil
	}
	if err := h.LinkDel(l); err != nil && !IsNotFound(err) {
		return fmt.Errorf("deleting %s: %w", name, err)
	}
	return nil
}

// waitChildDelete starts the child for link index and waits for its RTM_DELLINK. An
// error means the link may still be there and the caller deletes it itself.
func waitChildDelete(nsh netns.NsHandle, index int, name string) error {
	updates := make(chan netlink.LinkUpdate, 16)
	done := make(chan struct{})
	defer close(done)
	if err := netlink.LinkSubscribeWithOptions(updates, done, netlink.LinkSubscribeOptions{Namespace: &nsh}); err != nil {
		return err
	}
	fd, err := nsfsFD(nsh)
	if err != nil {
		return err
	}
	nsFile := os.NewFile(uintptr(fd), "netns")
	defer nsFile.Close() // the child has its own copy once started
	cmd := exec.Command("/proc/self/exe")
	cmd.Env = []string{deleteEnv + "=" + strconv.Itoa(index) + ":" + name}
	cmd.ExtraFiles = []*os.File{nsFile} // fd 3
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case u, ok := <-updates:
			if !ok {
				return errors.New("the link subscription ended")
			}
			if u.Header.Type == unix.RTM_DELLINK && int(u.Index) == index {
				return nil
			}
		case err := <-exited:
			return err // exit 0: the link is gone, the event just not read yet
		case <-timeout:
			return errors.New("no RTM_DELLINK 10 s after starting the child")
		}
	}
}

// nsfsFD returns a new descriptor (close-on-exec) of the namespace nsh refers to that
// does not go through nsh's mount: SIOCGSKNS on a socket made in the namespace. The
// child may outlive this process by the kernel's wait; a descriptor of the runtime's
// bind mount (/run/netns/...) would make its unmount right after DEL fail with EBUSY.
func nsfsFD(nsh netns.NsHandle) (int, error) {
	s, err := nl.GetNetlinkSocketAt(nsh, netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		return -1, err
	}
	defer s.Close()
	return unix.IoctlRetInt(s.GetFd(), unix.SIOCGSKNS)
}
