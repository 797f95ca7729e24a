// Package forkchild starts short-lived children that take a wait off a plugin's way out:
// a child process that runs a few raw system calls on memory prepared before it was
// started, then exits. On amd64 the child shares the plugin's memory
// (clone(CLONE_VM), a few instructions of assembly on registers and a static program:
// nothing is copied, so it costs about a thread's creation); elsewhere, or when its
// static slots are used up, it is a forked copy. It is not a general fork: nothing in
// the child may call into the Go runtime (allocate, grow the stack, schedule), which
// is not usable in a child of a multi-threaded process, so each child program is
// written out here. Worthwhile tells callers when a child does not pay (every CPU
// busy).
//
// Common to both programs: the runtime's fork hooks block all signals across the fork
// (none is ever handled in the child) and make any stack growth in the child fatal, the child first closes every descriptor it does not need (the
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
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Supported reports whether the kernel lets a child drop descriptors with
// close_range(2) (Linux 5.9, and not refused by a seccomp policy): closing the empty
// range at the very top succeeds exactly then.
func Supported() bool {
	_, _, e := syscall.RawSyscall(unix.SYS_CLOSE_RANGE, uintptr(^uint32(0)), uintptr(^uint32(0)), 0)
	return e == 0
}

// Worthwhile reports whether a fork would pay for itself now: whether a CPU is free
// for it, i.e. fewer runnable tasks of other processes (the fourth field of
// /proc/loadavg, minus this process's running threads) than CPUs. A child takes a
// kernel wait off the caller's way out but costs the CPU time of a fork, which on a
// small VM is milliseconds; when many plugins run at once every CPU is busy, the wait
// costs nothing (the caller sleeps) and forks would only slow everyone down, so
// callers then wait themselves.
//
// A child through cloneVM costs about a thread's creation: always worthwhile.
func Worthwhile() bool {
	if haveCloneVM && !vmOff && vmNext.Load() < int32(len(vmSlots)) {
		return true
	}
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return true
	}
	return othersFit(string(b), ownRunning(), runtime.NumCPU())
}

// ownRunning counts this process's threads in state R.
func ownRunning() int {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return 1
	}
	n := 0
	for _, t := range tasks {
		b, err := os.ReadFile("/proc/self/task/" + t.Name() + "/stat")
		if err != nil {
			continue
		}
		// "tid (comm) S ...": the state follows the last ')'.
		if i := strings.LastIndexByte(string(b), ')'); i >= 0 && i+2 < len(b) && b[i+2] == 'R' {
			n++
		}
	}
	return max(n, 1) // the caller, reading
}

// othersFit parses /proc/loadavg ("0.52 0.58 0.59 2/467 12345") and reports whether
// the runnable tasks other than own are fewer than cpus.
func othersFit(loadavg string, own, cpus int) bool {
	f := strings.Fields(loadavg)
	if len(f) < 4 {
		return true
	}
	run, _, ok := strings.Cut(f[3], "/")
	n, err := strconv.Atoi(run)
	if !ok || err != nil {
		return true
	}
	return n-own < cpus
}

// The runtime's own fork hooks, as package syscall uses them around fork: signals
// blocked, and the goroutine's stack guard spoiled so that any attempt to grow the
// stack in the child crashes it instead of entering the scheduler.
//
//go:linkname runtimeBeforeFork syscall.runtime_BeforeFork
func runtimeBeforeFork()

//go:linkname runtimeAfterFork syscall.runtime_AfterFork
func runtimeAfterFork()

// Send forks a child that writes msg to fd (a netlink socket, say, whose kernel side
// blocks the writer until the request is done) and exits. It returns the child's pid
// once the child exists; the child cannot report how the write went.
func Send(fd int, msg []byte) (int, error) {
	if len(msg) == 0 {
		return 0, errors.New("forkchild: empty message")
	}
	return fork([]int{fd}, fd, msg, -1)
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
	p := make([]int, 2)
	if err := unix.Pipe2(p, unix.O_CLOEXEC); err != nil { // blocking: the child waits on it
		return err
	}
	defer unix.Close(p[0])
	keep := append(slices.Clone(fds), p[0])
	if _, err := fork(keep, -1, nil, p[0]); err != nil {
		unix.Close(p[1])
		return err
	}
	holdPipe = os.NewFile(uintptr(p[1]), "forkchild-hold")
	return nil
}

// vmProg is what the child of cloneVM runs: the close_range pairs, then an optional
// write and an optional one-byte read. Its field offsets are spelled out in
// clonevm_linux_amd64.s (TestVMProgLayout checks them).
type vmProg struct {
	n       uint64     // 0: entries used in ranges
	ranges  [32]uint64 // 8: [lo, hi] pairs
	writeFD int64      // 264
	wp, wn  uint64     // 272, 280
	readFD  int64      // 288
	rp      uint64     // 296
	msg     [512]byte  // 304: what wp points to
	rbuf    [8]byte    // 816: what rp points to
}

