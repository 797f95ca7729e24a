package forkchild

// cloneVM starts the child program prog describes in a process that shares this one's
// memory (clone(CLONE_VM) without CLONE_THREAD or CLONE_FILES: its own descriptor
// table, a copy). Unlike a fork nothing is copied, neither page tables nor, later,
// pages this process writes (copy-on-write faults): on a small VM a fork of a Go
// process costs milliseconds, this a thread's creation. The child runs a few
// instructions of clonevm_linux_amd64.s on registers and prog only, which lives in static
// memory never reused (vmSlots), and outlives this process (the memory stays mapped
// while the child holds it).
//
//go:noescape
func cloneVM(prog *vmProg) (pid uintptr, errno uintptr)

const haveCloneVM = true
