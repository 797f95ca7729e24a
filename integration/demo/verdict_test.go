// SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"
	"strings"
	"testing"
)

// TestVerdict: the judgement tells a pod that is not shaped, or shaped wrongly, from a
// machine too busy to keep the shaper fed.
func TestVerdict(t *testing.T) {
	shaped := flow{Limit: 10e6, Link: "veth1", TBFRate: 10e6, Sent: 10.02e6, Throttled: 1, Goodput: 9.6e6}
	for _, c := range []struct {
		name string
		edit func(*flow)
		want string // "" ok, "inconclusive", or a part of the error
	}{
		{"shaped", func(*flow) {}, ""},
		{"shaped, receiver read late", func(f *flow) { f.Goodput = 13e6 }, ""},
		{"shaped, at the tolerance", func(f *flow) { f.Sent = 10.9e6 }, ""},
		{"no TBF, line rate", func(f *flow) { *f = flow{Limit: 10e6, Goodput: 1500e6} }, "not shaped: the receiver got 1500.0"},
		{"no TBF, slow receiver", func(f *flow) { *f = flow{Limit: 10e6, Link: "ifb0", Goodput: 9e6} }, "no TBF qdisc"},
		{"TBF bypassed", func(f *flow) { f.Goodput = 900e6 }, "not shaped"},
		{"TBF at 100 Mbit/s", func(f *flow) { f.TBFRate, f.Sent, f.Goodput = 100e6, 100e6, 14e6 }, "above 10 Mbit/s"},
		{"TBF slightly fast", func(f *flow) { f.Sent = 11.5e6 }, "above 10 Mbit/s"},
		{"TBF too slow, saturated", func(f *flow) { f.Sent, f.Throttled = 5e6, 1 }, "shaped below the limit"},
		{"sender starved", func(f *flow) { f.Sent, f.Throttled = 8.65e6, 0.25 }, "inconclusive"},
	} {
		f := shaped
		c.edit(&f)
		err := verdict(f)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.want == "inconclusive" && !errors.Is(err, errInconclusive):
			t.Errorf("%s: %v, want inconclusive", c.name, err)
		case c.want != "" && c.want != "inconclusive" && (err == nil || errors.Is(err, errInconclusive) || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v, want a failure with %q", c.name, err, c.want)
		}
	}
}
