// SPDX-License-Identifier: Apache-2.0

package runtimes

import "testing"

func TestLookup(t *testing.T) {
	cases := []struct {
		name, version string
		max           string
		status        bool
		gc            GCPolicy
		known         bool
	}{
		{"containerd", "1.6.20~ds1", "1.0.0", false, GCNever, true}, // Debian 12
		{"containerd", "v1.6.0", "1.0.0", false, GCNever, true},
		{"containerd", "v1.7.27", "1.0.0", false, GCNever, true},
		{"containerd", "v2.0.0", "1.1.0", false, GCNever, true},
		{"containerd", "v2.0.0-rc.3", "1.1.0", false, GCNever, true},
		{"containerd", "v2.0.1", "1.1.0", true, GCNever, true},
		{"containerd", "v2.4.2", "1.1.0", true, GCNever, true},
		{"containerd", "2.4.2+unknown", "1.1.0", true, GCNever, true},
		{"Containerd", "v3.0.0", "1.1.0", true, GCNever, true},
		{"containerd", "v1.5.18", "1.0.0", false, GCNever, false},
		{"cri-o", "1.30.4", "1.0.0", false, GCNever, true},
		{"cri-o", "1.31.0", "1.1.0", true, GCAtStartup, true},
		{"cri-o", "1.34.1", "1.1.0", true, GCAtStartup, true},
		{"docker", "27.0.0", "1.0.0", false, GCNever, false},
		{"containerd", "", "1.0.0", false, GCNever, false},
		{"containerd", "garbage", "1.0.0", false, GCNever, false},
		{"containerd", "2", "1.0.0", false, GCNever, false},
	}
	for _, c := range cases {
		got := Lookup(c.name, c.version)
		if got.MaxCNIVersion != c.max || got.CallsStatus != c.status || got.GC != c.gc || got.Known != c.known {
			t.Errorf("Lookup(%q, %q) = %+v; want max %s status %v gc %v known %v",
				c.name, c.version, got, c.max, c.status, c.gc, c.known)
		}
		if v := CNIVersion(c.name, c.version); v != c.max {
			t.Errorf("CNIVersion(%q, %q) = %s, want %s", c.name, c.version, v, c.max)
		}
	}
}

func TestParseVersion(t *testing.T) {
	cases := map[string]Version{
		"v1.6.20":     {1, 6, 20},
		"1.6.20~ds1":  {1, 6, 20},
		"2.0.0-rc.1":  {2, 0, 0},
		" v2.1 ":      {2, 1, 0},
		"1.31.0-dev":  {1, 31, 0},
		"10.2.3.4.5":  {10, 2, 3},
		"1.7.0+gitab": {1, 7, 0},
	}
	for in, want := range cases {
		got, ok := ParseVersion(in)
		if !ok || got != want {
			t.Errorf("ParseVersion(%q) = %v %v, want %v", in, got, ok, want)
		}
	}
	for _, bad := range []string{"", "v", "x1.2", "1", "1.", ".1.2"} {
		if _, ok := ParseVersion(bad); ok {
			t.Errorf("ParseVersion(%q) ok, want failure", bad)
		}
	}
}

func TestAgentMustGC(t *testing.T) {
	if !AgentMustGC(Lookup("containerd", "2.4.2")) || !AgentMustGC(Lookup("cri-o", "1.31.0")) {
		t.Error("the agent must drive GC for containerd and CRI-O (neither runs it periodically)")
	}
	if AgentMustGC(Capabilities{GC: GCPeriodic}) {
		t.Error("a runtime with periodic GC does not need the agent's")
	}
}
