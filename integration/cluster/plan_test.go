// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"strings"
	"testing"
)

// TestPlanRuntimes: RUNTIMES gives each node its runtime in order, none means
// containerd everywhere, and a wrong list is refused with what to write.
func TestPlanRuntimes(t *testing.T) {
	for _, tc := range []struct {
		name     string
		nodes    int
		runtimes []string
		want     string
		wantErr  string
	}{
		{name: "default", nodes: 2, want: "containerd,containerd"},
		{name: "second on CRI-O", nodes: 2, runtimes: []string{"containerd", "crio"}, want: "containerd,crio"},
		{name: "one CRI-O node", nodes: 1, runtimes: []string{"crio"}, want: "crio"},
		{name: "too few", nodes: 2, runtimes: []string{"crio"}, wantErr: "one per node in order, e.g. RUNTIMES=containerd,crio"},
		{name: "unknown", nodes: 2, runtimes: []string{"containerd", "cri-o"}, wantErr: `runtime "cri-o" for node 2: write containerd or crio`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig("/repo")
			c.NodeCount, c.Runtimes = tc.nodes, tc.runtimes
			p, err := NewPlan(c)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("NewPlan: %v, want an error with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(p.runtimes(), ","); got != tc.want {
				t.Errorf("runtimes %s, want %s", got, tc.want)
			}
			for _, n := range p.Nodes {
				if want := map[string]string{"containerd": criSocket, "crio": crioSocket}[n.Runtime]; n.socket() != want || !strings.Contains(p.kubeletConfig(n), "containerRuntimeEndpoint: unix://"+want+"\n") {
					t.Errorf("node %s (%s): kubelet's runtime endpoint is not %s", n.Name, n.Runtime, want)
				}
			}
		})
	}
}
