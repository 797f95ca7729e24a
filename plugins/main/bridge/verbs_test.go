// SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/google/go-cmp/cmp"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/link"
	"github.com/podwire/podwire/pkg/netfilter"
)

// The verbs on fakes of every backend (fakes_test.go): no root, no kernel.

const fullConf = `,"isDefaultGateway":true,"ipMasq":true,"macspoofchk":true,"ipam":{"type":"host-local"}`

// settled is the node once the bridge exists and has served a pod: the bridge with
// its gateways and the node sysctls, nothing of any attachment.
func settled(t *testing.T, w *world, conf string) string {
	t.Helper()
	w.links.AddNetns("/warm", false)
	r := w.mustAdd(conf, "warm", "/warm")
	if err := w.del(conf, "warm", "/warm", r); err != nil {
		t.Fatal(err)
	}
	w.links.RemoveNetns("/warm")
	return w.state()
}

func TestAddCheckDel(t *testing.T) {
	w := newWorld(t, true)
	before := settled(t, w, fullConf)
	if strings.Contains(before, "veth") || strings.Contains(before, "lease ") || strings.Contains(before, "nft ") {
		t.Fatalf("an attachment's state outlived its DEL:\n%s", before)
	}
	w.links.AddNetns("/p1", false)
	r := w.mustAdd(fullConf, "c1", "/p1")
	host, _ := hostVethName(cniplumb.Owner{Network: "net", ContainerID: "c1", IfName: "eth0"})
	if len(r.Interfaces) != 3 || r.Interfaces[0].Name != "br0" || r.Interfaces[1].Name != host || r.Interfaces[2].Sandbox != "/p1" ||
		len(r.IPs) != 2 || r.IPs[0].Address.String() != "10.0.0.2/24" || r.IPs[0].Gateway.String() != "10.0.0.1" {
		t.Errorf("result %+v %+v %+v", r.Interfaces, r.IPs, r.Routes)
	}
	info, err := w.links.Inspect(t.Context(), link.Ref{Name: "br0"})
	if err != nil || info.MAC.String() != r.Interfaces[0].Mac {
		t.Errorf("bridge MAC %s, result says %s (%v)", info.MAC, r.Interfaces[0].Mac, err)
	}
	for _, want := range []string{"/p1 veth eth0 mac=" + r.Interfaces[2].Mac + " up peer=node:" + host + " addrs=10.0.0.2/24,fd00::2/64 route=0.0.0.0/0_via_10.0.0.1 route=::/0_via_fd00::1",
		"/p1 sysctl net/ipv6/conf/eth0/keep_addr_on_down=1", "/p1 sysctl net/ipv6/conf/lo/disable_ipv6=0",
		"node sysctl net/ipv6/conf/" + host + "/accept_ra=0", "node veth " + host + " mac=" + r.Interfaces[1].Mac + " up master=br0 peer=/p1:eth0"} {
		if !strings.Contains(w.links.Dump(), want) {
			t.Errorf("links lack %q:\n%s", want, w.links.Dump())
		}
	}
	if err := w.check(fullConf, "c1", "/p1", r); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	if err := w.del(fullConf, "c1", "/p1", r); err != nil {
		t.Fatal(err)
	}
	if err := w.del(fullConf, "c1", "/p1", r); err != nil {
		t.Errorf("repeated DEL: %v", err)
	}
	w.links.RemoveNetns("/p1")
	if d := cmp.Diff(before, w.state()); d != "" {
		t.Errorf("DEL left (-before +after):\n%s", d)
	}
}

// TestRepeatedAdd (issue 15, bug 1): the second ADD of a live attachment fails before
// IPAM runs, so it cannot release the live pod's lease, and changes nothing.
func TestRepeatedAdd(t *testing.T) {
	w := newWorld(t, false)
	settled(t, w, fullConf)
	w.links.AddNetns("/p1", false)
	r := w.mustAdd(fullConf, "c1", "/p1")
	live := w.state()
	_, err := w.add(fullConf, "c1", "/p1")
	if !link.IsExists(err) || !strings.Contains(err.Error(), "repeated ADD") {
		t.Errorf("repeated ADD = %v, want an exists error saying it is a repeated ADD", err)
	}
	if d := cmp.Diff(live, w.state()); d != "" {
		t.Errorf("the repeated ADD changed the node (-before +after):\n%s", d)
	}
	w.links.AddNetns("/p2", false)
	if r2 := w.mustAdd(fullConf, "c2", "/p2"); r2.IPs[0].Address.IP.Equal(r.IPs[0].Address.IP) {
		t.Errorf("pod 2 got %s, live pod 1's address", r2.IPs[0].Address.IP)
	}
	// The same attachment in a new namespace, while the old one's veth lives on,
	// finds its host veth taken: a left-over the runtime must DEL.
	w.links.AddNetns("/p1b", false)
	if _, err := w.add(fullConf, "c1", "/p1b"); !link.IsExists(err) {
		t.Errorf("ADD of a live attachment into another netns = %v", err)
	}
}

