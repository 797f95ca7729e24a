// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/google/go-cmp/cmp"

	"github.com/podwire/podwire/pkg/netfilter"
)

func ipc(s string, gw string) *current.IPConfig {
	ip, n, _ := net.ParseCIDR(s)
	c := &current.IPConfig{Address: net.IPNet{IP: ip, Mask: n.Mask}}
	if gw != "" {
		c.Gateway = net.ParseIP(gw)
	}
	return c
}

// render prints an address plan as text for golden comparison.
func render(p *addrPlan) string {
	var b strings.Builder
	for _, ip := range p.IPs {
		fmt.Fprintf(&b, "ip %s gw %v if %d\n", ip.Address.String(), ip.Gateway, *ip.Interface)
	}
	for _, r := range p.Routes {
		fmt.Fprintf(&b, "route %s via %v\n", r.Dst.String(), r.GW)
	}
	for _, r := range p.ResultRoutes {
		fmt.Fprintf(&b, "result route %s gw %v\n", r.Dst.String(), r.GW)
	}
	for _, g := range p.Gateways {
		fmt.Fprintf(&b, "gateway %s\n", g.String())
	}
	if p.Masq != nil {
		b.WriteString(p.Masq.String())
	}
	return b.String()
}

func TestPlanAddresses(t *testing.T) {
	owner := netfilter.Owner{Network: "n", ContainerID: "c", IfName: "eth0"}
	for _, tc := range []struct {
		name, conf string
		ipam       *current.Result
		want       string
	}{
		{name: "layer 3 without gateway", conf: ``,
			ipam: &current.Result{IPs: []*current.IPConfig{ipc("10.0.0.5/24", "")}},
			want: "ip 10.0.0.5/24 gw <nil> if 2\n"},
		{name: "isGateway derives the first address", conf: `"isGateway":true`,
			ipam: &current.Result{IPs: []*current.IPConfig{ipc("10.0.0.5/24", "")}},
			want: "ip 10.0.0.5/24 gw 10.0.0.1 if 2\ngateway 10.0.0.1/24\n"},
		{name: "IPAM gateway kept, default route added", conf: `"isDefaultGateway":true`,
			ipam: &current.Result{IPs: []*current.IPConfig{ipc("10.0.0.5/24", "10.0.0.254"), ipc("fd00::5/64", "")}},
			want: "ip 10.0.0.5/24 gw 10.0.0.254 if 2\nip fd00::5/64 gw fd00::1 if 2\nroute 0.0.0.0/0 via 10.0.0.254\nroute ::/0 via fd00::1\n" +
				"result route 0.0.0.0/0 gw 10.0.0.254\nresult route ::/0 gw fd00::1\ngateway 10.0.0.254/24\ngateway fd00::1/64\n"},
		{name: "IPAM default route wins", conf: `"isDefaultGateway":true`,
			ipam: &current.Result{IPs: []*current.IPConfig{ipc("10.0.0.5/24", "")},
				Routes: []*types.Route{{Dst: net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, GW: net.ParseIP("10.0.0.9")}}},
			want: "ip 10.0.0.5/24 gw 10.0.0.1 if 2\nroute 0.0.0.0/0 via 10.0.0.9\nresult route 0.0.0.0/0 gw 10.0.0.9\ngateway 10.0.0.1/24\n"},
		{name: "gateway-less IPAM routes go via the gateway; no second default", conf: `"isGateway":true,"isDefaultGateway":true`,
			ipam: &current.Result{IPs: []*current.IPConfig{ipc("10.0.0.5/24", "")},
				Routes: []*types.Route{
					{Dst: net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}},
					{Dst: net.IPNet{IP: net.ParseIP("10.9.0.0").To4(), Mask: net.CIDRMask(16, 32)}},
					{Dst: net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}}}},
			want: "ip 10.0.0.5/24 gw 10.0.0.1 if 2\nroute 0.0.0.0/0 via 10.0.0.1\nroute 10.9.0.0/16 via 10.0.0.1\nroute ::/0 via <nil>\n" +
				// The result keeps IPAM's routes as they came, as the reference's does: only
				// the kernel routes get the family's gateway.
				"result route 0.0.0.0/0 gw <nil>\nresult route 10.9.0.0/16 gw <nil>\nresult route ::/0 gw <nil>\ngateway 10.0.0.1/24\n"},
		{name: "ipMasq plans every address with its subnet", conf: `"ipMasq":true`,
			ipam: &current.Result{IPs: []*current.IPConfig{ipc("10.0.0.5/24", ""), ipc("fd00::5/64", "")}},
			want: "ip 10.0.0.5/24 gw <nil> if 2\nip fd00::5/64 gw <nil> if 2\n" +
				"masquerade n/c/eth0 from 10.0.0.5 except to 10.0.0.0/24 and 224.0.0.0/4\n" +
				"masquerade n/c/eth0 from fd00::5 except to fd00::/64 and ff00::/8\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := parseConf(conf1(tc.conf), "")
			if err != nil {
				t.Fatal(err)
			}
			p, err := planAddresses(c, owner, tc.ipam)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, render(p)); d != "" {
				t.Errorf("plan (-want +got):\n%s", d)
			}
		})
	}
	c, _ := parseConf(conf1(`"ipam":{"type":"x"}`), "")
	if _, err := planAddresses(c, owner, &current.Result{}); err == nil || !strings.Contains(err.Error(), "no IP address") {
		t.Errorf("empty IPAM result: %v", err)
	}
}

