// SPDX-License-Identifier: Apache-2.0

package main

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/netfilter"
)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func addr(s string) netip.Addr  { return netip.MustParseAddr(s) }

func TestParseConditions(t *testing.T) {
	v4, v6 := netfilter.IPv4, netfilter.IPv6
	for _, tc := range []struct {
		fam  netfilter.Family
		in   []string
		want netfilter.Match
		none bool
	}{
		{v4, nil, netfilter.Match{}, true},
		{v4, []string{""}, netfilter.Match{}, true},
		{v4, []string{"-s", "10.0.0.0/8"}, netfilter.Match{Src: pfx("10.0.0.0/8")}, false},
		{v4, []string{"!", "-d", "192.0.2.1"}, netfilter.Match{Dst: pfx("192.0.2.1/32"), NotDst: true}, false},
		{v4, []string{"--source 10.1.2.3/8 --in-interface eth0"}, netfilter.Match{Src: pfx("10.0.0.0/8"), InIface: "eth0"}, false},
		{v4, []string{"ip saddr 10.0.0.0/8", "ip daddr != 192.0.2.0/24", `iifname "eth1"`}, netfilter.Match{Src: pfx("10.0.0.0/8"), Dst: pfx("192.0.2.0/24"), NotDst: true, InIface: "eth1"}, false},
		{v6, []string{"ip6", "saddr", "==", "fd00::/8"}, netfilter.Match{Src: pfx("fd00::/8")}, false},
		{v6, []string{"-d", "2001:db8::1"}, netfilter.Match{Dst: pfx("2001:db8::1/128")}, false},
	} {
		m, ok, err := parseConditions("conditions", tc.fam, tc.in)
		if err != nil || ok == tc.none || m.Src != tc.want.Src || m.Dst != tc.want.Dst || m.NotSrc != tc.want.NotSrc ||
			m.NotDst != tc.want.NotDst || m.InIface != tc.want.InIface {
			t.Errorf("parseConditions(%s, %q) = %+v, %v, %v; want %+v", tc.fam, tc.in, m, ok, err, tc.want)
		}
	}
}

func TestParseConditionsRejects(t *testing.T) {
	for _, tc := range []struct {
		fam  netfilter.Family
		in   []string
		want string
	}{
		{netfilter.IPv4, []string{"-j", "ACCEPT"}, `option "-j"`},
		{netfilter.IPv4, []string{"-s", "10.0.0.0/8", "-j", "DROP"}, `option "-j"`},
		{netfilter.IPv4, []string{"-s", "10.0.0.0/8\nCOMMIT"}, `"COMMIT"`},
		{netfilter.IPv4, []string{"-s", "10.0.0.0/8;reboot"}, "not an address"},
		{netfilter.IPv4, []string{"-s"}, "without a value"},
		{netfilter.IPv4, []string{"!"}, `ends with "!"`},
		{netfilter.IPv4, []string{"-s", "fd00::/8"}, "not an ipv4 address"},
		{netfilter.IPv6, []string{"ip saddr 10.0.0.0/8"}, `uses "ip"`},
		{netfilter.IPv4, []string{"-s", "10.0.0.0/8", "-s", "10.1.0.0/16"}, "source twice"},
		{netfilter.IPv4, []string{"!", "-i", "eth0"}, "negates the input interface"},
		{netfilter.IPv4, []string{"-i", "eth+"}, "no wildcards"},
		{netfilter.IPv4, []string{"iifname", `"bad name"`}, `has "name\""`},
		{netfilter.IPv4, []string{"ip", "protocol", "tcp"}, "not an address"},
		{netfilter.IPv4, []string{"ip saddr 10.0.0.0/8 accept"}, `has "accept"`},
		{netfilter.IPv4, []string{"-s", "10.0.0.0/8", "ünicode"}, "contains"},
		{netfilter.IPv4, []string{"meta", "mark", "1"}, `has "meta"`},
		{netfilter.IPv4, []string{"-s", "-j"}, "not an address"},
	} {
		_, _, err := parseConditions("conditionsV4", tc.fam, tc.in)
		if cniplumb.Code(err) != 7 || !strings.Contains(errText(err), tc.want) {
			t.Errorf("parseConditions(%q) = %v; want code 7 containing %q", tc.in, err, tc.want)
		}
	}
}
