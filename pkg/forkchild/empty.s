// Present so that forkchild_linux.go may declare the runtime's fork hooks without
// bodies (they are linked by go:linkname).
