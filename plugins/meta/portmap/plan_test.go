// SPDX-License-Identifier: Apache-2.0

package main

import (
	"net"
	"strings"
	"testing"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/google/go-cmp/cmp"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/netfilter"
	"github.com/podwire/podwire/pkg/portstate"
)

var owner1 = cniplumb.Owner{Network: "net1", ContainerID: "ctr1", IfName: "eth0"}

func ipnet(s string) net.IPNet {
	ip, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	return net.IPNet{IP: ip, Mask: n.Mask}
}

// dualStack is a bridge result: host interfaces first, then the pod's eth0 with an
// IPv4 and an IPv6 address, plus an address on a host interface that must be ignored.
func dualStack() *current.Result { return dualStackOn("eth0") }

func dualStackOn(ifName string) *current.Result {
	return &current.Result{
		CNIVersion: "1.1.0",
		Interfaces: []*current.Interface{{Name: "cni0"}, {Name: "veth1"}, {Name: ifName, Sandbox: "/var/run/netns/p"}},
		IPs: []*current.IPConfig{
			{Interface: current.Int(0), Address: ipnet("10.88.0.1/16")},
			{Interface: current.Int(2), Address: ipnet("10.88.0.5/16")},
			{Interface: current.Int(2), Address: ipnet("10.88.0.6/16")}, // second v4: ignored
			{Interface: current.Int(2), Address: ipnet("fd88::5/64")},
		},
	}
}

func TestPlanHostPortsGolden(t *testing.T) {
	c, err := parseConf(confWith(`,"runtimeConfig":{"portMappings":[
		{"hostPort":8080,"containerPort":80},
		{"hostPort":5353,"containerPort":53,"protocol":"udp","hostIP":"192.0.2.1"},
		{"hostPort":9443,"containerPort":443,"hostIP":"2001:db8::1"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	p, err := planHostPorts(c, owner1, dualStack(), "eth0")
	if err != nil {
		t.Fatal(err)
	}
	want := `owner net1/ctr1/eth0 snat=true masqAll=false mark=0x2000
tcp *:8080 -> 10.88.0.5:80 (10.88.0.0/16)
tcp *:8080 -> fd88::5:80 (fd88::/64)
udp 192.0.2.1:5353 -> 10.88.0.5:53 (10.88.0.0/16)
tcp 2001:db8::1:9443 -> fd88::5:443 (fd88::/64)
`
	if d := cmp.Diff(want, p.String()); d != "" {
		t.Errorf("plan (-want +got):\n%s", d)
	}
	// The neutral rules: what the nftables backend installs.
	rules, err := p.Rules()
	if err != nil {
		t.Fatal(err)
	}
	wantDump := `nat/prerouting ipv4 saddr == 10.88.0.0/16 daddr type local tcp dport 8080 setmark 0x2000
nat/prerouting ipv4 daddr type local tcp dport 8080 dnat to 10.88.0.5:80
nat/prerouting ipv4 saddr == 10.88.0.0/16 daddr == 192.0.2.1/32 daddr type local udp dport 5353 setmark 0x2000
nat/prerouting ipv4 daddr == 192.0.2.1/32 daddr type local udp dport 5353 dnat to 10.88.0.5:53
nat/output ipv4 saddr == 10.88.0.0/16 daddr type local tcp dport 8080 setmark 0x2000
nat/output ipv4 saddr == 127.0.0.1/32 daddr type local tcp dport 8080 setmark 0x2000
nat/output ipv4 daddr type local tcp dport 8080 dnat to 10.88.0.5:80
nat/output ipv4 saddr == 10.88.0.0/16 daddr == 192.0.2.1/32 daddr type local udp dport 5353 setmark 0x2000
nat/output ipv4 saddr == 127.0.0.1/32 daddr == 192.0.2.1/32 daddr type local udp dport 5353 setmark 0x2000
nat/output ipv4 daddr == 192.0.2.1/32 daddr type local udp dport 5353 dnat to 10.88.0.5:53
nat/postrouting ipv4 daddr == 10.88.0.5/32 mark & 0x2000 == 0x2000 masquerade
nat/prerouting ipv6 saddr == fd88::/64 daddr type local tcp dport 8080 setmark 0x2000
nat/prerouting ipv6 daddr type local tcp dport 8080 dnat to [fd88::5]:80
nat/prerouting ipv6 saddr == fd88::/64 daddr == 2001:db8::1/128 daddr type local tcp dport 9443 setmark 0x2000
nat/prerouting ipv6 daddr == 2001:db8::1/128 daddr type local tcp dport 9443 dnat to [fd88::5]:443
nat/output ipv6 saddr == fd88::/64 daddr type local tcp dport 8080 setmark 0x2000
nat/output ipv6 daddr type local tcp dport 8080 dnat to [fd88::5]:80
nat/output ipv6 saddr == fd88::/64 daddr == 2001:db8::1/128 daddr type local tcp dport 9443 setmark 0x2000
nat/output ipv6 daddr == 2001:db8::1/128 daddr type local tcp dport 9443 dnat to [fd88::5]:443
nat/postrouting ipv6 daddr == fd88::5/128 mark & 0x2000 == 0x2000 masquerade
`
	if d := cmp.Diff(wantDump, rules.String()); d != "" {
		t.Errorf("nftables rules (-want +got):\n%s", d)
	}
	m := portstate.MarkerOf(p, netfilter.KindNFTables)
	if m.Families != netfilter.All || len(m.UDP4) != 1 || m.UDP4[0] != 5353 || len(m.UDP6) != 0 {
		t.Errorf("marker = %+v", m)
	}
}

func TestPlanHostPortsEdges(t *testing.T) {
	c, _ := parseConf(confWith(`,"runtimeConfig":{"portMappings":[{"hostPort":8080,"containerPort":80}]}`))
	// No pod address on the interface: the runtime expects the port to work.
	res := dualStack()
	if _, err := planHostPorts(c, owner1, res, "net1"); cniplumb.Code(err) != 7 || !strings.Contains(err.Error(), "no address of interface net1") {
		t.Errorf("no pod address: %v", err)
	}
	// Addresses without an interface index count (some IPAM-only chains).
	bare := &current.Result{IPs: []*current.IPConfig{{Address: ipnet("10.1.0.9/24")}}}
	p, err := planHostPorts(c, owner1, bare, "eth0")
	if err != nil || len(p.Ports) != 1 || p.Ports[0].Pod != pfx("10.1.0.9/24") {
		t.Errorf("bare address: %+v, %v", p, err)
	}
	// A hostIP of a family the pod lacks: nothing to do, as in the reference.
	c6, _ := parseConf(confWith(`,"runtimeConfig":{"portMappings":[{"hostPort":8080,"containerPort":80,"hostIP":"2001:db8::1"}]}`))
	if p, err := planHostPorts(c6, owner1, bare, "eth0"); err != nil || !p.Empty() {
		t.Errorf("other-family hostIP: %+v, %v", p, err)
	}
	// A hostIP the conditions exclude could never match.
	cx, _ := parseConf(confWith(`,"conditionsV4":["!","-d","192.0.2.0/24"],"runtimeConfig":{"portMappings":[{"hostPort":8080,"containerPort":80,"hostIP":"192.0.2.1"}]}`))
	if _, err := planHostPorts(cx, owner1, bare, "eth0"); cniplumb.Code(err) != 7 || !strings.Contains(err.Error(), "could never match") {
		t.Errorf("excluded hostIP: %v", err)
	}
}
