// SPDX-License-Identifier: Apache-2.0

// Command rsswrap runs the program named by its first argument with the rest as
// arguments, passing stdin, stdout, stderr and the environment through, and writes
// the program's peak RSS in KiB (wait4's ru_maxrss) as one decimal line to file
// descriptor 3. It exits with the program's exit code.
//
// `make bench` measures plugins' peak RSS through it rather than from its own wait4:
// on exec the kernel folds the peak RSS of the memory the child shared with its parent
// (Go starts children with vfork) into the child's ru_maxrss, so a plugin started by
// the large test process would report the test process's RSS. Started from this small
// process, a plugin's figure is its own whenever it exceeds rsswrap's (a few MiB).
package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: rsswrap PROGRAM [ARG...] 3>rss")
		os.Exit(2)
	}
	report := os.NewFile(3, "rss")
	cmd := exec.Command(os.Args[1], os.Args[2:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	err := cmd.Run()
	if cmd.ProcessState == nil {
		fmt.Fprintf(os.Stderr, "rsswrap: starting %s: %v\n", os.Args[1], err)
		os.Exit(127)
	}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok && report != nil {
		fmt.Fprintf(report, "%d\n", ru.Maxrss)
		report.Close()
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		os.Exit(ee.ExitCode())
	}
	if err != nil {
		os.Exit(1)
	}
}
