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

// TestDeleteIn: deleting the pod end of a veth removes both ends; a missing link is
// success, a missing namespace an fs.ErrNotExist error; and nothing keeps the pod's
// namespace mount busy afterwards (the runtime unmounts it right after DEL).
func TestDeleteIn(t *testing.T) {
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
		if err := DeleteIn(pod.Path(), "eth0"); err != nil {
			t.Fatalf("DeleteIn: %v", err)
		}
		for _, c := range []struct {
			n    ns.NetNS
			name string
		}{{pod, "eth0"}, {host, "di-host"}} {
			_ = c.n.Do(func(ns.NetNS) error {
				if _, err := netlink.LinkByName(c.name); !IsNotFound(err) {
					t.Errorf("%s still there after DeleteIn returned (%v)", c.name, err)
				}
				return nil
			})
		}
		if err := DeleteIn(pod.Path(), "eth0"); err != nil {
			t.Errorf("DeleteIn of a missing link: %v", err)
		}
		path := pod.Path()
		pod.Close()
		if err := testutils.UnmountNS(pod); err != nil {
			t.Fatalf("unmounting the namespace right after DeleteIn: %v", err)
		}
		if err := DeleteIn(path, "eth0"); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("DeleteIn in a removed namespace: %v, want fs.ErrNotExist", err)
		}
	}
}