func TestFirstAddress(t *testing.T) {
	for in, want := range map[string]string{"10.0.0.77/24": "10.0.0.1", "10.0.255.9/16": "10.0.0.1", "fd00::9/64": "fd00::1", "10.1.2.3/31": "10.1.2.3"} {
		ip, n, _ := net.ParseCIDR(in)
		if got := firstAddress(net.IPNet{IP: ip, Mask: n.Mask}).String(); got != want {
			t.Errorf("firstAddress(%s) = %s, want %s", in, got, want)
		}
	}
}

func TestBuildResultDNS(t *testing.T) {
	c, _ := parseConf(conf1(`"dns":{"nameservers":["9.9.9.9"]}`), "")
	r := buildResult(c, nil, &addrPlan{}, types.DNS{Nameservers: []string{"1.1.1.1"}})
	if d := cmp.Diff([]string{"9.9.9.9"}, r.DNS.Nameservers); d != "" {
		t.Errorf("conf DNS should win: %s", d)
	}
	c, _ = parseConf(conf1(``), "")
	r = buildResult(c, nil, &addrPlan{}, types.DNS{Nameservers: []string{"1.1.1.1"}})
	if d := cmp.Diff([]string{"1.1.1.1"}, r.DNS.Nameservers); d != "" {
		t.Errorf("IPAM DNS should be used: %s", d)
	}
}

// fixedChoices are the MACs plan tests use instead of random ones.
var fixedChoices = choices{BridgeMAC: mac(0xb0), HostMAC: mac(0x01), PodMAC: mac(0x02), GatewayMACs: [2]net.HardwareAddr{mac(0x10), mac(0x11)}}

func mac(last byte) net.HardwareAddr { return net.HardwareAddr{0x02, 0x42, 0, 0, 0, last} }

