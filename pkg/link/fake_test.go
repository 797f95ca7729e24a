// SPDX-License-Identifier: Apache-2.0

package link

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestFakeModelsTheKernel: the rules of the kernel the bridge plugin relies on hold in
// the fake, as TestNetlinkAttachment and TestNetlinkPinBridgeMAC show them on the
// kernel.
func TestFakeModelsTheKernel(t *testing.T) {
	ctx := context.Background()
	f := NewFake()
	f.AddNetns("/pod", true)
	// A foreign bridge follows its lowest port until pinned.
	f.AddBridge("br0", mac(0xb0))
	br, err := f.EnsureBridge(ctx, BridgeSpec{Name: "br0", MAC: mac(0xee)})
	if err != nil || br.Created || br.MAC.String() != mac(0xb0).String() {
		t.Fatalf("EnsureBridge of a foreign bridge = %+v, %v", br, err)
	}
	v := VethSpec{HostName: "veth1", HostMAC: mac(1), PodNetns: "/pod", PodName: "eth0", PodMAC: mac(2), Bridge: "br0"}
	if err := f.CreateVeth(ctx, v); err != nil {
		t.Fatal(err)
	}
	if got, _ := f.Inspect(ctx, Ref{Name: "br0"}); got.MAC.String() != mac(1).String() {
		t.Errorf("unpinned bridge MAC %s, want its port's %s", got.MAC, mac(1))
	}
	if got, err := f.PinBridgeMAC(ctx, "br0", br.MAC); err != nil || got.String() != mac(0xb0).String() {
		t.Errorf("PinBridgeMAC = %s, %v", got, err)
	}
	f.AddPort("br0", "low", mac(0))
	if got, _ := f.Inspect(ctx, Ref{Name: "br0"}); got.MAC.String() != mac(0xb0).String() {
		t.Errorf("pinned bridge MAC %s changed", got.MAC)
	}
	for _, again := range []VethSpec{v, {HostName: "veth2", HostMAC: mac(3), PodNetns: "/pod", PodName: "eth0", PodMAC: mac(4), Bridge: "br0"}} {
		if err := f.CreateVeth(ctx, again); !IsExists(err) {
			t.Errorf("CreateVeth(%s) over a taken name = %v", again.HostName, err)
		}
	}
	// IPv6 is refused until disable_ipv6=0.
	v6 := PodSpec{Netns: "/pod", IfName: "eth0", Addrs: []netip.Prefix{netip.MustParsePrefix("fd00::5/64")}}
	if err := f.ConfigurePod(ctx, v6); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("IPv6 address with IPv6 disabled = %v", err)
	}
	v6.Sysctls = []Sysctl{{Key: "net/ipv6/conf/eth0/disable_ipv6", Value: "0"}}
	v6.Routes = []Route{{Dst: netip.MustParsePrefix("::/0"), GW: netip.MustParsePrefix("fd01::1/64").Addr()}}
	if err := f.ConfigurePod(ctx, v6); err == nil || !strings.Contains(err.Error(), "unreachable") {
		t.Errorf("a route via an off-link gateway = %v", err)
	}
	v6.Routes[0].GW = netip.MustParseAddr("fd00::1")
	if err := f.ConfigurePod(ctx, v6); err != nil {
		t.Errorf("ConfigurePod: %v", err)
	}
	// A namespace unmounted but alive keeps the pair; Delete through its path is a
	// no-op, through the host end it removes both.
	f.UnmountNetns("/pod")
	if err := f.Delete(ctx, Ref{Netns: "/pod", Name: "eth0"}); err != nil {
		t.Errorf("Delete in an unmounted namespace: %v", err)
	}
	if _, err := f.Inspect(ctx, Ref{Name: "veth1"}); err != nil {
		t.Errorf("the host end went with the mount: %v", err)
	}
	if err := f.Delete(ctx, Ref{Name: "veth1"}); err != nil {
		t.Fatal(err)
	}
	f.DeleteLink("", "low")
	want := "node bridge br0 mac=02:00:00:00:00:b0 up pinned\nnode sysctl net/ipv6/conf/br0/accept_ra=0\n"
	if d := cmp.Diff(want, f.Dump()); d != "" {
		t.Errorf("state (-want +got):\n%s", d)
	}
	// Removing a namespace removes the veths with an end in it.
	f.AddNetns("/pod2", false)
	if err := f.CreateVeth(ctx, VethSpec{HostName: "veth3", HostMAC: mac(5), PodNetns: "/pod2", PodName: "eth0", PodMAC: mac(6), Bridge: "br0"}); err != nil {
		t.Fatal(err)
	}
	f.RemoveNetns("/pod2")
	if d := cmp.Diff(want, f.Dump()); d != "" {
		t.Errorf("after removing the pod namespace (-want +got):\n%s", d)
	}
}