// TestFailedAddUndoesItsOwn: whichever step fails, a failed ADD leaves the node as it
// was, the live pods' leases and rules included.
func TestFailedAddUndoesItsOwn(t *testing.T) {
	boom := errors.New("injected")
	for _, tc := range []struct {
		name string
		fail func(w *world)
	}{
		{"veth", func(w *world) { w.links.FailNext("CreateVeth", boom) }},
		{"bridge MAC", func(w *world) { w.links.FailNext("PinBridgeMAC", boom) }},
		{"IPAM", func(w *world) { w.ipam.fail = boom }},
		{"pod interface", func(w *world) { w.links.FailNext("ConfigurePod", boom) }},
		{"gateway", func(w *world) { w.links.FailNext("ConfigureHost", boom) }},
		{"rules", func(w *world) { w.kernel.FailNext("flush", boom) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, true)
			w.links.AddBridge("br0", mac(0xb0)) // a foreign bridge: PinBridgeMAC runs
			settled(t, w, fullConf)
			w.links.AddNetns("/live", false)
			w.mustAdd(fullConf, "live", "/live")
			w.links.AddNetns("/p", false)
			before := w.state()
			tc.fail(w)
			if _, err := w.add(fullConf, "new", "/p"); !errors.Is(err, boom) {
				t.Fatalf("ADD = %v, want the injected failure", err)
			}
			// The pod's lo keeps IPv6 enabled (as with the reference): it is the pod's
			// namespace, which the runtime removes after a failed ADD.
			after := strings.ReplaceAll(w.state(), "/p sysctl net/ipv6/conf/lo/disable_ipv6=0\n", "")
			if d := cmp.Diff(before, after); d != "" {
				t.Errorf("the failed ADD left (-before +after):\n%s", d)
			}
		})
	}
}

// TestDelBestEffort (bug 4): DEL with a conflist that no longer validates removes the
// veth, rules and lease, and says what it ignored.
func TestDelBestEffort(t *testing.T) {
	for _, broken := range []string{`,"ipMasqBackend":"nftabels"`, `,"mtu":-5`, `,"bridge":"much-too-long-a-name"`,
		`,"hairpinMode":true,"promiscMode":true`, `,"vlan":5000`, `,"mtu":"big"`} {
		t.Run(broken, func(t *testing.T) {
			w := newWorld(t, false)
			before := settled(t, w, fullConf)
			w.links.AddNetns("/p", false)
			r := w.mustAdd(fullConf, "c", "/p")
			if err := w.del(fullConf+broken, "c", "/p", r); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			w.links.RemoveNetns("/p")
			if d := cmp.Diff(before, w.state()); d != "" {
				t.Errorf("DEL left (-before +after):\n%s", d)
			}
			if !strings.Contains(w.stderr.String(), "warning: DEL goes on") {
				t.Errorf("stderr does not report the ignored configuration: %q", w.stderr)
			}
		})
	}
}

// TestDelUnreachableNetns (bug 5): CNI_NETNS is gone, or no longer a namespace while
// the namespace lives on; DEL succeeds and the host side is cleaned, veth included.
func TestDelUnreachableNetns(t *testing.T) {
	for _, how := range []string{"gone", "unmounted"} {
		t.Run(how, func(t *testing.T) {
			w := newWorld(t, false)
			before := settled(t, w, fullConf)
			w.links.AddNetns("/p", false)
			r := w.mustAdd(fullConf, "c", "/p")
			if how == "gone" {
				w.links.RemoveNetns("/p")
			} else {
				w.links.UnmountNetns("/p")
			}
			for i := 0; i < 2; i++ {
				if err := w.del(fullConf, "c", "/p", r); err != nil {
					t.Fatalf("DEL %d: %v", i, err)
				}
			}
			if d := cmp.Diff(before, w.state()); d != "" {
				t.Errorf("DEL left (-before +after):\n%s", d)
			}
		})
	}
}

// TestIPv6DisabledPod (bug 6): a pod namespace with IPv6 off gets it on for the pod's
// IPv6 address, keep_addr_on_down on its interface, accept_ra=0 on the host side.
func TestIPv6DisabledPod(t *testing.T) {
	w := newWorld(t, true)
	w.links.AddNetns("/p", true)
	r := w.mustAdd(fullConf, "c", "/p")
	for _, kv := range [][3]string{{"/p", "net/ipv6/conf/eth0/disable_ipv6", "0"}, {"/p", "net/ipv6/conf/lo/disable_ipv6", "0"},
		{"/p", "net/ipv6/conf/eth0/keep_addr_on_down", "1"}, {"", "net/ipv6/conf/" + r.Interfaces[1].Name + "/accept_ra", "0"},
		{"", "net/ipv6/conf/br0/accept_ra", "0"}} {
		if got := w.links.Sysctl(kv[0], kv[1]); got != kv[2] {
			t.Errorf("%s %s = %q, want %s", kv[0], kv[1], got, kv[2])
		}
	}
	// An IPv4-only pod leaves a namespace's IPv6 setting alone.
	w4 := newWorld(t, false)
	w4.links.AddNetns("/p", true)
	w4.mustAdd(fullConf, "c", "/p")
	if got := w4.links.Sysctl("/p", "net/ipv6/conf/eth0/disable_ipv6"); got != "" {
		t.Errorf("IPv4-only pod: disable_ipv6 set to %q", got)
	}
}

