//go:build linux && !amd64

package forkchild

func cloneVM(*vmProg) (uintptr, uintptr) { panic("forkchild: cloneVM is amd64 only") }

const haveCloneVM = false
