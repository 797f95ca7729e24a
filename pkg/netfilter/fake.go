package netfilter

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
)

// Fake is an in-memory Backend for unit tests. It keeps rules per feature in install
// order, applies every call all or nothing, validates plans as the real backends do,
// and removes nothing-at-all successfully. Dump renders its whole state.
type Fake struct {
	mu    sync.Mutex
	rules map[string][]fakeRule // feature name -> rules in order
	fail  map[string]error      // operation -> error for its next call
	calls []string
}

type fakeRule struct {
	tag  Tag
	rule Rule
}

// NewFake returns an empty Fake.
func NewFake() *Fake { return &Fake{rules: map[string][]fakeRule{}, fail: map[string]error{}} }

// FailNext makes the next call of op ("apply", "check", "remove", "tags") fail with
// err, changing nothing.
func (f *Fake) FailNext(op string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail[op] = err
}

// Calls returns the operations called so far, e.g. "apply masq", "remove masq v4".
func (f *Fake) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

func (f *Fake) begin(op, detail string) error {
	f.calls = append(f.calls, strings.TrimSpace(op+" "+detail))
	if err, ok := f.fail[op]; ok {
		delete(f.fail, op)
		return err
	}
	return nil
}

func famString(s Families) string {
	switch s {
	case V4:
		return "v4"
	case V6:
		return "v6"
	case All:
		return "v4+v6"
	}
	return "none"
}

// Apply implements Backend.
func (f *Fake) Apply(_ context.Context, p Plan) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin("apply", p.Feature.Name); err != nil {
		return err
	}
	if err := p.Validate(); err != nil {
		return err
	}
	id := IDOf(p.Owner)
	fams := p.Families()
	var next []fakeRule
	for _, r := range f.rules[p.Feature.Name] {
		if r.tag.ID == id && (r.rule.Family == AnyFamily || fams.Has(r.rule.Family)) {
			continue
		}
		next = append(next, r)
	}
	for _, r := range p.Rules {
		next = append(next, fakeRule{tag: tagFor(p.Owner, r), rule: r})
	}
	f.rules[p.Feature.Name] = next
	return nil
}

// Check implements Backend.
func (f *Fake) Check(_ context.Context, p Plan) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin("check", p.Feature.Name); err != nil {
		return err
	}
	var have []string
	for _, r := range f.rules[p.Feature.Name] {
		if r.tag.Is(p.Owner) {
			have = append(have, r.tag.Fingerprint)
		}
	}
	return compareFingerprints(p, have)
}

// compareFingerprints is Check's verdict for all backends: have are the fingerprints
// found for p.Owner, in kernel order.
func compareFingerprints(p Plan, have []string) error {
	want := map[string]bool{}
	for _, r := range p.Rules {
		want[tagFor(p.Owner, r).Fingerprint] = true
	}
	got := map[string]bool{}
	for _, h := range have {
		got[h] = true
	}
	for _, r := range p.Rules {
		if !got[tagFor(p.Owner, r).Fingerprint] {
			return notFound("%s rule for %s is missing: %s", p.Feature.Name, p.Owner, r)
		}
	}
	for h := range got {
		if !want[h] {
			return fmt.Errorf("%s has a rule for %s that its configuration does not ask for (fingerprint %s); run DEL and ADD again", p.Feature.Name, p.Owner, h)
		}
	}
	if len(have) != len(p.Rules) {
		return fmt.Errorf("%s has %d rules for %s, want %d; run DEL and ADD again", p.Feature.Name, len(have), p.Owner, len(p.Rules))
	}
	return nil
}

// Remove implements Backend.
func (f *Fake) Remove(_ context.Context, feat Feature, id OwnerID, fams Families) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin("remove", feat.Name+" "+famString(fams)); err != nil {
		return err
	}
	var next []fakeRule
	for _, r := range f.rules[feat.Name] {
		if r.tag.ID == id && (r.rule.Family == AnyFamily || fams.Has(r.rule.Family)) {
			continue
		}
		next = append(next, r)
	}
	if len(next) == 0 {
		delete(f.rules, feat.Name)
	} else {
		f.rules[feat.Name] = next
	}
	return nil
}

// Tags implements Backend.
func (f *Fake) Tags(_ context.Context, feat Feature) ([]Tag, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin("tags", feat.Name); err != nil {
		return nil, err
	}
	var out []Tag
	for _, r := range f.rules[feat.Name] {
		out = append(out, r.tag)
	}
	return out, nil
}

// Dump renders the state sorted by feature, then owner key, then install order:
// "<feature> <owner> <rule>" per line; "" when empty.
func (f *Fake) Dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var feats []string
	for k := range f.rules {
		feats = append(feats, k)
	}
	sort.Strings(feats)
	var lines []string
	for _, k := range feats {
		rs := append([]fakeRule(nil), f.rules[k]...)
		sort.SliceStable(rs, func(i, j int) bool { return rs[i].tag.Owner.Key() < rs[j].tag.Owner.Key() })
		for _, r := range rs {
			lines = append(lines, fmt.Sprintf("%s %s %s", k, r.tag.Owner.Key(), r.rule))
		}
	}
	if len(lines) == 0 {
		return ""
	}
	return strings.Join(lines, "\n") + "\n"
}
