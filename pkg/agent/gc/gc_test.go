// SPDX-License-Identifier: Apache-2.0

package gc

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
)

// fakeCNI models libcni over a result cache and a lease table: GCNetworkList DELs the
// cached attachments that are not valid (dropping their leases), then "the plugins' GC"
// drops leases of any other invalid container.
type fakeCNI struct {
	cache     []*libcni.NetworkAttachment
	leases    map[string]string // address -> container
	gotArgs   *libcni.GCArgs
	gotVer    string
	statusErr error
}

func (f *fakeCNI) GetCachedAttachments(string) ([]*libcni.NetworkAttachment, error) {
	return f.cache, nil
}

func (f *fakeCNI) GetStatusNetworkList(_ context.Context, l *libcni.NetworkConfigList) error {
	f.gotVer = l.CNIVersion
	return f.statusErr
}

func (f *fakeCNI) GCNetworkList(_ context.Context, l *libcni.NetworkConfigList, args *libcni.GCArgs) error {
	f.gotArgs, f.gotVer = args, l.CNIVersion
	valid := map[string]bool{}
	for _, a := range args.ValidAttachments {
		valid[a.ContainerID] = true
	}
	var keep []*libcni.NetworkAttachment
	for _, a := range f.cache {
		if a.Network != l.Name || valid[a.ContainerID] {
			keep = append(keep, a)
		}
	}
	f.cache = keep
	for ip, c := range f.leases {
		if !valid[c] {
			delete(f.leases, ip)
		}
	}
	return nil
}

type leaseCounter struct{ f *fakeCNI }

func (c leaseCounter) Snapshot(string) (Snapshot, error) {
	s := Snapshot{"lease": {}, "attachment": {}}
	for ip := range c.f.leases {
		s["lease"][ip] = true
	}
	for _, a := range c.f.cache {
		s["attachment"][a.ContainerID] = true
	}
	return s, nil
}

func conflist(t *testing.T, v string) *libcni.NetworkConfigList {
	t.Helper()
	l, err := libcni.ConfListFromBytes([]byte(fmt.Sprintf(`{"cniVersion":%q,"name":"podwire","plugins":[{"type":"bridge"}]}`, v)))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestValidAttachments(t *testing.T) {
	cached := []*libcni.NetworkAttachment{
		{ContainerID: "live", IfName: "net1", Network: "podwire"},
		{ContainerID: "dead", IfName: "eth0", Network: "podwire"},
		{ContainerID: "live", IfName: "eth0", Network: "other"},
	}
	got := ValidAttachments("podwire", []string{"live", "nocache"}, cached)
	want := []types.GCAttachment{{ContainerID: "live", IfName: "eth0"}, {ContainerID: "live", IfName: "net1"}, {ContainerID: "nocache", IfName: "eth0"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("ValidAttachments = %v, want %v", got, want)
	}
}

func TestRunReclaims(t *testing.T) {
	f := &fakeCNI{
		cache: []*libcni.NetworkAttachment{
			{ContainerID: "a", IfName: "eth0", Network: "podwire"},
			{ContainerID: "gone", IfName: "eth0", Network: "podwire"},
		},
		leases: map[string]string{"10.244.1.2": "a", "10.244.1.3": "gone", "10.244.1.4": "nocache-gone"},
	}
	d := &Driver{CNI: f, Counter: leaseCounter{f},
		Sandboxes: func(context.Context) ([]string, error) { return []string{"a"}, nil }}
	res, err := d.Run(context.Background(), conflist(t, "1.0.0"))
	if err != nil {
		t.Fatal(err)
	}
	if f.gotVer != "1.1.0" {
		t.Errorf("GC ran at cniVersion %s; it needs 1.1.0 for the GC verb", f.gotVer)
	}
	if res.Stale != 1 || res.Reclaimed["lease"] != 2 || res.Reclaimed["attachment"] != 1 {
		t.Errorf("result %+v", res)
	}
	if len(f.leases) != 1 || f.leases["10.244.1.2"] != "a" {
		t.Errorf("leases left: %v", f.leases)
	}
}

func TestRunRefusesWithoutSandboxes(t *testing.T) {
	f := &fakeCNI{leases: map[string]string{"10.244.1.2": "a"}}
	d := &Driver{CNI: f, Sandboxes: func(context.Context) ([]string, error) { return nil, errors.New("connection refused") }}
	if _, err := d.Run(context.Background(), conflist(t, "1.1.0")); err == nil {
		t.Fatal("GC ran without knowing the sandboxes")
	}
	if f.gotArgs != nil || len(f.leases) != 1 {
		t.Error("GC was called")
	}
}

func TestStatus(t *testing.T) {
	f := &fakeCNI{statusErr: &types.Error{Code: 50, Msg: "bridge: not ready"}}
	err := Status(context.Background(), f, conflist(t, "1.0.0"))
	var te *types.Error
	if !errors.As(err, &te) || te.Code != 50 || f.gotVer != "1.1.0" {
		t.Errorf("Status = %v (version %s)", err, f.gotVer)
	}
}
