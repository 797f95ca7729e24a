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
