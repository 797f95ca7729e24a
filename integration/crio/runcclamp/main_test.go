// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestClamp runs clamp over a bundle as conmon hands it to the runtime (global flags
// with separate values before the command): the score is raised to this process's
// own, the hugetlb limits go where no hierarchy mounts hugetlb, and 64-bit numbers
// come back unchanged. Other commands leave the spec alone.
func TestClamp(t *testing.T) {
	own, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		t.Fatal(err)
	}
	floor, _ := strconv.Atoi(strings.TrimSpace(string(own)))
	const spec = `{"process":{"oomScoreAdj":-998},"linux":{"resources":{"memory":{"limit":9223372036854771712},"hugepageLimits":[{"pageSize":"2MB","limit":0}]}}}`
	for _, tc := range []struct {
		name   string
		args   func(bundle string) []string
		change bool
	}{
		{"create after --root DIR", func(b string) []string {
			return []string{"--root", "/run/x", "--log", "/tmp/l", "create", "--bundle", b, "id"}
		}, true},
		{"run with --bundle=", func(b string) []string { return []string{"--root=/run/x", "run", "--bundle=" + b, "id"} }, true},
		{"start is left alone", func(b string) []string { return []string{"--root", "/run/x", "start", "--bundle", b, "id"} }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "config.json")
			if err := os.WriteFile(path, []byte(spec), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := clamp(tc.args(dir)); err != nil {
				t.Fatal(err)
			}
			b, _ := os.ReadFile(path)
			if !tc.change {
				if string(b) != spec {
					t.Fatalf("spec changed: %s", b)
				}
				return
			}
			var got struct {
				Process struct{ OOMScoreAdj int } `json:"process"`
				Linux   struct {
					Resources map[string]json.RawMessage `json:"resources"`
				} `json:"linux"`
			}
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatal(err)
			}
			if want := max(floor, -998); got.Process.OOMScoreAdj != want {
				t.Errorf("oomScoreAdj %d, want %d", got.Process.OOMScoreAdj, want)
			}
			if _, kept := got.Linux.Resources["hugepageLimits"]; kept != hugetlbMounted() {
				t.Errorf("hugepageLimits kept=%v with a hugetlb hierarchy mounted=%v", kept, hugetlbMounted())
			}
			if !strings.Contains(string(b), "9223372036854771712") {
				t.Errorf("the memory limit did not come back as it was: %s", b)
			}
		})
	}
}
