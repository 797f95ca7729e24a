package link

import (
	"os"
	"testing"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
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
