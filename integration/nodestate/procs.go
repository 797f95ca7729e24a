// SPDX-License-Identifier: Apache-2.0

package nodestate

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Proc is one process as /proc/<pid>/stat shows it.
type Proc struct {
	PID, PPID int
	Comm      string // the executable's name, at most 15 bytes
	State     string // R, S, D, Z (zombie: exited, not waited for), T, ...
	Start     uint64 // start time in clock ticks since boot: with PID, the process's identity
}

func (p Proc) String() string {
	what := "alive"
	if p.State == "Z" {
		what = "a zombie nobody waited for"
	}
	return fmt.Sprintf("pid %d (%s) state %s, %s, child of %d", p.PID, p.Comm, p.State, what, p.PPID)
}

// Descendants lists every process whose chain of parents leads to pid (pid itself
// excluded), in PID order: what a test started and everything those started, until
// they are waited for. A process whose parent exited without waiting for it is
// reparented (to init or a subreaper) and is no longer pid's descendant.
func Descendants(pid int) ([]Proc, error) {
	all, err := allProcs()
	if err != nil {
		return nil, err
	}
	children := map[int][]Proc{}
	for _, p := range all {
		children[p.PPID] = append(children[p.PPID], p)
	}
	var out []Proc
	queue := []int{pid}
	for len(queue) > 0 {
		next := queue[0]
		queue = queue[1:]
		for _, c := range children[next] {
			out = append(out, c)
			queue = append(queue, c.PID)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].PID < out[j].PID })
	return out, nil
}

// NewProcs returns the processes of now that are not in before (same PID and start time).
func NewProcs(before, now []Proc) []Proc {
	seen := map[[2]uint64]bool{}
	for _, p := range before {
		seen[[2]uint64{uint64(p.PID), p.Start}] = true
	}
	var out []Proc
	for _, p := range now {
		if !seen[[2]uint64{uint64(p.PID), p.Start}] {
			out = append(out, p)
		}
	}
	return out
}

func allProcs() ([]Proc, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("listing /proc: %w", err)
	}
	var out []Proc
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // exited meanwhile
		}
		p, err := parseStat(string(b))
		if err != nil {
			return nil, fmt.Errorf("/proc/%s/stat: %w", e.Name(), err)
		}
		out = append(out, p)
	}
	return out, nil
}

// parseStat reads pid, comm, state, ppid and starttime from a /proc/<pid>/stat line.
// comm is in parentheses and may itself hold spaces and parentheses: it ends at the
// last ')'.
func parseStat(s string) (Proc, error) {
	open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || closing < open {
		return Proc{}, fmt.Errorf("no (comm) in %q", s)
	}
	var p Proc
	var err error
	if p.PID, err = strconv.Atoi(strings.TrimSpace(s[:open])); err != nil {
		return Proc{}, fmt.Errorf("pid: %w", err)
	}
	p.Comm = s[open+1 : closing]
	// Fields after comm: 3 state, 4 ppid, ..., 22 starttime.
	f := strings.Fields(s[closing+1:])
	if len(f) < 20 {
		return Proc{}, fmt.Errorf("%d fields after comm in %q, want at least 20", len(f), s)
	}
	p.State = f[0]
	if p.PPID, err = strconv.Atoi(f[1]); err != nil {
		return Proc{}, fmt.Errorf("ppid: %w", err)
	}
	if p.Start, err = strconv.ParseUint(f[19], 10, 64); err != nil {
		return Proc{}, fmt.Errorf("starttime: %w", err)
	}
	return p, nil
}
