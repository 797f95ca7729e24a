// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
)

// State is what the lab has made on the machine, written to the run dir after every
// change, so Down removes exactly that (and nothing it did not make) even after a
// failed or interrupted Up.
type State struct {
	// Plan is the plan the objects were made from (Down needs no Config).
	Plan Plan
	// Links are links in the machine's netns (the bridge, veth ends).
	Links []string `json:",omitempty"`
	// Mounts are mounts in the machine's mount namespace, in the order made.
	Mounts []string `json:",omitempty"`
	// Dirs are directories outside the run dir that did not exist before (bind targets
	// of node dirs), in the order made.
	Dirs []string `json:",omitempty"`
	// Cgroups are cgroup paths made in every v1 hierarchy (and the unified one).
	Cgroups []string `json:",omitempty"`
	// Procs are the daemons, in start order.
	Procs []Proc `json:",omitempty"`
}

// Proc is a daemon the lab started: a pid is only signalled while its start time
// still matches, so a reused pid is never hit.
type Proc struct {
	Name  string
	Pid   int
	Start uint64 // /proc/<pid>/stat field 22
	Log   string
	// Argv, Env and Cgroup start it again (Restart).
	Argv   []string
	Env    []string `json:",omitempty"`
	Cgroup string   `json:",omitempty"`
}

func loadState(file string) (*State, error) {
	b, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("reading the lab's state %s: %w (remove what it lists by hand, then the file)", file, err)
	}
	return &s, nil
}

// save writes s atomically (temp file + rename): an interrupted write leaves the
// previous state, never half of one.
func (s *State) save() error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	file := s.Plan.StateFile
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return err
	}
	tmp := file + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, file)
}

// add records one made object and saves at once.
func (s *State) add(list *[]string, v string) error {
	if !slices.Contains(*list, v) {
		*list = append(*list, v)
	}
	return s.save()
}
