// Package forkchild starts short-lived children that take a wait off a plugin's way out:
// a forked copy of the process that runs a few raw system calls on memory prepared
// before the fork, then exits. It is not a general fork: nothing in the child may call
// into the Go runtime (allocate, grow the stack, schedule), which is not usable in a
// forked copy of a multi-threaded process, so each child program is written out here.
//
// Common to both programs: all signals are blocked across the fork (none is ever
// handled in the child), the child first closes every descriptor it does not need (the
// runtime reading the plugin's stdout must see EOF when the plugin exits, and an open
// namespace file would keep its bind mount busy), and the child is reaped by whoever
// inherits it when the plugin exits.
package forkchild

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Supported reports whether the kernel has close_range(2) (Linux 5.9), which the
// children need to drop descriptors without a loop; an inverted range is EINVAL where
// it exists.
func Supported() bool {
	_, _, e := syscall.RawSyscall(unix.SYS_CLOSE_RANGE, 1, 0, 0)
	return e != syscall.ENOSYS
}

// Send forks a child that writes msg to fd (a netlink socket, say, whose kernel side
// blocks the writer until the request is done) and exits. It returns once the child
// exists; the child cannot report how the write went.
func Send(fd int, msg []byte) error {
	if len(msg) == 0 {
		return errors.New("forkchild: empty message")
	}
	return fork([]int{fd}, fd, uintptr(unsafe.Pointer(&msg[0])), uintptr(len(msg)), -1)
}

// holdPipe is the write end of Hold's pipe: open until this process exits.
var holdPipe *os.File

// Hold forks a child that keeps fds open until this process has exited, then exits
// (closing them): the kernel's work on closing them is the child's. Call it at most
// once, after the last use of fds; closing this process's own copies is then free.
func Hold(fds []int) error {
	if holdPipe != nil {
		return errors.New("forkchild: Hold called twice")
	}
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	rfd := int(r.Fd())
	keep := append(slices.Clone(fds), rfd)
	var b [1]byte
	if err := fork(keep, -1, 0, 0, rfd, &b); err != nil {
		w.Close()
		return err
	}
	holdPipe = w
	return nil
}

// fork starts the child: it closes every descriptor not in keep, writes n bytes at
// ptr to writeFD (if >= 0), reads one byte from readFD (if >= 0; EOF when the parent
// has exited), and exits.
//
//go:norace
//go:nocheckptr
//go:noinline
func fork(keep []int, writeFD int, ptr, n uintptr, readFD int, buf ...*[1]byte) error {
	if !Supported() {
		return errors.New("forkchild: close_range(2) is missing")
	}
	// The ranges to close, computed before the fork: [lo, hi] pairs around keep.
	slices.Sort(keep)
	ranges := make([]uintptr, 0, 2*len(keep)+2)
	lo := uintptr(0)
	for _, k := range keep {
		if k < 0 {
			return fmt.Errorf("forkchild: bad descriptor %d", k)
		}
		if uintptr(k) > lo {
			ranges = append(ranges, lo, uintptr(k)-1)
		}
		lo = uintptr(k) + 1
	}
	ranges = append(ranges, lo, uintptr(^uint32(0)))
	var rb uintptr
	if readFD >= 0 {
		if len(buf) == 0 || buf[0] == nil {
			return errors.New("forkchild: no read buffer")
		}
		rb = uintptr(unsafe.Pointer(&buf[0][0]))
	}

	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	all := ^uint64(0)
	var old uint64
	if _, _, e := syscall.RawSyscall6(syscall.SYS_RT_SIGPROCMASK, unix.SIG_SETMASK,
		uintptr(unsafe.Pointer(&all)), uintptr(unsafe.Pointer(&old)), 8, 0, 0); e != 0 {
		return e
	}
	pid, _, e := syscall.RawSyscall6(syscall.SYS_CLONE, uintptr(syscall.SIGCHLD), 0, 0, 0, 0, 0)
	if e == 0 && pid == 0 {
		// The child: raw system calls only.
		for i := 0; i+1 < len(ranges); i += 2 {
			syscall.RawSyscall(unix.SYS_CLOSE_RANGE, ranges[i], ranges[i+1], 0)
		}
		if writeFD >= 0 {
			syscall.RawSyscall(syscall.SYS_WRITE, uintptr(writeFD), ptr, n)
		}
		if readFD >= 0 {
			syscall.RawSyscall(syscall.SYS_READ, uintptr(readFD), rb, 1)
		}
		syscall.RawSyscall(syscall.SYS_EXIT_GROUP, 0, 0, 0)
	}
	syscall.RawSyscall6(syscall.SYS_RT_SIGPROCMASK, unix.SIG_SETMASK, uintptr(unsafe.Pointer(&old)), 0, 8, 0, 0)
	runtime.KeepAlive(ranges)
	runtime.KeepAlive(buf)
	if e != 0 {
		return fmt.Errorf("forkchild: fork: %w", e)
	}
	return nil
}
