package link

import (
	"os"
	"testing"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
)

// TestCreateVethLikeReference: the pair looks as the reference's does (it creates the
// pair from the pod's side): the pod end has the kernel's default txqueuelen (1000),
// the host end 0, and the host end does not accept router advertisements.
func TestCreateVethLikeReference(t *testing.T) {
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

	var v *Veth
	err = host.Do(func(ns.NetNS) error {
		v, err = CreateVeth(VethSpec{PodIfName: "eth0", PodNSFd: int(pod.Fd())}, func(string) bool { return false })
		if err != nil {
			return err
		}
		l, err := netlinksafe.LinkByName(v.Host.Name)
		if err != nil {
			return err
		}
		if q := l.Attrs().TxQLen; q != 0 {
			t.Errorf("host end txqueuelen %d, want 0", q)
		}
		if ra, err := ReadSysctl("net/ipv6/conf/" + v.Host.Name + "/accept_ra"); err == nil && ra != "0" {
			t.Errorf("host end accept_ra %s, want 0", ra)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	err = pod.Do(func(ns.NetNS) error {
		l, err := netlinksafe.LinkByName("eth0")
		if err != nil {
			return err
		}
		if q := l.Attrs().TxQLen; q != 1000 {
			t.Errorf("pod end txqueuelen %d, want 1000", q)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestPrepareIPv6: IPv6 is turned back on for lo and the interface, and
// keep_addr_on_down set, as the reference does before adding IPv6 addresses.
func TestPrepareIPv6(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces; run as root (CI does)")
	}
	n, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { n.Close(); testutils.UnmountNS(n) }()
	err = n.Do(func(ns.NetNS) error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "d0"}, PeerName: "d1"}); err != nil {
			return err
		}
		for _, dev := range []string{"lo", "d0"} {
			if err := WriteSysctl("net/ipv6/conf/"+dev+"/disable_ipv6", "1"); err != nil {
				return err
			}
		}
		if err := PrepareIPv6("d0"); err != nil {
			return err
		}
		for key, want := range map[string]string{
			"net/ipv6/conf/lo/disable_ipv6": "0", "net/ipv6/conf/d0/disable_ipv6": "0", "net/ipv6/conf/d0/keep_addr_on_down": "1",
		} {
			if got, err := ReadSysctl(key); err != nil || got != want {
				t.Errorf("%s = %q, %v; want %s", key, got, err, want)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
