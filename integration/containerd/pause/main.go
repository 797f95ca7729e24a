// SPDX-License-Identifier: Apache-2.0

// Command pause is the sandbox ("pause") process for the containerd end-to-end test.
// No registry is reachable from the test machines, so the test builds this static
// binary and packs it into a one-layer OCI image that containerd uses as its
// sandbox_image. Like Kubernetes' pause it holds the pod's namespaces open, reaps
// orphans (it is PID 1 of the pod), and exits on SIGINT or SIGTERM.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	// A PID 1 gets no default signal handlers: without Notify, SIGTERM would be
	// ignored and every stop would wait for the runtime's SIGKILL.
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		reap()
	}
}

// reap collects every exited child; several exits can arrive as one SIGCHLD.
func reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
