// SPDX-License-Identifier: Apache-2.0

package gc

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
)

// TestYoungKeepsLeasesOfRunningADDs: a lease written within the grace period keeps its
// attachment whatever the runtime lists; an older one does not; none without a network
// directory or with grace 0.
func TestYoungKeepsLeasesOfRunningADDs(t *testing.T) {
	dir := t.TempDir()
	net := filepath.Join(dir, "podwire")
	if err := os.MkdirAll(net, 0o755); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for ip, c := range map[string]string{"10.1.0.2": "new", "10.1.0.3": "old"} {
		p := filepath.Join(net, ip)
		if err := os.WriteFile(p, []byte(c+"\r\neth0"), 0o644); err != nil {
			t.Fatal(err)
		}
		if c == "old" {
			if err := os.Chtimes(p, now.Add(-time.Hour), now.Add(-time.Hour)); err != nil {
				t.Fatal(err)
			}
		}
	}
	got, err := Young(context.Background(), dir, "podwire", time.Minute, now)
	if err != nil {
		t.Fatal(err)
	}
	if want := []types.GCAttachment{{ContainerID: "new", IfName: "eth0"}}; len(got) != 1 || got[0] != want[0] {
		t.Errorf("Young = %v, want %v", got, want)
	}
	if got, err := Young(context.Background(), dir, "other", time.Minute, now); err != nil || len(got) != 0 {
		t.Errorf("Young of a network without a directory = %v, %v", got, err)
	}
	if got, err := Young(context.Background(), dir, "podwire", 0, now); err != nil || len(got) != 0 {
		t.Errorf("Young with grace 0 = %v, %v", got, err)
	}
}

// TestRunKeepsYoung: the driver passes young attachments as valid and counts them.
func TestRunKeepsYoung(t *testing.T) {
	f := &fakeCNI{leases: map[string]string{}}
	d := &Driver{CNI: f,
		Sandboxes: func(context.Context) ([]string, error) { return []string{"live"}, nil },
		Young: func(context.Context, string) ([]types.GCAttachment, error) {
			return []types.GCAttachment{{ContainerID: "adding", IfName: "eth0"}, {ContainerID: "live", IfName: "eth0"}}, nil
		}}
	list, err := libcni.ConfListFromBytes([]byte(`{"cniVersion":"1.1.0","name":"podwire","plugins":[{"type":"loopback"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	res, err := d.Run(context.Background(), list)
	if err != nil {
		t.Fatal(err)
	}
	if res.Valid != 2 || res.Young != 1 || len(f.gotArgs.ValidAttachments) != 2 {
		t.Errorf("Run = %+v, valid passed %v", res, f.gotArgs.ValidAttachments)
	}
}
