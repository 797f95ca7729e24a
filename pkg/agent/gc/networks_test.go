// SPDX-License-Identifier: Apache-2.0

package gc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
)

func TestPlanNetwork(t *testing.T) {
	cached := []*libcni.NetworkAttachment{
		{ContainerID: "live", IfName: "lo", Network: "cni-loopback"},
		{ContainerID: "dead", IfName: "lo", Network: "cni-loopback"},
		{ContainerID: "adding", IfName: "lo", Network: "cni-loopback"},
		{ContainerID: "dead", IfName: "eth0", Network: "podwire"},
		{ContainerID: "podman1", IfName: "eth0", Network: "podman"},
	}
	young := []types.GCAttachment{{ContainerID: "adding", IfName: "lo"}}
	for _, tc := range []struct {
		name, network    string
		live             []string
		young            []types.GCAttachment
		wantValid, stale string
	}{
		{name: "killed sandbox's loopback entry is stale", network: "cni-loopback", live: []string{"live"}, young: young,
			wantValid: "adding/lo live/eth0 live/lo", stale: "dead/lo"},
		{name: "without grace an ADD in flight loses its entry", network: "cni-loopback", live: []string{"live"},
			wantValid: "live/eth0 live/lo", stale: "adding/lo dead/lo"},
		{name: "only the network's own entries", network: "podwire", live: []string{"live"},
			wantValid: "live/eth0", stale: "dead/eth0"},
		{name: "every sandbox live", network: "cni-loopback", live: []string{"live", "dead", "adding"},
			wantValid: "adding/eth0 adding/lo dead/eth0 dead/lo live/eth0 live/lo"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := PlanNetwork(tc.network, tc.live, cached, tc.young)
			if got := attachments(p.Valid); got != tc.wantValid {
				t.Errorf("valid = %q, want %q", got, tc.wantValid)
			}
			if got := attachments(p.Stale); got != tc.stale {
				t.Errorf("stale = %q, want %q", got, tc.stale)
			}
		})
	}
}

func attachments(as []types.GCAttachment) string {
	var s []string
	for _, a := range as {
		s = append(s, a.ContainerID+"/"+a.IfName)
	}
	return strings.Join(s, " ")
}

func lists(t *testing.T, confs ...string) []*libcni.NetworkConfigList {
	t.Helper()
	var out []*libcni.NetworkConfigList
	for _, c := range confs {
		l, err := libcni.ConfListFromBytes([]byte(c))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, l)
	}
	return out
}

const loopbackConf = `{"cniVersion":"0.3.1","name":"cni-loopback","plugins":[{"type":"loopback"}]}`

// recordingCNI is fakeCNI recording the version each network's GC ran at, and failing
// the networks in fail.
type recordingCNI struct {
	fakeCNI
	ver  map[string]string
	fail map[string]bool
}

func (r *recordingCNI) GCNetworkList(ctx context.Context, l *libcni.NetworkConfigList, args *libcni.GCArgs) error {
	r.ver[l.Name] = l.CNIVersion
	if r.fail[l.Name] {
		return errors.New("plugin type=\"loopback\" failed (delete): boom")
	}
	return r.fakeCNI.GCNetworkList(ctx, l, args)
}