// TestForeignBridgeMAC (bug 7): a bridge podwire did not create gets its MAC pinned,
// so the result's bridge MAC stays right as ports come and go and CHECK passes.
func TestForeignBridgeMAC(t *testing.T) {
	w := newWorld(t, false)
	w.links.AddBridge("br0", mac(0xb0))
	w.links.AddNetns("/p", false)
	r := w.mustAdd(fullConf, "c", "/p")
	if r.Interfaces[0].Mac != mac(0xb0).String() {
		t.Errorf("result bridge MAC %s, want the bridge's own %s", r.Interfaces[0].Mac, mac(0xb0))
	}
	w.links.AddPort("br0", "low", net.HardwareAddr{0x02, 0, 0, 0, 0, 1})
	if err := w.check(fullConf, "c", "/p", r); err != nil {
		t.Errorf("CHECK with a lower port on the bridge: %v", err)
	}
	// Without pinning CHECK notices the bridge's MAC no longer is the result's.
	w2 := newWorld(t, false)
	w2.links.AddBridge("br0", mac(0xb0))
	w2.links.AddNetns("/p", false)
	r = w2.mustAdd(fullConf, "c", "/p")
	r.Interfaces[0].Mac = mac(0xbb).String()
	if err := w2.check(fullConf, "c", "/p", r); err == nil || !strings.Contains(err.Error(), "MAC") {
		t.Errorf("CHECK with another bridge MAC in prevResult = %v", err)
	}
}

// TestCheckOtherImplementation: a pod another implementation made (host veth not
// named as podwire names it) passes CHECK when it is intact, and a failure says where
// the pod came from and what to do.
func TestCheckOtherImplementation(t *testing.T) {
	w := newWorld(t, false)
	w.links.AddNetns("/p", false)
	r := w.mustAdd(fullConf, "c", "/p")
	// Make it look like the reference's: a random host veth name.
	w.links.DeleteLink("", r.Interfaces[1].Name)
	if _, err := w.p.links.EnsureBridge(t.Context(), link.BridgeSpec{Name: "br0"}); err != nil {
		t.Fatal(err)
	}
	v := link.VethSpec{HostName: "vethdeadbeef", HostMAC: mac(0x31), PodNetns: "/p", PodName: "eth0", PodMAC: mac(0x32), Bridge: "br0"}
	if err := w.links.CreateVeth(t.Context(), v); err != nil {
		t.Fatal(err)
	}
	if err := w.links.ConfigurePod(t.Context(), link.PodSpec{Netns: "/p", IfName: "eth0", Up: true, Addrs: w.prefixes(r)}); err != nil {
		t.Fatal(err)
	}
	owner := netfilter.Owner{Network: "net", ContainerID: "c", IfName: "eth0"}
	if err := w.p.spoof.Apply(t.Context(), netfilter.MacSpoofPlan{Owner: owner, HostIf: "vethdeadbeef", MAC: mac(0x32)}); err != nil {
		t.Fatal(err)
	}
	r.Interfaces[1].Name, r.Interfaces[1].Mac, r.Interfaces[2].Mac = "vethdeadbeef", mac(0x31).String(), mac(0x32).String()
	r.Routes = nil
	if err := w.check(fullConf, "c", "/p", r); err != nil {
		t.Errorf("CHECK of an intact pod another implementation made: %v", err)
	}
	if err := w.p.spoof.Remove(t.Context(), owner); err != nil {
		t.Fatal(err)
	}
	if err := w.check(fullConf, "c", "/p", r); err == nil || !strings.Contains(err.Error(), "another implementation") {
		t.Errorf("CHECK of a broken pod another implementation made = %v", err)
	}
	// podwire's DEL removes it: the pod end in the netns, the rest by name.
	if err := w.del(fullConf, "c", "/p", r); err != nil {
		t.Fatal(err)
	}
	if d := w.links.Dump(); strings.Contains(d, "vethdeadbeef") {
		t.Errorf("DEL left the other implementation's veth:\n%s", d)
	}
}

func (w *world) prefixes(r *current.Result) []netip.Prefix {
	var out []netip.Prefix
	for _, ip := range r.IPs {
		out = append(out, prefixOf(ip.Address))
	}
	return out
}
