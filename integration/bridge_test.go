// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/podwire/podwire/integration/nstest"
	"github.com/podwire/podwire/internal/testenv"
)

// bridgeConf is a bridge+host-local conflist; extra is spliced into the bridge object,
// ranges into host-local's.
func bridgeConf(h *nstest.H, extra, ranges string) *libcni.NetworkConfigList {
	if ranges == "" {
		ranges = `[[{"subnet":"10.22.0.0/24"}]]`
	}
	if extra != "" {
		extra = "," + extra
	}
	return h.Conflist(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"@PREFIX@net","plugins":[
	 {"type":"bridge","bridge":"@PREFIX@br"%s,
	  "ipam":{"type":"host-local","ranges":%s,"dataDir":"@DATADIR@"}}]}`, extra, ranges))
}

func addrOf(t *testing.T, r *current.Result, v6 bool) string {
	t.Helper()
	for _, ip := range r.IPs {
		if (ip.Address.IP.To4() == nil) == v6 {
			return ip.Address.IP.String()
		}
	}
	t.Fatalf("no IPv6=%v address in result %v", v6, r)
	return ""
}

// warmUp runs one ADD and DEL so the bridge and node sysctls exist; snapshots taken
// afterwards must come back exactly after the test's own ADDs and DELs.
func warmUp(t *testing.T, h *nstest.H, list *libcni.NetworkConfigList) {
	t.Helper()
	p := h.NewPod()
	rt := h.RT(p, "eth0")
	h.MustAdd(list, rt)
	waitLinkLocal(t, h, h.Name("br"))
	h.MustDel(list, rt)
	settleBridge(t, h, h.Name("br"))
}

// waitLinkLocal waits until the bridge has its IPv6 link-local address. The kernel adds
// it when the bridge first gets a carrier, through linkwatch (up to a second later);
// a warm-up DEL before that would leave it to appear during the test itself.
func waitLinkLocal(t *testing.T, h *nstest.H, br string) {
	t.Helper()
	if strings.TrimSpace(h.Run(h.HostNS, "sh", "-c", "cat /proc/sys/net/ipv6/conf/"+br+"/disable_ipv6 2>/dev/null || echo 1")) != "0" {
		return
	}
	for i := 0; i < 60; i++ {
		if strings.Contains(h.Run(h.HostNS, "ip", "-o", "-6", "addr", "show", "dev", br, "scope", "link"), "fe80::") {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("bridge %s got no IPv6 link-local address within 3 s of its first port", br)
}

// settleBridge waits until a bridge without ports shows it (no carrier) and its
// link-local address has finished DAD, so snapshots do not race the kernel.
func settleBridge(t *testing.T, h *nstest.H, br string) {
	t.Helper()
	for i := 0; i < 100; i++ {
		l := h.Run(h.HostNS, "ip", "-o", "link", "show", br)
		a := h.Run(h.HostNS, "ip", "-o", "addr", "show", "dev", br)
		if strings.Contains(l, "NO-CARRIER") && !strings.Contains(a, "tentative") {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("bridge %s did not settle", br)
}

// requireVlanFiltering skips when the kernel was built without bridge VLAN filtering
// (CONFIG_BRIDGE_VLAN_FILTERING), which VLAN options need; any other failure to make a
// VLAN-filtering bridge fails under CI=true (testenv.KernelLacks).
func requireVlanFiltering(t *testing.T, h *nstest.H) {
	t.Helper()
	name := h.Name("vf")
	if out, err := nstest.RunIn(h.HostNS, "ip", "link", "add", name, "type", "bridge", "vlan_filtering", "1"); err != nil {
		testenv.KernelLacks(t, fmt.Sprintf("cannot create a bridge with vlan_filtering 1 (%s); vlan/vlanTrunk cannot work here", strings.TrimSpace(out)), "CONFIG_BRIDGE_VLAN_FILTERING")
	}
	h.Run(h.HostNS, "ip", "link", "del", name)
}

func TestBridgeTwoPods(t *testing.T) {
	h := nstest.New(t)
	list := bridgeConf(h, `"isGateway":true,"isDefaultGateway":true,"ipMasq":true,"mtu":1400`, "")
	h.Run(h.HostNS, "sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=0")
	warmUp(t, h, list)
	if got := strings.TrimSpace(h.Run(h.HostNS, "cat", "/proc/sys/net/bridge/bridge-nf-call-iptables")); got != "1" {
		t.Errorf("bridge-nf-call-iptables = %s after ADD, want 1", got)
	}
	before := h.Snapshot()

	p1, p2 := h.NewPod(), h.NewPod()
	rt1, rt2 := h.RT(p1, "eth0"), h.RT(p2, "eth0")
	r1 := h.MustAdd(list, rt1)
	r2 := h.MustAdd(list, rt2)

	// The result: bridge, host veth, pod interface with its sandbox; addresses point at
	// the pod interface; the default route goes via the gateway.
	if len(r1.Interfaces) != 3 || r1.Interfaces[0].Name != h.Name("br") || r1.Interfaces[2].Name != "eth0" ||
		r1.Interfaces[2].Sandbox != p1.Path() || r1.Interfaces[1].Sandbox != "" || !strings.HasPrefix(r1.Interfaces[1].Name, "veth") {
		t.Errorf("result interfaces = %+v %+v %+v", r1.Interfaces[0], r1.Interfaces[1], r1.Interfaces[2])
	}
	if len(r1.IPs) != 1 || *r1.IPs[0].Interface != 2 || r1.IPs[0].Gateway.String() != "10.22.0.1" {
		t.Errorf("result IPs = %+v", r1.IPs[0])
	}
	if len(r1.Routes) != 1 || r1.Routes[0].Dst.String() != "0.0.0.0/0" || r1.Routes[0].GW.String() != "10.22.0.1" {
		t.Errorf("result routes = %v", r1.Routes)
	}
	for _, i := range r1.Interfaces {
		if _, err := net.ParseMAC(i.Mac); err != nil {
			t.Errorf("interface %s has MAC %q", i.Name, i.Mac)
		}
	}
	a1, a2 := addrOf(t, r1, false), addrOf(t, r2, false)
	if a1 == a2 {
		t.Fatalf("both pods got %s", a1)
	}
	h.MustPing(p1, a2)
	h.MustPing(p2, a1)
	h.MustPing(p1, "10.22.0.1")
	if out := h.Run(p1, "ip", "-o", "link", "show", "eth0"); !strings.Contains(out, "mtu 1400") ||
		!strings.Contains(out, r1.Interfaces[2].Mac) {
		t.Errorf("pod link does not show the MTU and the result's MAC %s:\n%s", r1.Interfaces[2].Mac, out)
	}
	if out := h.Run(h.HostNS, "ip", "-o", "link", "show", r1.Interfaces[1].Name); !strings.Contains(out, "master "+h.Name("br")) {
		t.Errorf("host veth is not on the bridge:\n%s", out)
	}
	if err := h.Check(list, rt1); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	// CHECK notices a removed address.
	h.Run(p2, "ip", "addr", "del", a2+"/24", "dev", "eth0")
	if err := h.Check(list, rt2); err == nil || !strings.Contains(err.Error(), a2) {
		t.Errorf("CHECK after removing %s = %v, want an error naming it", a2, err)
	}
	if err := h.Status(list); err != nil {
		t.Errorf("STATUS: %v", err)
	}

	h.MustDel(list, rt1)
	h.MustDel(list, rt2)
	h.MustDel(list, rt1) // DEL is idempotent
	settleBridge(t, h, h.Name("br"))
	h.RequireUnchanged(before)
}

// remote makes a namespace reachable from the host only: it answers 172.31.250.0/24 and
// has no route to the pod subnet, so pods reach it only through masquerade.
func remote(t *testing.T, h *nstest.H) ns.NetNS {
	r := h.NewPod()
	hostEnd := h.Name("rem")
	h.Run(h.HostNS, "ip", "link", "add", hostEnd, "type", "veth", "peer", "name", "eth0", "netns", r.Path())
	h.Run(h.HostNS, "ip", "addr", "add", "172.31.250.1/24", "dev", hostEnd)
	// No DAD on the test's own link, so its link-local address does not change state
	// between the test's snapshots.
	h.Run(h.HostNS, "sysctl", "-qw", "net.ipv6.conf."+hostEnd+".accept_dad=0")
	h.Run(h.HostNS, "ip", "link", "set", hostEnd, "up")
	h.Run(r, "ip", "addr", "add", "172.31.250.2/24", "dev", "eth0")
	h.Run(r, "ip", "link", "set", "eth0", "up")
	h.Run(r, "ip", "link", "set", "lo", "up")
	return r
}

// peerSeenBy accepts one TCP connection inside netns n and returns its source address.
func peerSeenBy(t *testing.T, n ns.NetNS, connect func()) string {
	t.Helper()
	var ln net.Listener
	if err := n.Do(func(ns.NetNS) error {
		var err error
		ln, err = net.Listen("tcp", "172.31.250.2:7777")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	seen := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			seen <- "accept: " + err.Error()
			return
		}
		seen <- c.RemoteAddr().(*net.TCPAddr).IP.String()
		c.Close()
	}()
	connect()
	return <-seen
}

func TestBridgeMasquerade(t *testing.T) {
	for _, backend := range []string{"iptables", "nftables"} {
		t.Run(backend, func(t *testing.T) {
			h := nstest.New(t)
			r := remote(t, h)
			list := bridgeConf(h, fmt.Sprintf(`"isGateway":true,"isDefaultGateway":true,"ipMasq":true,"ipMasqBackend":%q`, backend), "")
			warmUp(t, h, list)
			before := h.Snapshot()
			p := h.NewPod()
			rt := h.RT(p, "eth0")
			res := h.MustAdd(list, rt)
			h.MustPing(p, "172.31.250.2")
			src := peerSeenBy(t, r, func() {
				h.Run(p, "bash", "-c", "exec 3<>/dev/tcp/172.31.250.2/7777")
			})
			if src != "172.31.250.1" {
				t.Errorf("remote saw the pod as %s, want the host's 172.31.250.1", src)
			}
			// The rules live in the configured backend only, in the reference's layout
			// (per-container chain CNI-…, or table inet cni_plugins_masquerade), tagged
			// with the container.
			ipt := h.Run(h.HostNS, "sh", "-c", "iptables-save -t nat 2>/dev/null; true")
			nft := h.Run(h.HostNS, "sh", "-c", "nft list table inet cni_plugins_masquerade 2>/dev/null; true")
			mine, other := ipt, nft
			if backend == "nftables" {
				mine, other = nft, ipt
			}
			a := addrOf(t, res, false)
			if !strings.Contains(mine, a) || !strings.Contains(mine, rt.ContainerID) || strings.Contains(other, a) {
				t.Errorf("rules for %s: %s backend shows\n%s\nother shows\n%s", a, backend, mine, other)
			}
			if err := h.Check(list, rt); err != nil {
				t.Errorf("CHECK: %v", err)
			}
			// Without the masquerade the remote cannot answer: the rules are what works.
			h.MustDel(list, rt)
			settleBridge(t, h, h.Name("br"))
			h.RequireUnchanged(before)
		})
	}
}

func TestBridgeDualStack(t *testing.T) {
	h := nstest.New(t)
	list := bridgeConf(h, `"isGateway":true,"ipMasq":true`, `[[{"subnet":"10.23.0.0/24"}],[{"subnet":"fd00:23::/64"}]]`)
	warmUp(t, h, list)
	before := h.Snapshot()
	p1, p2 := h.NewPod(), h.NewPod()
	rt1, rt2 := h.RT(p1, "eth0"), h.RT(p2, "eth0")
	r1, r2 := h.MustAdd(list, rt1), h.MustAdd(list, rt2)
	if len(r1.IPs) != 2 {
		t.Fatalf("want one IPv4 and one IPv6 address, got %v", r1.IPs)
	}
	h.MustPing(p1, addrOf(t, r2, false))
	h.MustPing(p1, addrOf(t, r2, true))
	h.MustPing(p2, addrOf(t, r1, true))
	// enabledad is off by default: the addresses are usable at once, never tentative.
	if out := h.Run(p1, "ip", "-6", "addr", "show", "dev", "eth0"); strings.Contains(out, "tentative") {
		t.Errorf("pod IPv6 address still tentative after ADD:\n%s", out)
	}
	if got := strings.TrimSpace(h.Run(h.HostNS, "cat", "/proc/sys/net/bridge/bridge-nf-call-ip6tables")); got != "1" {
		t.Errorf("bridge-nf-call-ip6tables = %s, want 1", got)
	}
	if got := strings.TrimSpace(h.Run(h.HostNS, "cat", "/proc/sys/net/ipv6/conf/all/forwarding")); got != "1" {
		t.Errorf("IPv6 forwarding = %s, want 1", got)
	}
	if err := h.Check(list, rt1); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	h.MustDel(list, rt1)
	h.MustDel(list, rt2)
	settleBridge(t, h, h.Name("br"))
	h.RequireUnchanged(before)
}

func TestBridgeEnableDad(t *testing.T) {
	h := nstest.New(t)
	list := bridgeConf(h, `"isGateway":true,"enabledad":true`, `[[{"subnet":"fd00:24::/64"}]]`)
	p := h.NewPod()
	rt := h.RT(p, "eth0")
	h.MustAdd(list, rt)
	// ADD waited for DAD to finish: the address is no longer tentative.
	out := h.Run(p, "ip", "-6", "addr", "show", "dev", "eth0", "scope", "global")
	if !strings.Contains(out, "fd00:24::") || strings.Contains(out, "tentative") {
		t.Errorf("with enabledad the address should have passed DAD before ADD returned:\n%s", out)
	}
	if got := strings.TrimSpace(h.Run(p, "cat", "/proc/sys/net/ipv6/conf/eth0/accept_dad")); got != "1" {
		t.Errorf("accept_dad = %s with enabledad, want 1", got)
	}
	h.MustDel(list, rt)
}

func TestBridgeHairpinIsolation(t *testing.T) {
	h := nstest.New(t)
	list := bridgeConf(h, `"isGateway":true,"hairpinMode":true,"portIsolation":true`, "")
	p := h.NewPod()
	rt := h.RT(p, "eth0")
	res := h.MustAdd(list, rt)
	d := h.Run(h.HostNS, "ip", "-d", "link", "show", res.Interfaces[1].Name)
	if !strings.Contains(d, "hairpin on") || !strings.Contains(d, "isolated on") {
		t.Errorf("host veth lacks hairpin/isolation:\n%s", d)
	}
	h.MustPing(p, "10.22.0.1")
	h.MustDel(list, rt)

	plain := bridgeConf(h, `"isGateway":true`, "")
	rt2 := h.RT(h.NewPod(), "eth0")
	r2 := h.MustAdd(plain, rt2)
	if d := h.Run(h.HostNS, "ip", "-d", "link", "show", r2.Interfaces[1].Name); !strings.Contains(d, "hairpin off") || !strings.Contains(d, "isolated off") {
		t.Errorf("defaults should leave hairpin and isolation off:\n%s", d)
	}
	h.MustDel(plain, rt2)
}

func TestBridgeVlan(t *testing.T) {
	h := nstest.New(t)
	requireVlanFiltering(t, h)
	list := bridgeConf(h, `"isGateway":true,"vlan":100`, "")
	p := h.NewPod()
	rt := h.RT(p, "eth0")
	res := h.MustAdd(list, rt)
	hostVeth := res.Interfaces[1].Name
	v := h.Run(h.HostNS, "bridge", "vlan", "show", "dev", hostVeth)
	if !strings.Contains(v, "100 PVID Egress Untagged") || strings.Contains(v, " 1 PVID") {
		t.Errorf("host veth VLANs:\n%s", v)
	}
	gw := h.Name("br") + ".100"
	if len(res.Interfaces) != 4 || res.Interfaces[3].Name != gw {
		t.Errorf("result lacks the VLAN gateway interface %s: %+v", gw, res.Interfaces)
	}
	if out := h.Run(h.HostNS, "ip", "-o", "addr", "show", "dev", gw); !strings.Contains(out, "10.22.0.1/24") {
		t.Errorf("VLAN gateway interface has no gateway address:\n%s", out)
	}
	h.MustPing(p, "10.22.0.1")
	h.MustDel(list, rt)

	trunk := h.Conflist(`{"cniVersion":"1.1.0","name":"@PREFIX@net2","plugins":[{"type":"bridge","bridge":"@PREFIX@tr","vlanTrunk":[{"minID":200,"maxID":202},{"id":300}],"preserveDefaultVlan":true,
	  "ipam":{"type":"host-local","ranges":[[{"subnet":"10.25.0.0/24"}]],"dataDir":"@DATADIR@"}}]}`)
	p2 := h.NewPod()
	rt2 := h.RT(p2, "eth1")
	r2 := h.MustAdd(trunk, rt2)
	v = h.Run(h.HostNS, "bridge", "vlan", "show", "dev", r2.Interfaces[1].Name)
	for _, want := range []string{"200", "201", "202", "300", "1 PVID Egress Untagged"} {
		if !strings.Contains(v, want) {
			t.Errorf("trunk port lacks VLAN %q:\n%s", want, v)
		}
	}
	h.MustDel(trunk, rt2)
}

func TestBridgeAddFailsAfterIPAM(t *testing.T) {
	h := nstest.New(t)
	list := bridgeConf(h, `"isGateway":true,"ipMasq":true`, "")
	warmUp(t, h, list)
	before := h.Snapshot()

	// A multicast MAC parses but the kernel refuses it: the failure comes after IPAM.
	p := h.NewPod()
	_, err := h.Add(list, h.RT(p, "eth0", nstest.WithArgs([2]string{"IgnoreUnknown", "1"}, [2]string{"MAC", "01:00:5e:00:00:01"})))
	if err == nil || !strings.Contains(err.Error(), "01:00:5e:00:00:01") {
		t.Fatalf("ADD with a multicast MAC = %v, want an error naming it", err)
	}
	settleBridge(t, h, h.Name("br"))
	h.RequireUnchanged(before)

	// The pod already has the interface name: veth creation fails (before IPAM runs).
	p2 := h.NewPod()
	h.Run(p2, "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "other0")
	if _, err := h.Add(list, h.RT(p2, "eth0")); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("ADD over an existing eth0 = %v", err)
	}
	settleBridge(t, h, h.Name("br"))
	h.RequireUnchanged(before)

	// A MAC that does not parse is refused before anything happens (code 7).
	p3 := h.NewPod()
	_, err = h.Add(list, h.RT(p3, "eth0", nstest.WithArgs([2]string{"IgnoreUnknown", "1"}, [2]string{"MAC", "nonsense"})))
	if err == nil || !strings.Contains(err.Error(), "nonsense") {
		t.Fatalf("ADD with a malformed MAC = %v", err)
	}
	settleBridge(t, h, h.Name("br"))
	h.RequireUnchanged(before)
}

func TestBridgeMACSources(t *testing.T) {
	h := nstest.New(t)
	base := `{"cniVersion":"1.1.0","name":"@PREFIX@net","plugins":[{"type":"bridge","bridge":"@PREFIX@br",%s
	  "capabilities":{"mac":true},"ipam":{"type":"host-local","ranges":[[{"subnet":"10.26.0.0/24"}]],"dataDir":"@DATADIR@"}}]}`
	for _, tc := range []struct {
		name, conf string
		opts       []func(*libcni.RuntimeConf)
		want       string
	}{
		{"CNI_ARGS", "", []func(*libcni.RuntimeConf){nstest.WithArgs([2]string{"IgnoreUnknown", "1"}, [2]string{"MAC", "02:00:00:00:00:01"})}, "02:00:00:00:00:01"},
		{"args.cni.mac", `"args":{"cni":{"mac":"02:00:00:00:00:02"}},`, []func(*libcni.RuntimeConf){nstest.WithArgs([2]string{"IgnoreUnknown", "1"}, [2]string{"MAC", "02:00:00:00:00:01"})}, "02:00:00:00:00:02"},
		{"capability", `"args":{"cni":{"mac":"02:00:00:00:00:02"}},`, []func(*libcni.RuntimeConf){nstest.WithCaps(map[string]any{"mac": "02:00:00:00:00:03"})}, "02:00:00:00:00:03"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			list := h.Conflist(fmt.Sprintf(base, tc.conf))
			p := h.NewPod()
			rt := h.RT(p, "eth0", tc.opts...)
			res := h.MustAdd(list, rt)
			if res.Interfaces[2].Mac != tc.want {
				t.Errorf("result MAC %s, want %s", res.Interfaces[2].Mac, tc.want)
			}
			if out := h.Run(p, "ip", "link", "show", "eth0"); !strings.Contains(out, tc.want) {
				t.Errorf("pod link:\n%s", out)
			}
			h.MustDel(list, rt)
		})
	}
}

func TestBridgeMacSpoofChk(t *testing.T) {
	h := nstest.New(t)
	list := bridgeConf(h, `"isGateway":true,"macspoofchk":true`, "")
	warmUp(t, h, list)
	before := h.Snapshot()
	p1, p2 := h.NewPod(), h.NewPod()
	rt1, rt2 := h.RT(p1, "eth0"), h.RT(p2, "eth0")
	r1, r2 := h.MustAdd(list, rt1), h.MustAdd(list, rt2)
	a2 := addrOf(t, r2, false)
	h.MustPing(p1, a2)
	if err := h.Check(list, rt1); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	// Spoof p1's MAC: its frames are dropped at the bridge port.
	h.Run(p1, "ip", "neigh", "flush", "dev", "eth0")
	h.Run(p1, "ip", "link", "set", "eth0", "address", "02:de:ad:be:ef:01")
	if err := nstest.Ping(p1, a2); err == nil {
		t.Errorf("a pod with a spoofed MAC still reaches %s", a2)
	}
	_ = r1
	h.MustDel(list, rt1)
	h.MustDel(list, rt2)
	settleBridge(t, h, h.Name("br"))
	h.RequireUnchanged(before)
}

func TestBridgeDelWithoutNetns(t *testing.T) {
	for _, backend := range []string{"iptables", "nftables"} {
		t.Run(backend, func(t *testing.T) {
			h := nstest.New(t)
			list := bridgeConf(h, fmt.Sprintf(`"isGateway":true,"ipMasq":true,"ipMasqBackend":%q`, backend), "")
			warmUp(t, h, list)
			before := h.Snapshot()
			p := h.NewPod()
			rt := h.RT(p, "eth0")
			h.MustAdd(list, rt)
			// The runtime lost the sandbox: the netns is gone; DEL still removes the
			// masquerade rules and the lease (the veth went with the namespace).
			h.DeletePod(p)
			h.MustDel(list, rt)
			h.MustDel(list, rt)
			settleBridge(t, h, h.Name("br"))
			h.RequireUnchanged(before)
		})
	}
}

func TestBridgeGC(t *testing.T) {
	h := nstest.New(t)
	list := bridgeConf(h, `"isGateway":true,"ipMasq":true`, "")
	warmUp(t, h, list)
	p1, p2 := h.NewPod(), h.NewPod()
	rt1, rt2 := h.RT(p1, "eth0"), h.RT(p2, "eth0")
	r1, r2 := h.MustAdd(list, rt1), h.MustAdd(list, rt2)
	if err := h.GC(list, []types.GCAttachment{{ContainerID: rt2.ContainerID, IfName: "eth0"}}); err != nil {
		t.Fatalf("GC: %v", err)
	}
	// Whichever backend auto picked: the reference's layout in iptables or nftables.
	rules := h.Run(h.HostNS, "sh", "-c", "nft list table inet cni_plugins_masquerade 2>/dev/null; iptables-save -t nat; true")
	if masqShows(rules, addrOf(t, r1, false)) || !masqShows(rules, addrOf(t, r2, false)) {
		t.Errorf("GC keeping only pod 2 left:\n%s", rules)
	}
	if err := h.Check(list, rt2); err != nil {
		t.Errorf("CHECK of the kept pod after GC: %v", err)
	}
	h.MustDel(list, rt1)
	h.MustDel(list, rt2)
}

// masqShows reports whether a ruleset listing (nft list, iptables-save) masquerades
// from addr: "ip saddr <addr> ..." or "-s <addr>/32".
func masqShows(rules, addr string) bool {
	return strings.Contains(rules, "saddr "+addr+" ") || strings.Contains(rules, "-s "+addr+"/")
}

func TestBridgeConcurrent(t *testing.T) {
	h := nstest.New(t)
	list := bridgeConf(h, `"isGateway":true,"isDefaultGateway":true,"ipMasq":true`, `[[{"subnet":"10.27.0.0/24"}]]`)
	// ADD sets these node-wide; set them first so the snapshot can stay exact.
	h.Run(h.HostNS, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.bridge.bridge-nf-call-iptables=1")
	before := h.Snapshot()
	const n = 50
	pods := make([]ns.NetNS, n)
	for i := range pods {
		pods[i] = h.NewPod()
	}
	addrs := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			r, err := h.Add(list, h.RT(pods[i], "eth0"))
			errs[i] = err
			if err == nil && len(r.IPs) == 1 {
				addrs[i] = r.IPs[0].Address.IP.String()
			}
		}(i)
	}
	wg.Wait()
	seen := map[string]int{}
	for i, err := range errs {
		if err != nil {
			t.Errorf("ADD %d: %v", i, err)
			continue
		}
		if j, dup := seen[addrs[i]]; dup {
			t.Errorf("pods %d and %d both got %s", j, i, addrs[i])
		}
		seen[addrs[i]] = i
	}
	if len(seen) == n {
		h.MustPing(pods[0], addrs[n-1])
	}
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			errs[i] = h.Del(list, h.RT(pods[i], "eth0"))
		}(i)
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("DEL %d: %v", i, err)
		}
	}
	// Everything but the bridge itself is gone.
	h.Run(h.HostNS, "ip", "link", "del", h.Name("br"))
	h.RequireUnchanged(before)
}
