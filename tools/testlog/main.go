// SPDX-License-Identifier: Apache-2.0

// Command testlog keeps `make test`'s output short and its skips visible.
//
//	testlog run -log FILE -- go test -json ...
//
// runs the command, appends its `go test -json` stream to FILE and prints what a reader
// of CI needs: build errors, each top-level test's result line, the whole output of
// every failed test, package results. It exits with the command's status.
//
//	testlog skips FILE...
//
// prints every test the logs say skipped, with the reason the test gave, and exits 0
// (.ci/run calls it after make test, whose exit status stays CI's).
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	switch os.Args[1] {
	case "run":
		os.Exit(run(os.Args[2:]))
	case "skips":
		skips(os.Stdout, os.Args[2:])
	default:
		usage()
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: testlog run -log FILE -- go test -json ...\n       testlog skips FILE...")
	os.Exit(2)
}

// event is one line of `go test -json` (cmd/test2json's TestEvent).
type event struct {
	Action     string
	Package    string
	ImportPath string // build-output and build-fail
	Test       string
	Elapsed    float64
	Output     string
}

func run(args []string) int {
	if len(args) < 4 || args[0] != "-log" || args[2] != "--" {
		usage()
	}
	logPath, argv := args[1], args[3:]
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintf(os.Stderr, "testlog: %v\n", err)
		return 2
	}
	defer logf.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintf(os.Stderr, "testlog: %v\n", err)
		return 2
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "testlog: %v\n", err)
		return 2
	}
	s := newSummary(os.Stdout)
	readEvents(io.TeeReader(out, logf), s.event, func(line string) { fmt.Println(line) })
	err = cmd.Wait()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.ExitCode()
	default:
		fmt.Fprintf(os.Stderr, "testlog: %s: %v\n", argv[0], err)
		return 2
	}
}

// readEvents calls ev for every JSON event and other for every line that is not one
// (go's own messages). A read error ends it: the command's exit status tells.
func readEvents(r io.Reader, ev func(event), other func(string)) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 16*1024*1024)
	for sc.Scan() {
		var e event
		if line := sc.Text(); json.Unmarshal([]byte(line), &e) != nil || e.Action == "" {
			other(line)
			continue
		}
		ev(e)
	}
}

// maxReason bounds a skip's reason in the listing; the log has it all. The end is
// kept: t.Skip's message is the last line.
const maxReason = 600

type testKey struct{ pkg, test string }

// summary prints results as events arrive, keeping each running test's output until
// it is known whether the test failed.
type summary struct {
	w   io.Writer
	out map[testKey][]string
}

func newSummary(w io.Writer) *summary { return &summary{w: w, out: map[testKey][]string{}} }

func (s *summary) event(e event) {
	k := testKey{e.Package, e.Test}
	switch e.Action {
	case "build-output":
		fmt.Fprint(s.w, e.Output)
	case "output":
		if e.Test == "" {
			// Package lines: "ok pkg 1.2s", "FAIL pkg", a panic outside any test.
			if o := strings.TrimSpace(e.Output); o != "PASS" && o != "FAIL" && !strings.HasPrefix(o, "=== ") {
				fmt.Fprint(s.w, e.Output)
			}
			return
		}
		s.out[k] = append(s.out[k], e.Output)
	case "pass", "skip":
		if e.Test != "" && !strings.Contains(e.Test, "/") {
			fmt.Fprintf(s.w, "--- %s: %s (%s, %.1fs)\n", strings.ToUpper(e.Action), e.Test, e.Package, e.Elapsed)
		}
		delete(s.out, k)
	case "fail":
		if e.Test == "" {
			// A test binary that died (a panic, the -timeout) ends its tests without
			// their results: show what they printed.
			for tk, lines := range s.out {
				if tk.pkg == e.Package {
					fmt.Fprintf(s.w, "=== output of unfinished %s (%s):\n%s", tk.test, tk.pkg, strings.Join(lines, ""))
					delete(s.out, tk)
				}
			}
			return
		}
		// Subtests' output is their own; a failed parent prints its own lines, which
		// include its subtests' result lines.
		fmt.Fprintf(s.w, "=== output of failed %s (%s):\n%s", e.Test, e.Package, strings.Join(s.out[k], ""))
		delete(s.out, k)
	}
}

// skips writes to w every skipped test of the logs in files, with its reason: the lines
// it printed (t.Log, t.Skip's message), joined, at most maxReason bytes.
func skips(w io.Writer, files []string) {
	type skip struct {
		key    testKey
		reason string
	}
	var all []skip
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			fmt.Fprintf(os.Stderr, "testlog: %v\n", err)
			continue
		}
		out := map[testKey][]string{}
		readEvents(fh, func(e event) {
			k := testKey{e.Package, e.Test}
			switch {
			case e.Test == "":
			case e.Action == "output":
				o := strings.TrimSpace(e.Output)
				if o != "" && !strings.HasPrefix(o, "=== ") && !strings.HasPrefix(o, "--- ") {
					out[k] = append(out[k], o)
				}
			case e.Action == "skip":
				all = append(all, skip{k, strings.Join(out[k], " | ")})
				delete(out, k)
			case e.Action == "pass" || e.Action == "fail":
				delete(out, k)
			}
		}, func(string) {})
		fh.Close()
	}
	fmt.Fprintf(w, "skipped tests: %d\n", len(all))
	for _, s := range all {
		reason := s.reason
		if reason == "" {
			reason = "(no reason given)"
		}
		if len(reason) > maxReason {
			reason = "..." + reason[len(reason)-maxReason:]
		}
		fmt.Fprintf(w, "--- SKIP: %s (%s): %s\n", s.key.test, s.key.pkg, reason)
	}
}
