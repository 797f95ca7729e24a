package link

import (
	"os"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
)

// The test binary is also the helper DeleteDetached starts.
func TestMain(m *testing.M) {
	RunHelper()
	os.Exit(m.Run())
}

// TestDeleteDetached: the veth is gone from both namespaces when DeleteDetached
// returns (the helper did it, or the fallback), and a missing link is success.
func TestDeleteDetached(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces; run as root (CI does)")
	}
	host, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { host.Close(); testutils.UnmountNS(host) }()
	pod, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { pod.Close(); testutils.UnmountNS(pod) }()

	for i := 0; i < 3; i++ {
		err := host.Do(func(ns.NetNS) error {
			la := netlink.NewLinkAttrs()
			la.Name = "dd-host"
			return netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(pod.Fd()))})
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := DeleteDetached(pod.Path(), "eth0"); err != nil {
			t.Fatalf("DeleteDetached: %v", err)
		}
		for _, c := range []struct {
			n    ns.NetNS
			name string
		}{{pod, "eth0"}, {host, "dd-host"}} {
			_ = c.n.Do(func(ns.NetNS) error {
				if _, err := netlink.LinkByName(c.name); !IsNotFound(err) {
					t.Errorf("%s still there after DeleteDetached returned (%v)", c.name, err)
				}
				return nil
			})
		}
	}
	if err := DeleteDetached(pod.Path(), "eth0"); err != nil {
		t.Errorf("DeleteDetached of a missing link: %v", err)
	}
	// The calling thread's namespace ("").
	err = host.Do(func(ns.NetNS) error {
		if err := netlink.LinkAdd(&netlink.Ifb{LinkAttrs: netlink.LinkAttrs{Name: "dd-ifb"}}); err != nil {
			return err
		}
		if err := DeleteDetached("", "dd-ifb"); err != nil {
			return err
		}
		if _, err := netlink.LinkByName("dd-ifb"); !IsNotFound(err) {
			t.Errorf("dd-ifb still there (%v)", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestDeleteDetachedUnmount: the runtime unmounts the pod's namespace right after DEL;
// the helper, still waiting in the kernel, must not keep that mount busy.
func TestDeleteDetachedUnmount(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces; run as root (CI does)")
	}
	for i := 0; i < 3; i++ {
		pod, err := testutils.NewNS()
		if err != nil {
			t.Fatal(err)
		}
		err = pod.Do(func(ns.NetNS) error {
			la := netlink.NewLinkAttrs()
			la.Name = "eth0"
			return netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "eth1"})
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := DeleteDetached(pod.Path(), "eth0"); err != nil {
			t.Fatalf("DeleteDetached: %v", err)
		}
		pod.Close()
		if err := testutils.UnmountNS(pod); err != nil {
			t.Fatalf("unmounting the namespace right after DeleteDetached: %v", err)
		}
	}
}
