// SPDX-License-Identifier: Apache-2.0

package link

import (
	"errors"
	"io/fs"
	"os"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
)

// The test binary is also DeleteOffExit's child.
func TestMain(m *testing.M) {
	RunDeleteChild()
	os.Exit(m.Run())
}

// TestDeleteOffExit: deleting the pod end of a veth removes both ends by the time the
// call returns; a missing link is success, a missing namespace an fs.ErrNotExist
// error; and the child, still in the kernel, does not keep the pod's namespace mount
// busy (the runtime unmounts it right after DEL).
func TestDeleteOffExit(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces; run as root (CI does)")
	}
	host, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { host.Close(); testutils.UnmountNS(host) }()

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
		if err := DeleteOffExit(pod.Path(), "eth0"); err != nil {
			t.Fatalf("DeleteOffExit: %v", err)
		}
		for _, c := range []struct {
			n    ns.NetNS
			name string
		}{{pod, "eth0"}, {host, "di-host"}} {
			_ = c.n.Do(func(ns.NetNS) error {
				if _, err := netlink.LinkByName(c.name); !IsNotFound(err) {
					t.Errorf("%s still there after DeleteOffExit returned (%v)", c.name, err)
				}
				return nil
			})
		}
		if err := DeleteOffExit(pod.Path(), "eth0"); err != nil {
			t.Errorf("DeleteOffExit of a missing link: %v", err)
		}
		path := pod.Path()
		pod.Close()
		if err := testutils.UnmountNS(pod); err != nil {
			t.Fatalf("unmounting the namespace right after DeleteOffExit: %v", err)
		}
		if err := DeleteOffExit(path, "eth0"); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("DeleteOffExit in a removed namespace: %v, want fs.ErrNotExist", err)
		}
	}
	// The calling thread's namespace (""), as bandwidth deletes its IFB.
	err = host.Do(func(ns.NetNS) error {
		if err := netlink.LinkAdd(&netlink.Ifb{LinkAttrs: netlink.LinkAttrs{Name: "di-ifb"}}); err != nil {
			return err
		}
		if err := DeleteOffExit("", "di-ifb"); err != nil {
			return err
		}
		if _, err := netlink.LinkByName("di-ifb"); !IsNotFound(err) {
			t.Errorf("di-ifb still there after DeleteOffExit returned (%v)", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
