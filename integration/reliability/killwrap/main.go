// SPDX-License-Identifier: Apache-2.0

// Command killwrap stands in a CNI_PATH directory under the name of a real plugin and
// runs that plugin (from $PODWIRE_REAL_CNI_DIR) as a child. With probability
// $PODWIRE_KILL_PROB it SIGKILLs the child after a random delay of up to
// $PODWIRE_KILL_MAX_MS milliseconds, then fails as a crashed plugin does (no output,
// exit 137). The reliability suite uses it to crash plugins half-way through ADD and DEL,
// including host-local under bridge, since CNI_PATH points here for delegates too.
package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

func main() {
	real := filepath.Join(os.Getenv("PODWIRE_REAL_CNI_DIR"), filepath.Base(os.Args[0]))
	cmd := exec.Command(real, os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "killwrap: starting %s: %v\n", real, err)
		os.Exit(1)
	}
	prob, _ := strconv.ParseFloat(os.Getenv("PODWIRE_KILL_PROB"), 64)
	maxMS, _ := strconv.Atoi(os.Getenv("PODWIRE_KILL_MAX_MS"))
	if maxMS <= 0 {
		maxMS = 20
	}
	if os.Getenv("CNI_COMMAND") != "VERSION" && rand.Float64() < prob {
		delay := time.Duration(rand.IntN(maxMS*1000)) * time.Microsecond
		time.AfterFunc(delay, func() { _ = cmd.Process.Signal(syscall.SIGKILL) })
	}
	err := cmd.Wait()
	// Only a child that died of our SIGKILL counts as killed; one that finished before
	// the timer fired ran to completion.
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
		if f := os.Getenv("PODWIRE_KILL_LOG"); f != "" {
			if lf, e := os.OpenFile(f, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600); e == nil {
				fmt.Fprintf(lf, "%s %s %s\n", filepath.Base(real), os.Getenv("CNI_COMMAND"), os.Getenv("CNI_CONTAINERID"))
				lf.Close()
			}
		}
		os.Exit(137)
	}
	if ee, ok := err.(*exec.ExitError); ok {
		os.Exit(ee.ExitCode())
	} else if err != nil {
		os.Exit(1)
	}
}
