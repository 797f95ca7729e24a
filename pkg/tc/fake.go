// SPDX-License-Identifier: Apache-2.0

package tc

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
)

// Fake is an in-memory Backend for unit tests. It models what podwire relies on in the
// kernel: links with an index, MTU, state and alias; one root qdisc per link; an
// ingress/clsact hook with filters; a redirect to a deleted device that keeps pointing at
// its old index. Apply is all or nothing. It is safe for concurrent use.
type Fake struct {
	mu    sync.Mutex
	links map[string]*fakeLink
	next  int
	// FailOn makes the operation whose description contains it fail (e.g. "add
	// redirect", "create IFB", "root tbf"), to test rollback.
	FailOn string
}

var _ Backend = (*Fake)(nil)

type fakeLink struct {
	Kind      string
	Index     int
	MTU       int
	Up        bool
	Alias     string
	Root      *KernelTBF
	RootOther string // a root qdisc that is not podwire's
	Hook      string
	Filters   []fakeFilter
}

type fakeFilter struct {
	Prio   uint16
	Target int // mirred redirect target index; 0 for another user's filter
}

// NewFake returns an empty Fake.
func NewFake() *Fake { return &Fake{links: map[string]*fakeLink{}, next: 1} }

// AddLink adds a device (a "veth", say) with the given MTU, up.
func (f *Fake) AddLink(name, kind string, mtu int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.links[name] = &fakeLink{Kind: kind, Index: f.next, MTU: mtu, Up: true}
	f.next++
}

// DelLink deletes a device, as the kernel does when a pod's netns goes away.
func (f *Fake) DelLink(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.links, name)
}

// SetForeign gives dev what another tc user would add: a root qdisc described by root
// ("" for none) and a hook qdisc of kind hook ("ingress", "clsact" or "") carrying n
// filters of theirs.
func (f *Fake) SetForeign(dev, root, hook string, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.links[dev]
	l.RootOther = root
	l.Hook = hook
	for i := range n {
		l.Filters = append(l.Filters, fakeFilter{Prio: uint16(i + 1)})
	}
}

// Dump renders the whole state, sorted, one link per line.
func (f *Fake) Dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var lines []string
	for _, name := range slices.Sorted(maps.Keys(f.links)) {
		l := f.links[name]
		s := fmt.Sprintf("%s %s mtu %d", name, l.Kind, l.MTU)
		if l.Up {
			s += " up"
		}
		if l.Alias != "" {
			s += fmt.Sprintf(" alias %q", l.Alias)
		}
		if l.Root != nil {
			s += " root " + l.Root.String()
		}
		if l.RootOther != "" {
			s += " root " + l.RootOther
		}
		if l.Hook != "" {
			s += " " + l.Hook
		}
		for _, fl := range l.Filters {
			if fl.Target == 0 {
				s += fmt.Sprintf(" [pref %d theirs]", fl.Prio)
			} else {
				s += fmt.Sprintf(" [pref %d -> %s]", fl.Prio, f.nameOf(fl.Target))
			}
		}
		lines = append(lines, s)
	}
	return strings.Join(lines, "\n")
}

func (f *Fake) nameOf(index int) string {
	for name, l := range f.links {
		if l.Index == index {
			return name
		}
	}
	return fmt.Sprintf("ifindex %d", index)
}

func (f *Fake) fail(op string) error {
	if f.FailOn != "" && strings.Contains(op, f.FailOn) {
		return fmt.Errorf("%s: injected failure", op)
	}
	return nil
}

// snapshot and restore make Apply all or nothing.
func (f *Fake) snapshot() (map[string]*fakeLink, int) {
	c := make(map[string]*fakeLink, len(f.links))
	for k, v := range f.links {
		cp := *v
		cp.Filters = slices.Clone(v.Filters)
		if v.Root != nil {
			r := *v.Root
			cp.Root = &r
		}
		c[k] = &cp
	}
	return c, f.next
}