// TestRunPrunesRuntimeNetworks: after the agent's network, GC runs for each network the
// runtime reports, at that conflist's version, with the same live sandboxes and young
// attachments: a killed sandbox's cni-loopback entry goes and is counted; a live pod's,
// a young one's and another runtime's network's entries stay.
func TestRunPrunesRuntimeNetworks(t *testing.T) {
	f := &recordingCNI{ver: map[string]string{}, fakeCNI: fakeCNI{
		cache: []*libcni.NetworkAttachment{
			{ContainerID: "live", IfName: "eth0", Network: "podwire"},
			{ContainerID: "live", IfName: "lo", Network: "cni-loopback"},
			{ContainerID: "dead", IfName: "eth0", Network: "podwire"},
			{ContainerID: "dead", IfName: "lo", Network: "cni-loopback"},
			{ContainerID: "adding", IfName: "lo", Network: "cni-loopback"},
			{ContainerID: "podman1", IfName: "eth0", Network: "podman"},
		},
		leases: map[string]string{},
	}}
	d := &Driver{CNI: f,
		Sandboxes: func(context.Context) ([]string, error) { return []string{"live"}, nil },
		Young: func(_ context.Context, network string) ([]types.GCAttachment, error) {
			if network == "cni-loopback" {
				return []types.GCAttachment{{ContainerID: "adding", IfName: "lo"}}, nil
			}
			return nil, nil
		},
		Networks: func(context.Context) ([]*libcni.NetworkConfigList, error) {
			// containerd reports its copy of the agent's conflist too
			return lists(t, loopbackConf, `{"cniVersion":"1.0.0","name":"podwire","plugins":[{"type":"bridge"}]}`), nil
		}}
	res, err := d.Run(context.Background(), conflist(t, "1.0.0"))
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, a := range f.cache {
		left = append(left, a.Network+"/"+a.ContainerID+"/"+a.IfName)
	}
	if got, want := strings.Join(left, " "), "podwire/live/eth0 cni-loopback/live/lo cni-loopback/adding/lo podman/podman1/eth0"; got != want {
		t.Errorf("cache after GC:\n got %s\nwant %s", got, want)
	}
	if fmt.Sprint(f.ver) != "map[cni-loopback:0.3.1 podwire:1.1.0]" {
		t.Errorf("GC ran for networks at versions %v; want the agent's at 1.1.0, cni-loopback at its own 0.3.1, podman's never", f.ver)
	}
	if len(res.Runtime) != 1 || res.Runtime[0] != (NetworkResult{Network: "cni-loopback", Valid: 3, Stale: 1, Reclaimed: 1}) {
		t.Errorf("runtime networks' results %+v", res.Runtime)
	}
	if res.Reclaimed[KindRuntimeAttachment] != 1 || res.Stale != 1 {
		t.Errorf("result %+v", res)
	}
}

// TestRunRuntimeNetworkErrors: a failing network, or a runtime that cannot list its
// networks, is an error of the run; the other networks still run.
func TestRunRuntimeNetworkErrors(t *testing.T) {
	f := &recordingCNI{ver: map[string]string{}, fail: map[string]bool{"cni-loopback": true}, fakeCNI: fakeCNI{
		cache: []*libcni.NetworkAttachment{
			{ContainerID: "dead", IfName: "lo", Network: "cni-loopback"},
			{ContainerID: "dead", IfName: "net1", Network: "extra"},
		},
		leases: map[string]string{},
	}}
	d := &Driver{CNI: f,
		Sandboxes: func(context.Context) ([]string, error) { return nil, nil },
		Networks: func(context.Context) ([]*libcni.NetworkConfigList, error) {
			return lists(t, loopbackConf, `{"cniVersion":"1.1.0","name":"extra","plugins":[{"type":"bridge"}]}`), errors.New("one network unreadable")
		}}
	res, err := d.Run(context.Background(), conflist(t, "1.1.0"))
	if err == nil || !strings.Contains(err.Error(), "cni-loopback") || !strings.Contains(err.Error(), "one network unreadable") {
		t.Errorf("Run = %v; want both the failed network and the listing error", err)
	}
	if len(f.cache) != 1 || f.cache[0].Network != "cni-loopback" {
		t.Errorf("cache after GC %v; want only the failed network's entry left", f.cache)
	}
	if res.Reclaimed[KindRuntimeAttachment] != 1 {
		t.Errorf("reclaimed %v; want the extra network's entry counted", res.Reclaimed)
	}
}

// TestYoungCached: a cache entry written within the grace keeps its attachment, an
// older or missing one does not, nor an entry of another network.
func TestYoungCached(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "results"), 0o700); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for name, age := range map[string]time.Duration{"cni-loopback-new-lo": 0, "cni-loopback-old-lo": time.Hour, "podwire-new-eth0": 0} {
		p := filepath.Join(dir, "results", name)
		if err := os.WriteFile(p, []byte("{}"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, now.Add(-age), now.Add(-age)); err != nil {
			t.Fatal(err)
		}
	}
	cached := []*libcni.NetworkAttachment{
		{ContainerID: "new", IfName: "lo", Network: "cni-loopback"},
		{ContainerID: "old", IfName: "lo", Network: "cni-loopback"},
		{ContainerID: "gone", IfName: "lo", Network: "cni-loopback"},
		{ContainerID: "new", IfName: "eth0", Network: "podwire"},
	}
	got, err := YoungCached(dir, "cni-loopback", cached, time.Minute, now)
	if err != nil {
		t.Fatal(err)
	}
	if attachments(got) != "new/lo" {
		t.Errorf("YoungCached = %v, want new/lo", got)
	}
	if got, _ := YoungCached(dir, "cni-loopback", cached, 0, now); len(got) != 0 {
		t.Errorf("YoungCached with grace 0 = %v", got)
	}
}
