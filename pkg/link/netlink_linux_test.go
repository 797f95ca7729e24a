// SPDX-License-Identifier: Apache-2.0

package link

import (
	"context"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"

	"github.com/podwire/podwire/internal/testenv"
)

// freshNS is a new network namespace, removed at the end; without root it is testenv.Missing.
func freshNS(t *testing.T) ns.NetNS {
	t.Helper()
	testenv.RequireRoot(t)
	n, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close(); testutils.UnmountNS(n) })
	return n
}

func do(t *testing.T, n ns.NetNS, f func() error) {
	t.Helper()
	if err := n.Do(func(ns.NetNS) error { return f() }); err != nil {
		t.Fatal(err)
	}
}

func mac(last byte) net.HardwareAddr { return net.HardwareAddr{0x02, 0, 0, 0, 0, last} }

func run(t *testing.T, n ns.NetNS, args ...string) string {
	t.Helper()
	out, err := exec.Command("nsenter", append([]string{"--net=" + n.Path()}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %v\n%s", args, err, out)
	}
	return string(out)
}

// TestNetlinkAttachment walks one attachment through the kernel backend: the bridge,
// the veth (a taken name on either side is IsExists and changes nothing), the pod
// interface in a namespace with IPv6 disabled, Inspect, and Delete, which succeeds for
// missing links and for paths that are gone or are no namespace.
func TestNetlinkAttachment(t *testing.T) {
	host, pod := freshNS(t), freshNS(t)
	run(t, pod, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1")
	ctx := context.Background()
	b := NewNetlink()
	do(t, host, func() error {
		br, err := b.EnsureBridge(ctx, BridgeSpec{Name: "lt-br", MAC: mac(0xb0)})
		if err != nil {
			return err
		}
		if !br.Created || br.MAC.String() == mac(0xb0).String() {
			t.Errorf("new bridge = %+v (want the kernel's MAC, as the reference's gets)", br)
		}
		created := br.MAC
		if v, _ := readSysctl("net/ipv6/conf/lt-br/accept_ra"); v != "0" {
			t.Errorf("bridge accept_ra = %s", v)
		}
		if br, err = b.EnsureBridge(ctx, BridgeSpec{Name: "lt-br", MAC: mac(0xb1)}); err != nil || br.Created || br.MAC.String() != created.String() {
			t.Errorf("existing bridge = %+v, %v", br, err)
		}
		v := VethSpec{HostName: "lt-veth", HostMAC: mac(1), PodNetns: pod.Path(), PodName: "eth0", PodMAC: mac(2), Bridge: "lt-br",
			HostSysctls: []Sysctl{{Key: "net/ipv6/conf/lt-veth/accept_ra", Value: "0"}}}
		if err := b.CreateVeth(ctx, v); err != nil {
			return err
		}
		if err := b.CreateVeth(ctx, v); !IsExists(err) || !strings.Contains(err.Error(), "lt-veth") {
			t.Errorf("second veth with the host name taken: %v", err)
		}
		v2 := v
		v2.HostName = "lt-veth2"
		if err := b.CreateVeth(ctx, v2); !IsExists(err) || !strings.Contains(err.Error(), "eth0") {
			t.Errorf("second veth with the pod name taken: %v", err)
		}
		if _, err := netlink.LinkByName("lt-veth2"); err == nil {
			t.Error("the refused veth exists")
		}
		if v, _ := readSysctl("net/ipv6/conf/lt-veth/accept_ra"); v != "0" {
			t.Errorf("host veth accept_ra = %s", v)
		}
		gw := netip.MustParseAddr("fd00::1")
		err = b.ConfigurePod(ctx, PodSpec{Netns: pod.Path(), IfName: "eth0", Up: true,
			Sysctls: []Sysctl{{Key: "net/ipv6/conf/lo/disable_ipv6", Value: "0"}, {Key: "net/ipv6/conf/eth0/disable_ipv6", Value: "0"},
				{Key: "net/ipv6/conf/eth0/keep_addr_on_down", Value: "1"}, {Key: "net/ipv6/conf/eth0/accept_dad", Value: "0"}},
			Addrs:  []netip.Prefix{netip.MustParsePrefix("10.9.0.5/24"), netip.MustParsePrefix("fd00::5/64")},
			Routes: []Route{{Dst: netip.MustParsePrefix("::/0"), GW: gw}}})
		if err != nil {
			return err
		}
		hi, err := b.Inspect(ctx, Ref{Name: "lt-veth"})
		if err != nil {
			return err
		}
		pi, err := b.Inspect(ctx, Ref{Netns: pod.Path(), Name: "eth0"})
		if err != nil {
			return err
		}
		if hi.Kind != "veth" || hi.MasterIndex != br.Index || pi.PeerIndex != hi.Index || hi.PeerIndex != pi.Index || pi.MAC.String() != mac(2).String() {
			t.Errorf("host %+v, pod %+v", hi, pi)
		}
		if got := joinSorted(pi.Addrs); !strings.Contains(got, "10.9.0.5/24") || !strings.Contains(got, "fd00::5/64") {
			t.Errorf("pod addresses %s", got)
		}
		found := false
		for _, r := range pi.Routes {
			found = found || r.Dst.Bits() == 0 && r.GW == gw
		}
		if !found {
			t.Errorf("pod routes %v lack the default via %s", pi.Routes, gw)
		}
		if err := b.Delete(ctx, Ref{Netns: pod.Path(), Name: "eth0"}); err != nil {
			return err
		}
		if _, err := b.Inspect(ctx, Ref{Name: "lt-veth"}); !IsNotFound(err) {
			t.Errorf("host veth after deleting the pod end: %v", err)
		}
		plain := filepath.Join(t.TempDir(), "plain")
		if err := os.WriteFile(plain, nil, 0o600); err != nil {
			return err
		}
		for _, r := range []Ref{{Netns: pod.Path(), Name: "eth0"}, {Name: "lt-veth"}, {Netns: plain, Name: "eth0"}, {Netns: plain + ".gone", Name: "eth0"}} {
			if err := b.Delete(ctx, r); err != nil {
				t.Errorf("Delete(%s) of nothing: %v", r, err)
			}
		}
		if _, err := b.Inspect(ctx, Ref{Netns: plain, Name: "eth0"}); !IsNotFound(err) {
			t.Errorf("Inspect in a plain file: %v", err)
		}
		return nil
	})
}

// TestNetlinkPinBridgeMAC: a bridge podwire did not create follows its ports' MACs
// until PinBridgeMAC sets it; a bridge whose MAC is its own (podwire's, or pinned
// already) is left alone, so its neighbour table is not flushed.
func TestNetlinkPinBridgeMAC(t *testing.T) {
	host, pod := freshNS(t), freshNS(t)
	ctx := context.Background()
	b := NewNetlink()
	macOf := func(name string) string {
		l, err := netlink.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		return l.Attrs().HardwareAddr.String()
	}
	port := func(name string, m net.HardwareAddr, br string) {
		attrs := netlink.NewLinkAttrs()
		attrs.Name, attrs.HardwareAddr = name, m
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: name + "p"}); err != nil {
			t.Fatal(err)
		}
		l, _ := netlink.LinkByName(name)
		if err := netlink.LinkSetMasterByIndex(l, mustIndex(t, br)); err != nil {
			t.Fatal(err)
		}
	}
	do(t, host, func() error {
		// A foreign bridge without ports: the first port takes it over.
		attrs := netlink.NewLinkAttrs()
		attrs.Name = "pin-a"
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: attrs}); err != nil {
			return err
		}
		br, err := b.EnsureBridge(ctx, BridgeSpec{Name: "pin-a"})
		if err != nil {
			return err
		}
		if err := b.CreateVeth(ctx, VethSpec{HostName: "pin-a1", HostMAC: mac(9), PodNetns: pod.Path(), PodName: "a1", PodMAC: mac(10), Bridge: "pin-a"}); err != nil {
			return err
		}
		if macOf("pin-a") != mac(9).String() {
			t.Fatalf("the unpinned bridge did not take its first port's MAC: %s", macOf("pin-a"))
		}
		got, err := b.PinBridgeMAC(ctx, "pin-a", br.MAC)
		if err != nil {
			return err
		}
		if got.String() != br.MAC.String() || macOf("pin-a") != br.MAC.String() {
			t.Errorf("pinned to %s, bridge has %s, want %s", got, macOf("pin-a"), br.MAC)
		}
		port("pin-alow", mac(1), "pin-a")
		if macOf("pin-a") != br.MAC.String() {
			t.Errorf("a lower port changed the pinned bridge's MAC to %s", macOf("pin-a"))
		}

		// A foreign bridge whose MAC is its lowest port's; ours is not lower.
		attrs.Name = "pin-b"
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: attrs}); err != nil {
			return err
		}
		port("pin-bp", mac(5), "pin-b")
		before := macOf("pin-b")
		if err := b.CreateVeth(ctx, VethSpec{HostName: "pin-b1", HostMAC: mac(9), PodNetns: pod.Path(), PodName: "b1", PodMAC: mac(11), Bridge: "pin-b"}); err != nil {
			return err
		}
		hw, _ := net.ParseMAC(before)
		if got, err := b.PinBridgeMAC(ctx, "pin-b", hw); err != nil || got.String() != mac(5).String() {
			t.Errorf("PinBridgeMAC = %s, %v; want %s", got, err, mac(5))
		}
		if err := netlink.LinkDel(mustLink(t, "pin-bp")); err != nil {
			return err
		}
		if macOf("pin-b") != mac(5).String() {
			t.Errorf("the bridge followed its ports after pinning: %s", macOf("pin-b"))
		}

		// podwire's own bridge: nothing is set, the neighbour table stays.
		own, err := b.EnsureBridge(ctx, BridgeSpec{Name: "pin-c", MAC: mac(0xc0)})
		if err != nil {
			return err
		}
		if err := b.CreateVeth(ctx, VethSpec{HostName: "pin-c1", HostMAC: mac(3), PodNetns: pod.Path(), PodName: "c1", PodMAC: mac(12), Bridge: "pin-c"}); err != nil {
			return err
		}
		l := mustLink(t, "pin-c")
		if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: prefixNet(netip.MustParsePrefix("10.99.0.1/24"))}); err != nil {
			return err
		}
		// Permanent, so the bridge's carrier changing meanwhile does not flush it; a
		// MAC set does.
		neigh := &netlink.Neigh{LinkIndex: l.Attrs().Index, IP: net.ParseIP("10.99.0.5"), HardwareAddr: mac(0x55), State: netlink.NUD_PERMANENT}
		if err := netlink.NeighAdd(neigh); err != nil {
			return err
		}
		// podwire's new bridge follows its ports, as the reference's: pinning sets the
		// MAC it had before the port joined (and flushes the neighbours, which a MAC set
		// does); a second pin leaves the now pinned MAC, and the neighbours, alone.
		if got, err := b.PinBridgeMAC(ctx, "pin-c", own.MAC); err != nil || got.String() != own.MAC.String() {
			t.Errorf("PinBridgeMAC of podwire's bridge = %s, %v; want %s", got, err, own.MAC)
		}
		if err := netlink.NeighAdd(neigh); err != nil {
			return err
		}
		if got, err := b.PinBridgeMAC(ctx, "pin-c", own.MAC); err != nil || got.String() != own.MAC.String() {
			t.Errorf("second PinBridgeMAC = %s, %v", got, err)
		}
		ns, err := netlink.NeighList(l.Attrs().Index, netlink.FAMILY_V4)
		if err != nil || len(ns) != 1 {
			t.Errorf("the bridge's neighbours after a second PinBridgeMAC: %v, %v (nothing to pin: no flush)", ns, err)
		}
		return nil
	})
}

func mustLink(t *testing.T, name string) netlink.Link {
	t.Helper()
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func mustIndex(t *testing.T, name string) int { return mustLink(t, name).Attrs().Index }