// Apply implements Backend.
func (f *Fake) Apply(_ context.Context, p Plan) (err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	saved, next := f.snapshot()
	defer func() {
		if err != nil {
			f.links, f.next = saved, next
		}
	}()
	dev, ok := f.links[p.Dev]
	if !ok {
		return fmt.Errorf("host veth %s: link not found", p.Dev)
	}
	var ifb *fakeLink
	if p.Egress != nil {
		ifb = f.links[p.IFB]
		if ifb == nil {
			if err := f.fail("create IFB"); err != nil {
				return err
			}
			ifb = &fakeLink{Kind: "ifb", Index: f.next}
			f.next++
			f.links[p.IFB] = ifb
		} else if ifb.Kind != "ifb" {
			return fmt.Errorf("device %s exists but is a %s, not podwire's IFB", p.IFB, ifb.Kind)
		}
		ifb.MTU, ifb.Alias, ifb.Up = p.MTU, p.Alias, true
		if err := f.fail("ifb tbf"); err != nil {
			return err
		}
		k := p.Egress.Kernel()
		ifb.Root = &k
	}
	switch {
	case p.Ingress != nil && dev.RootOther != "":
		return fmt.Errorf("%s already has root qdisc %s, which podwire did not create", p.Dev, dev.RootOther)
	case p.Ingress != nil:
		if err := f.fail("root tbf"); err != nil {
			return err
		}
		k := p.Ingress.Kernel()
		dev.Root = &k
	default:
		dev.Root = nil
	}
	if p.Egress == nil {
		f.removeEgress(dev, []string{p.IFB}, true)
		return nil
	}
	if dev.Hook == "" {
		dev.Hook = "clsact"
	}
	mine := f.own(dev, map[int]bool{ifb.Index: true}, true)
	if len(mine) == 1 && mine[0].Prio == FilterPrio && mine[0].Target == ifb.Index {
		return nil
	}
	dev.Filters = slices.DeleteFunc(dev.Filters, func(fl fakeFilter) bool { return slices.Contains(mine, fl) })
	if err := f.fail("add redirect"); err != nil {
		return err
	}
	dev.Filters = append(dev.Filters, fakeFilter{Prio: FilterPrio, Target: ifb.Index})
	return nil
}

// own mirrors ownFilters.
func (f *Fake) own(dev *fakeLink, targets map[int]bool, byPrio bool) []fakeFilter {
	var out []fakeFilter
	for _, fl := range dev.Filters {
		if fl.Target != 0 && (byPrio && fl.Prio == FilterPrio || targets[fl.Target]) {
			out = append(out, fl)
		}
	}
	return out
}

func (f *Fake) removeEgress(dev *fakeLink, names []string, byPrio bool) (found bool) {
	targets := map[int]bool{}
	for _, n := range names {
		if l := f.links[n]; l != nil && l.Kind == "ifb" {
			targets[l.Index] = true
		}
	}
	if dev != nil && dev.Hook != "" {
		mine := f.own(dev, targets, byPrio)
		for _, fl := range mine {
			found = found || targets[fl.Target]
		}
		dev.Filters = slices.DeleteFunc(dev.Filters, func(fl fakeFilter) bool { return slices.Contains(mine, fl) })
		if len(dev.Filters) == 0 {
			dev.Hook = ""
		}
	}
	for _, n := range names {
		if l := f.links[n]; l != nil && l.Kind == "ifb" {
			delete(f.links, n)
		}
	}
	return found
}

// Remove implements Backend.
func (f *Fake) Remove(_ context.Context, r Removal) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail("remove"); err != nil {
		return err
	}
	dev := f.links[r.Dev]
	found := f.removeEgress(dev, r.IFBs, !r.OnlyIfRedirected)
	if dev != nil && (found || !r.OnlyIfRedirected) {
		dev.Root = nil
	}
	return nil
}

// Observe implements Backend.
func (f *Fake) Observe(_ context.Context, devName, ifbName string) (State, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var s State
	ifbIndex := 0
	if l := f.links[ifbName]; l != nil {
		ifbIndex = l.Index
		s.IFB = &IFBState{Kind: l.Kind, Mac: fmt.Sprintf("02:00:00:00:%02x:%02x", l.Index>>8&0xff, l.Index&0xff), MTU: l.MTU, Up: l.Up, Alias: l.Alias, Root: l.Root}
	}
	dev := f.links[devName]
	if dev == nil {
		return s, nil
	}
	ds := &DevState{MTU: dev.MTU, Root: dev.Root, RootOther: dev.RootOther, Hook: dev.Hook}
	mine := f.own(dev, map[int]bool{ifbIndex: ifbIndex != 0}, true)
	for _, fl := range mine {
		ds.Redirects = append(ds.Redirects, Redirect{Prio: fl.Prio, Target: f.nameOf(fl.Target)})
	}
	ds.OtherFilters = len(dev.Filters) - len(mine)
	s.Dev = ds
	return s, nil
}

// IFBs implements Backend.
func (f *Fake) IFBs(context.Context) ([]IFB, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []IFB
	for _, name := range slices.Sorted(maps.Keys(f.links)) {
		if l := f.links[name]; l.Kind == "ifb" {
			out = append(out, IFB{Name: name, Alias: l.Alias})
		}
	}
	return out, nil
}
