// SPDX-License-Identifier: Apache-2.0

package tc

import (
	"context"
	"strings"
	"testing"
)

func TestDiff(t *testing.T) {
	in, _ := SizeTBF(10_000_000, 0, 1500)
	eg, _ := SizeTBF(20_000_000, 0, 1500)
	other, _ := SizeTBF(30_000_000, 0, 1500)
	ki, ke, ko := in.Kernel(), eg.Kernel(), other.Kernel()
	plan := Plan{Dev: "veth1", MTU: 1500, IFB: "pwbx", Alias: "podwire:n/c/eth0 dev=veth1", Ingress: &in, Egress: &eg}
	good := func() State {
		return State{
			Dev: &DevState{MTU: 1500, Root: &ki, Hook: "clsact", Redirects: []Redirect{{Prio: FilterPrio, Target: "pwbx"}}},
			IFB: &IFBState{Kind: "ifb", MTU: 1500, Up: true, Alias: plan.Alias, Root: &ke},
		}
	}
	for _, c := range []struct {
		name   string
		plan   Plan
		mutate func(*State)
		want   []string // substrings, one per expected difference; nil: match
	}{
		{name: "match", plan: plan, mutate: func(*State) {}},
		{name: "their filters do not matter", plan: plan, mutate: func(s *State) { s.Dev.OtherFilters = 3 }},
		{name: "veth gone", plan: plan, mutate: func(s *State) { s.Dev = nil }, want: []string{"host veth veth1 does not exist"}},
		{name: "root rate", plan: plan, mutate: func(s *State) { s.Dev.Root = &ko }, want: []string{"root is tbf rate 30000000bit"}},
		{name: "root missing", plan: plan, mutate: func(s *State) { s.Dev.Root = nil }, want: []string{"no TBF at the root"}},
		{name: "foreign root", plan: plan, mutate: func(s *State) { s.Dev.Root, s.Dev.RootOther = nil, "htb 1:" }, want: []string{"root qdisc is htb 1:"}},
		{name: "ifb missing", plan: plan, mutate: func(s *State) { s.IFB = nil }, want: []string{"IFB pwbx does not exist"}},
		{name: "ifb wrong", plan: plan, mutate: func(s *State) {
			s.IFB.Kind, s.IFB.MTU, s.IFB.Up, s.IFB.Alias, s.IFB.Root = "dummy", 9000, false, "x", nil
		}, want: []string{"is a dummy", "MTU 9000, want 1500", "is down", `alias "x"`, "no TBF at the root"}},
		{name: "ifb tbf", plan: plan, mutate: func(s *State) { s.IFB.Root = &ko }, want: []string{"IFB pwbx: root is tbf rate 30000000bit"}},
		{name: "no hook", plan: plan, mutate: func(s *State) { s.Dev.Hook, s.Dev.Redirects = "", nil }, want: []string{"no ingress or clsact qdisc"}},
		{name: "no redirect", plan: plan, mutate: func(s *State) { s.Dev.Redirects = nil }, want: []string{"no filter redirecting"}},
		{name: "stale redirect", plan: plan, mutate: func(s *State) {
			s.Dev.Redirects = append(s.Dev.Redirects, Redirect{Prio: FilterPrio, Target: "ifindex 99"})
		}, want: []string{"redirects to ifindex 99"}},
		{name: "two redirects", plan: plan, mutate: func(s *State) { s.Dev.Redirects = append(s.Dev.Redirects, s.Dev.Redirects[0]) }, want: []string{"2 filters redirect"}},
		{name: "unrequested objects", plan: Plan{Dev: "veth1", MTU: 1500, IFB: "pwbx"}, mutate: func(*State) {},
			want: []string{"no ingress shaping is requested", "IFB pwbx exists, but no egress", "redirects to pwbx, want none"}},
		{name: "nothing requested, nothing there", plan: Plan{Dev: "veth1", MTU: 1500, IFB: "pwbx"}, mutate: func(s *State) {
			s.Dev.Root, s.Dev.Hook, s.Dev.Redirects, s.IFB = nil, "", nil, nil
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := good()
			c.mutate(&s)
			got := Diff(c.plan, s)
			if len(got) != len(c.want) {
				t.Fatalf("Diff = %q, want %d differences %q", got, len(c.want), c.want)
			}
			for i, w := range c.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("difference %d = %q, want it to contain %q", i, got[i], w)
				}
			}
		})
	}
}

// TestFakeApplyAllOrNothing: a failure at any step of Apply leaves the fake exactly as
// it was, and Observe of a successful Apply matches the plan.
func TestFakeApplyAllOrNothing(t *testing.T) {
	ctx := context.Background()
	in, _ := SizeTBF(10_000_000, 0, 1500)
	p := Plan{Dev: "veth1", MTU: 1500, IFB: "pwbx", Alias: "a", Ingress: &in, Egress: &in}
	for _, step := range []string{"create IFB", "ifb tbf", "root tbf", "add redirect"} {
		f := NewFake()
		f.AddLink("veth1", "veth", 1500)
		f.SetForeign("veth1", "", "ingress", 1)
		before := f.Dump()
		f.FailOn = step
		if err := f.Apply(ctx, p); err == nil {
			t.Fatalf("%s: Apply passed", step)
		}
		if got := f.Dump(); got != before {
			t.Errorf("%s: failed Apply changed state:\n%s", step, got)
		}
		f.FailOn = ""
		if err := f.Apply(ctx, p); err != nil {
			t.Fatal(err)
		}
		s, _ := f.Observe(ctx, "veth1", "pwbx")
		if d := Diff(p, s); d != nil || s.Dev.Hook != "ingress" || s.Dev.OtherFilters != 1 {
			t.Errorf("after Apply: %q, hook %q, %d other filters", d, s.Dev.Hook, s.Dev.OtherFilters)
		}
		if err := f.Remove(ctx, Removal{Dev: "veth1", IFBs: []string{"pwbx"}}); err != nil {
			t.Fatal(err)
		}
		if got := f.Dump(); got != before {
			t.Errorf("after Remove:\n%s\nwant:\n%s", got, before)
		}
	}
}
