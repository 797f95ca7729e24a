// SPDX-License-Identifier: Apache-2.0

package routes

import (
	"fmt"
	"slices"
	"strings"
	"sync"
)

// Fake is a routing table in memory: agent routes (Protocol) and foreign ones, which
// List never shows and Sync must never touch. A Replace via a gateway on no connected
// subnet fails as the kernel's does ("Nexthop has invalid gateway").
type Fake struct {
	mu      sync.Mutex
	Conn    []Connected
	ours    []Route
	foreign []Route
	Fail    error // returned by the next Replace or Delete, then cleared
}

var _ Backend = (*Fake)(nil)

// AddForeign adds a route the agent did not make (another protocol).
func (f *Fake) AddForeign(r Route) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.foreign = append(f.foreign, r)
}

func (f *Fake) Connected() ([]Connected, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.Conn), nil
}

func (f *Fake) List() ([]Route, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := slices.Clone(f.ours)
	for i := range out {
		out[i].Node = ""
	}
	return out, nil
}

func (f *Fake) failing() error {
	err := f.Fail
	f.Fail = nil
	return err
}

func (f *Fake) Replace(r Route) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.failing(); err != nil {
		return err
	}
	if !slices.ContainsFunc(f.Conn, func(c Connected) bool { return c.LinkIndex == r.LinkIndex && c.Prefix.Contains(r.Gw) }) {
		return fmt.Errorf("nexthop has invalid gateway %s", r.Gw)
	}
	if slices.ContainsFunc(f.foreign, func(o Route) bool { return o.Dst == r.Dst }) {
		// The kernel's replace would take over a foreign route to the same prefix; the
		// fake refuses so tests notice a plan that collides with someone else's route.
		return fmt.Errorf("route to %s exists with another protocol", r.Dst)
	}
	r.Node = ""
	f.ours = slices.DeleteFunc(f.ours, func(o Route) bool { return o.Dst == r.Dst })
	f.ours = append(f.ours, r)
	return nil
}

func (f *Fake) Delete(r Route) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.failing(); err != nil {
		return err
	}
	f.ours = slices.DeleteFunc(f.ours, func(o Route) bool { return o.Dst == r.Dst })
	return nil
}

// Dump prints the table, ours then foreign, sorted.
func (f *Fake) Dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var lines []string
	for _, r := range f.ours {
		lines = append(lines, fmt.Sprintf("%s via %s dev #%d proto %d", r.Dst, r.Gw, r.LinkIndex, Protocol))
	}
	for _, r := range f.foreign {
		lines = append(lines, fmt.Sprintf("%s via %s dev #%d proto static", r.Dst, r.Gw, r.LinkIndex))
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}