// vmSlots are the programs of cloneVM children: static memory, each slot used by one
// child only (a child may read its slot after this process has moved on).
var (
	vmSlots [8]vmProg
	vmNext  atomic.Int32
	vmOff   bool // tests: the fork path
)

// forkVM runs the child program through cloneVM when this architecture has it and
// the program fits a slot; ok is false otherwise (then fork).
//
//go:norace
//go:nocheckptr
func forkVM(keep []int, writeFD int, msg []byte, readFD int) (pid int, ok bool, err error) {
	if !haveCloneVM || vmOff || len(msg) > len(vmProg{}.msg) || 2*len(keep)+2 > len(vmProg{}.ranges) {
		return 0, false, nil
	}
	i := int(vmNext.Add(1)) - 1
	if i >= len(vmSlots) {
		return 0, false, nil
	}
	p := &vmSlots[i]
	slices.Sort(keep)
	lo := uint64(0)
	for _, k := range keep {
		if k < 0 {
			return 0, true, fmt.Errorf("forkchild: bad descriptor %d", k)
		}
		if uint64(k) > lo {
			p.ranges[p.n], p.ranges[p.n+1] = lo, uint64(k)-1
			p.n += 2
		}
		lo = uint64(k) + 1
	}
	p.ranges[p.n], p.ranges[p.n+1] = lo, uint64(^uint32(0))
	p.n += 2
	p.writeFD, p.readFD = int64(writeFD), int64(readFD)
	copy(p.msg[:], msg)
	p.wp, p.wn = uint64(uintptr(unsafe.Pointer(&p.msg[0]))), uint64(len(msg))
	p.rp = uint64(uintptr(unsafe.Pointer(&p.rbuf[0])))

	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	runtimeBeforeFork()
	r, e := cloneVM(p)
	runtimeAfterFork()
	if e != 0 {
		return 0, true, fmt.Errorf("forkchild: clone: %w", syscall.Errno(e))
	}
	return int(r), true, nil
}

// Exited reports whether the child pid (from Send) has exited, and reaps it then.
func Exited(pid int) bool {
	var ws unix.WaitStatus
	got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil)
	return err == nil && got == pid
}

// fork starts the child: it closes every descriptor not in keep, writes msg to writeFD
// (if >= 0), reads one byte from readFD (if >= 0; EOF once every writer, this process
// included, is gone), and exits. Between the fork and the child's exit only nosplit
// raw system calls run, on memory allocated before the fork.
//
//go:norace
//go:nocheckptr
//go:noinline
func fork(keep []int, writeFD int, msg []byte, readFD int) (int, error) {
	if !Supported() {
		return 0, errors.New("forkchild: close_range(2) is not available")
	}
	if pid, ok, err := forkVM(keep, writeFD, msg, readFD); ok {
		return pid, err
	}
	// The ranges to close, computed before the fork: [lo, hi] pairs around keep.
	slices.Sort(keep)
	ranges := make([]uintptr, 0, 2*len(keep)+2)
	lo := uintptr(0)
	for _, k := range keep {
		if k < 0 {
			return 0, fmt.Errorf("forkchild: bad descriptor %d", k)
		}
		if uintptr(k) > lo {
			ranges = append(ranges, lo, uintptr(k)-1)
		}
		lo = uintptr(k) + 1
	}
	ranges = append(ranges, lo, uintptr(^uint32(0)))
	rbuf := make([]byte, 1) // on the heap: a stack may move, the heap does not
	var wp, wn uintptr
	if len(msg) > 0 {
		wp, wn = uintptr(unsafe.Pointer(&msg[0])), uintptr(len(msg))
	}
	rp := uintptr(unsafe.Pointer(&rbuf[0]))
	nr := len(ranges)

	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	runtimeBeforeFork()
	pid, _, e := syscall.RawSyscall6(syscall.SYS_CLONE, uintptr(syscall.SIGCHLD), 0, 0, 0, 0, 0)
	if e == 0 && pid == 0 {
		// The child: raw system calls only; it never returns.
		for i := 0; i+1 < nr; i += 2 {
			syscall.RawSyscall(unix.SYS_CLOSE_RANGE, ranges[i], ranges[i+1], 0)
		}
		if writeFD >= 0 {
			syscall.RawSyscall(syscall.SYS_WRITE, uintptr(writeFD), wp, wn)
		}
		if readFD >= 0 {
			syscall.RawSyscall(syscall.SYS_READ, uintptr(readFD), rp, 1)
		}
		for {
			syscall.RawSyscall(syscall.SYS_EXIT_GROUP, 0, 0, 0)
		}
	}
	runtimeAfterFork()
	runtime.KeepAlive(ranges)
	runtime.KeepAlive(msg)
	runtime.KeepAlive(rbuf)
	if e != 0 {
		return 0, fmt.Errorf("forkchild: fork: %w", e)
	}
	return int(pid), nil
}
