// SPDX-License-Identifier: Apache-2.0

// Command runcclamp is the OCI runtime path of the CRI-O harness on machines where
// root lacks CAP_SYS_RESOURCE (see integration/crio): there the kernel refuses any
// oom_score_adj below the caller's own, so runc fails every infra container CRI-O
// asks for with oom_score_adj -998 ("can't get final child's PID from pipe: EOF").
// Before `runc create` or `runc run` it raises the bundle's process.oomScoreAdj to
// its own score, as containerd's restrict_oom_score_adj does, and then execs runc in
// its place with the same arguments: no process of its own is left.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

const runc = "/usr/sbin/runc"

func main() {
	if err := clamp(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "runcclamp: %v\n", err)
		os.Exit(1)
	}
	args := append([]string{runc}, os.Args[1:]...)
	if err := syscall.Exec(runc, args, os.Environ()); err != nil {
		fmt.Fprintf(os.Stderr, "runcclamp: exec %s: %v\n", runc, err)
		os.Exit(1)
	}
}

// clamp rewrites <bundle>/config.json when the command is create or run and the
// spec asks for a lower oom_score_adj than this process has.
func clamp(args []string) error {
	cmd, bundle := "", "."
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case cmd == "" && !strings.HasPrefix(a, "-"):
			cmd = a
		case cmd != "" && (a == "--bundle" || a == "-b") && i+1 < len(args):
			bundle = args[i+1]
			i++
		case cmd != "" && strings.HasPrefix(a, "--bundle="):
			bundle = strings.TrimPrefix(a, "--bundle=")
		}
	}
	if cmd != "create" && cmd != "run" {
		return nil
	}
	own, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		return err
	}
	floor, err := strconv.Atoi(strings.TrimSpace(string(own)))
	if err != nil {
		return err
	}
	path := filepath.Join(bundle, "config.json")
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	// UseNumber: a spec's 64-bit limits must come back as they were, not as float64.
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var spec map[string]any
	if err := dec.Decode(&spec); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	proc, _ := spec["process"].(map[string]any)
	n, ok := proc["oomScoreAdj"].(json.Number)
	if !ok {
		return nil
	}
	if v, err := n.Int64(); err != nil || int(v) >= floor {
		return err
	}
	proc["oomScoreAdj"] = floor
	out, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	return os.WriteFile(path, out, 0o644)
}
