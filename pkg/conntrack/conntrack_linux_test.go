// SPDX-License-Identifier: Apache-2.0

package conntrack

import (
	"fmt"
	"net"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podwire/podwire/internal/testenv"
)

func inFreshNS(t *testing.T, f func()) {
	t.Helper()
	testenv.RequireRoot(t)
	n, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = n.Close()
		_ = testutils.UnmountNS(n)
	})
	if err := n.Do(func(ns.NetNS) error { f(); return nil }); err != nil {
		t.Fatal(err)
	}
}

func udpFlow(fam netlink.InetFamily, src, dst string, dport uint16) *netlink.ConntrackFlow {
	return &netlink.ConntrackFlow{
		FamilyType: uint8(fam),
		Forward:    netlink.IPTuple{SrcIP: net.ParseIP(src), DstIP: net.ParseIP(dst), Protocol: unix.IPPROTO_UDP, SrcPort: 40000, DstPort: dport},
		Reverse:    netlink.IPTuple{SrcIP: net.ParseIP(dst), DstIP: net.ParseIP(src), Protocol: unix.IPPROTO_UDP, SrcPort: dport, DstPort: 40000},
		TimeOut:    100,
	}
}

// TestDeleteUDPDstPorts creates real conntrack entries in a fresh namespace and
// requires that exactly the UDP ones to the given ports go, per family.
func TestDeleteUDPDstPorts(t *testing.T) {
	var createErr error
	inFreshNS(t, func() {
		flows := []*netlink.ConntrackFlow{
			udpFlow(unix.AF_INET, "192.0.2.1", "192.0.2.2", 5353),
			udpFlow(unix.AF_INET, "192.0.2.1", "192.0.2.2", 5354),
			udpFlow(unix.AF_INET, "192.0.2.1", "192.0.2.2", 9999),
			udpFlow(unix.AF_INET6, "2001:db8::1", "2001:db8::2", 5353),
		}
		for _, f := range flows {
			if err := netlink.ConntrackCreate(netlink.ConntrackTable, netlink.InetFamily(f.FamilyType), f); err != nil {
				createErr = err
				return
			}
		}
		if n, err := DeleteUDPDstPorts(false, nil); n != 0 || err != nil {
			t.Errorf("no ports: %d, %v", n, err)
		}
		n, err := DeleteUDPDstPorts(false, []uint16{5353, 5354})
		if err != nil || n != 2 {
			t.Fatalf("DeleteUDPDstPorts(v4) = %d, %v; want 2", n, err)
		}
		left4, err := netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
		if err != nil {
			t.Fatal(err)
		}
		if len(left4) != 1 || left4[0].Forward.DstPort != 9999 {
			t.Errorf("IPv4 entries left: %v", left4)
		}
		left6, _ := netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET6)
		if len(left6) != 1 {
			t.Errorf("IPv6 entries left: %v (the IPv4 flush must not touch them)", left6)
		}
		if n, err := DeleteUDPDstPorts(true, []uint16{5353}); err != nil || n != 1 {
			t.Errorf("DeleteUDPDstPorts(v6) = %d, %v; want 1", n, err)
		}
	})
	// Here, on the test's goroutine: Skip and Fatal end only the goroutine they run on.
	if createErr != nil {
		testenv.KernelLacks(t, fmt.Sprintf("cannot create conntrack entries over netlink: %v", createErr), "CONFIG_NF_CONNTRACK", "CONFIG_NF_CT_NETLINK")
	}
}
