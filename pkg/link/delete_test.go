// SPDX-License-Identifier: Apache-2.0

package link

import (
	"context"
	"os"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
)

// TestNetlinkDelete: deleting the pod end of a veth removes both ends by the time the
// call returns, in the calling process (nothing is left running); a missing link and a
// removed namespace are success, as a repeated DEL needs; and the runtime can unmount
// the pod's namespace right after.
func TestNetlinkDelete(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces; run as root (CI does)")
	}
	ctx := context.Background()
	host, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { host.Close(); testutils.UnmountNS(host) }()
	b := NewNetlink()

	for i := 0; i < 3; i++ {
		pod, err := testutils.NewNS()
		if err != nil {
			t.Fatal(err)
		}
		err = host.Do(func(ns.NetNS) error {
			la := netlink.NewLinkAttrs()
			la.Name = "di-host"
			return netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(pod.Fd()))})
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Delete(ctx, Ref{Netns: pod.Path(), Name: "eth0"}); err != nil {
			t.Fatalf("Delete: %v", err)
		}
		for _, c := range []struct {
			n    ns.NetNS
			name string
		}{{pod, "eth0"}, {host, "di-host"}} {
			_ = c.n.Do(func(ns.NetNS) error {
				if _, err := netlink.LinkByName(c.name); !isKernelNotFound(err) {
					t.Errorf("%s still there after Delete returned (%v)", c.name, err)
				}
				return nil
			})
		}
		if err := b.Delete(ctx, Ref{Netns: pod.Path(), Name: "eth0"}); err != nil {
			t.Errorf("Delete of a missing link: %v", err)
		}
		path := pod.Path()
		pod.Close()
		if err := testutils.UnmountNS(pod); err != nil {
			t.Fatalf("unmounting the namespace right after Delete: %v", err)
		}
		if err := b.Delete(ctx, Ref{Netns: path, Name: "eth0"}); err != nil {
			t.Errorf("Delete in a removed namespace: %v, want success", err)
		}
	}
	// The calling thread's namespace (""), as bandwidth deletes its IFB.
	err = host.Do(func(ns.NetNS) error {
		if err := netlink.LinkAdd(&netlink.Ifb{LinkAttrs: netlink.LinkAttrs{Name: "di-ifb"}}); err != nil {
			return err
		}
		if err := b.Delete(ctx, Ref{Name: "di-ifb"}); err != nil {
			return err
		}
		if _, err := netlink.LinkByName("di-ifb"); !isKernelNotFound(err) {
			t.Errorf("di-ifb still there after Delete returned (%v)", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