// TestPlanAttachment: the whole plan of one attachment, as text, for the main
// configurations. The host veth is named from the attachment ("veth" + 11 hex of its
// owner hash).
func TestPlanAttachment(t *testing.T) {
	owner := netfilter.Owner{Network: "n", ContainerID: "c", IfName: "eth0"}
	dual := &current.Result{IPs: []*current.IPConfig{ipc("10.0.0.5/24", ""), ipc("fd00::5/64", "")}}
	for _, tc := range []struct {
		name, conf string
		ipam       *current.Result
		want       string
	}{
		{name: "layer 2", conf: `"hairpinMode":true,"portIsolation":true,"mtu":1400`, want: `bridge cni0 mtu=1400 promisc=false vlan_filtering=false accept_ra=0 (if created: mac 02:42:00:00:00:b0; else its MAC pinned)
veth vethc41f63a4843 mac=02:42:00:00:00:01 <-> eth0 in /run/netns/p mac=02:42:00:00:00:02 mtu=1400 on cni0
port vethc41f63a4843 hairpin=true isolated=true vlan=0 trunk=[] preserveDefaultVlan=false
host sysctl net/ipv6/conf/vethc41f63a4843/accept_ra=0 (optional)
pod up eth0
node sysctl net/bridge/bridge-nf-call-iptables=1 (optional)
`},
		{name: "dual stack gateway, masquerade, spoof check", ipam: dual,
			conf: `"isDefaultGateway":true,"ipMasq":true,"macspoofchk":true,"ipam":{"type":"host-local"}`, want: `bridge cni0 mtu=0 promisc=false vlan_filtering=false accept_ra=0 (if created: mac 02:42:00:00:00:b0; else its MAC pinned)
veth vethc41f63a4843 mac=02:42:00:00:00:01 <-> eth0 in /run/netns/p mac=02:42:00:00:00:02 mtu=0 on cni0
port vethc41f63a4843 hairpin=false isolated=false vlan=0 trunk=[] preserveDefaultVlan=false
host sysctl net/ipv6/conf/vethc41f63a4843/accept_ra=0 (optional)
macspoofchk n/c/eth0: bridge nat PREROUTING: iifname "vethc41f63a4843" jump cni-br-iface-c-eth0; cni-br-iface-c-eth0: jump cni-br-iface-c-eth0-mac; cni-br-iface-c-eth0-mac: ether saddr 02:42:00:00:00:02 return, drop
ipam lease for n/c/eth0
pod sysctl net/ipv6/conf/eth0/accept_dad=0 (optional)
pod sysctl net/ipv4/conf/eth0/arp_notify=1 (optional)
pod sysctl net/ipv6/conf/lo/disable_ipv6=0
pod sysctl net/ipv6/conf/eth0/disable_ipv6=0
pod sysctl net/ipv6/conf/eth0/keep_addr_on_down=1
pod addr 10.0.0.5/24 dev eth0
pod addr fd00::5/64 dev eth0
pod up eth0
pod route 0.0.0.0/0 via 10.0.0.1 dev eth0
pod route ::/0 via fd00::1 dev eth0
host gateway 10.0.0.1/24 on cni0 force=false
host gateway fd00::1/64 on cni0 force=false
node sysctl net/ipv4/ip_forward=1 (optional)
node sysctl net/ipv6/conf/all/forwarding=1 (optional)
node sysctl net/bridge/bridge-nf-call-iptables=1 (optional)
node sysctl net/bridge/bridge-nf-call-ip6tables=1 (optional)
masquerade n/c/eth0 from 10.0.0.5 except to 10.0.0.0/24 and 224.0.0.0/4
masquerade n/c/eth0 from fd00::5 except to fd00::/64 and ff00::/8
`},
		{name: "VLAN gateway, DAD, configured MAC", ipam: dual,
			conf: `"bridge":"br9","vlan":7,"isGateway":true,"enabledad":true,"runtimeConfig":{"mac":"02:00:00:00:aa:bb"},"ipam":{"type":"host-local"}`, want: `bridge br9 mtu=0 promisc=false vlan_filtering=true accept_ra=0 (if created: mac 02:42:00:00:00:b0; else its MAC pinned)
veth vethc41f63a4843 mac=02:42:00:00:00:01 <-> eth0 in /run/netns/p mac=02:00:00:00:aa:bb mtu=0 on br9
port vethc41f63a4843 hairpin=false isolated=false vlan=7 trunk=[] preserveDefaultVlan=false
host sysctl net/ipv6/conf/vethc41f63a4843/accept_ra=0 (optional)
ipam lease for n/c/eth0
pod sysctl net/ipv6/conf/eth0/enhanced_dad=1 (optional)
pod sysctl net/ipv6/conf/eth0/accept_dad=1 (optional)
pod sysctl net/ipv4/conf/eth0/arp_notify=1 (optional)
pod sysctl net/ipv6/conf/lo/disable_ipv6=0
pod sysctl net/ipv6/conf/eth0/disable_ipv6=0
pod sysctl net/ipv6/conf/eth0/keep_addr_on_down=1
pod addr 10.0.0.5/24 dev eth0
pod addr fd00::5/64 dev eth0
pod up eth0
pod wait for DAD (at most 10s)
vlan gateway veth vethb54941ebde8 mac=02:42:00:00:00:10 <-> br9.7 in the node mac=02:42:00:00:00:11 mtu=0 on br9
port vethb54941ebde8 hairpin=false isolated=false vlan=7 trunk=[] preserveDefaultVlan=false
host sysctl net/ipv6/conf/vethb54941ebde8/accept_ra=0 (optional)
host gateway 10.0.0.1/24 on br9.7 force=false
host gateway fd00::1/64 on br9.7 force=false
node sysctl net/ipv4/ip_forward=1 (optional)
node sysctl net/ipv6/conf/all/forwarding=1 (optional)
node sysctl net/bridge/bridge-nf-call-iptables=1 (optional)
node sysctl net/bridge/bridge-nf-call-ip6tables=1 (optional)
`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := parseConf(conf1(tc.conf), "")
			if err != nil {
				t.Fatal(err)
			}
			p, err := planAttachment(c, owner, "/run/netns/p", fixedChoices)
			if err != nil {
				t.Fatal(err)
			}
			if tc.ipam != nil {
				ap, err := planAddresses(c, owner, tc.ipam)
				if err != nil {
					t.Fatal(err)
				}
				p.withAddresses(c, ap)
			}
			if d := cmp.Diff(tc.want, p.String()); d != "" {
				t.Errorf("plan (-want +got):\n%s", d)
			}
		})
	}
}
