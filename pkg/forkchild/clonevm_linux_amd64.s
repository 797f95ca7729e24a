#include "textflag.h"

// func cloneVM(prog *vmProg) (pid uintptr, errno uintptr)
//
// clone(CLONE_VM|SIGCHLD) with the caller's stack pointer: the child shares this
// process's memory and stack, so from here on it touches neither: registers only (R12
// holds prog, which lives in static memory), until exit_group. See clonevm_linux_amd64.go.
TEXT ·cloneVM(SB),NOSPLIT,$0-24
	MOVQ	prog+0(FP), R12
	MOVQ	$0x111, DI	// CLONE_VM (0x100) | SIGCHLD (17)
	XORQ	SI, SI		// newsp: unchanged
	XORQ	DX, DX
	XORQ	R10, R10
	XORQ	R8, R8
	MOVQ	$56, AX		// SYS_clone
	SYSCALL
	CMPQ	AX, $0
	JEQ	child
	CMPQ	AX, $0xfffffffffffff001
	JLS	ok
	NEGQ	AX
	MOVQ	$0, pid+8(FP)
	MOVQ	AX, errno+16(FP)
	RET
ok:
	MOVQ	AX, pid+8(FP)
	MOVQ	$0, errno+16(FP)
	RET

child:
	// close_range over prog.ranges[0:prog.n] in [lo, hi] pairs.
	MOVQ	0(R12), R13
	LEAQ	8(R12), BX
loop:
	CMPQ	R13, $1
	JLE	closed
	MOVQ	0(BX), DI
	MOVQ	8(BX), SI
	XORQ	DX, DX
	MOVQ	$436, AX	// SYS_close_range
	SYSCALL
	ADDQ	$16, BX
	SUBQ	$2, R13
	JMP	loop
closed:
	MOVQ	264(R12), DI	// writeFD
	CMPQ	DI, $0
	JLT	nowrite
	MOVQ	272(R12), SI	// wp
	MOVQ	280(R12), DX	// wn
	MOVQ	$1, AX		// SYS_write
	SYSCALL
nowrite:
	MOVQ	288(R12), DI	// readFD
	CMPQ	DI, $0
	JLT	exit
	MOVQ	296(R12), SI	// rp
	MOVQ	$1, DX
	MOVQ	$0, AX		// SYS_read
	SYSCALL
exit:
	XORQ	DI, DI
	MOVQ	$231, AX	// SYS_exit_group
	SYSCALL
	JMP	exit
