// SPDX-License-Identifier: Apache-2.0

package ipam

import (
	"fmt"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/google/go-cmp/cmp"

	"github.com/podwire/podwire/pkg/cniplumb"
)

// conf wraps an ipam object (and optional top-level extras) into a network config.
func conf(ipam string, extra ...string) []byte {
	s := `{"cniVersion":"1.1.0","name":"net1","type":"host-local","ipam":` + ipam
	for _, e := range extra {
		s += "," + e
	}
	return []byte(s + "}")
}

// dump renders a parsed configuration as text for golden comparison.
func dump(c *Conf) string {
	var b strings.Builder
	fmt.Fprintf(&b, "network=%s dataDir=%s resolvConf=%q\n", c.Network, c.DataDir, c.ResolvConf)
	for i, s := range c.RangeSets {
		for _, r := range s {
			fmt.Fprintf(&b, "set %d: subnet=%s start=%s end=%s gw=%s\n", i, r.Subnet.String(), r.RangeStart, r.RangeEnd, r.Gateway)
		}
		if q, ok := c.Requested[i]; ok {
			fmt.Fprintf(&b, "set %d: requested %s from %s\n", i, q.IP, q.Source)
		}
	}
	for _, r := range c.Routes {
		fmt.Fprintf(&b, "route %s\n", r.String())
	}
	return b.String()
}

func TestParseConf(t *testing.T) {
	for _, tc := range []struct {
		name, args string
		stdin      []byte
		want       string
	}{
		{
			name:  "defaults of a v4 /24",
			stdin: conf(`{"type":"host-local","ranges":[[{"subnet":"10.1.2.0/24"}]]}`),
			want: `network=net1 dataDir=/var/lib/cni/networks resolvConf=""
set 0: subnet=10.1.2.0/24 start=10.1.2.1 end=10.1.2.254 gw=10.1.2.1
`,
		},
		{
			name:  "defaults of a v6 /120 and an explicit v4 range",
			stdin: conf(`{"ranges":[[{"subnet":"10.1.2.0/24","rangeStart":"10.1.2.10","rangeEnd":"10.1.2.20","gateway":"10.1.2.254"}],[{"subnet":"fd00::/120"}]],"dataDir":"/run/x/../leases","resolvConf":"/etc/r.conf"}`),
			want: `network=net1 dataDir=/run/leases resolvConf="/etc/r.conf"
set 0: subnet=10.1.2.0/24 start=10.1.2.10 end=10.1.2.20 gw=10.1.2.254
set 1: subnet=fd00::/120 start=fd00::1 end=fd00::ff gw=fd00::1
`,
		},
		{
			name:  "legacy single range comes first, then ranges",
			stdin: conf(`{"subnet":"10.9.0.0/16","gateway":"10.9.0.254","routes":[{"dst":"0.0.0.0/0"},{"dst":"192.168.0.0/16","gw":"10.9.0.1"}],"ranges":[[{"subnet":"fd01::/64"}]]}`),
			want: `network=net1 dataDir=/var/lib/cni/networks resolvConf=""
set 0: subnet=10.9.0.0/16 start=10.9.0.1 end=10.9.255.254 gw=10.9.0.254
set 1: subnet=fd01::/64 start=fd01::1 end=fd01::ffff:ffff:ffff:ffff gw=fd01::1
route {Dst:{IP:0.0.0.0 Mask:00000000} GW:<nil> MTU:0 AdvMSS:0 Priority:0 Table:<nil> Scope:<nil>}
route {Dst:{IP:192.168.0.0 Mask:ffff0000} GW:10.9.0.1 MTU:0 AdvMSS:0 Priority:0 Table:<nil> Scope:<nil>}
`,
		},
		{
			name:  "ipRanges capability comes before ranges, as in the reference",
			stdin: conf(`{"ranges":[[{"subnet":"10.1.2.0/24"}]]}`, `"runtimeConfig":{"ipRanges":[[{"subnet":"10.7.0.0/24","rangeStart":"10.7.0.100"}]]}`),
			want: `network=net1 dataDir=/var/lib/cni/networks resolvConf=""
set 0: subnet=10.7.0.0/24 start=10.7.0.100 end=10.7.0.254 gw=10.7.0.1
set 1: subnet=10.1.2.0/24 start=10.1.2.1 end=10.1.2.254 gw=10.1.2.1
`,
		},
		{
			name:  "two ranges in one set",
			stdin: conf(`{"ranges":[[{"subnet":"10.1.2.0/24"},{"subnet":"10.1.3.0/24","gateway":"10.1.3.9"}]]}`),
			want: `network=net1 dataDir=/var/lib/cni/networks resolvConf=""
set 0: subnet=10.1.2.0/24 start=10.1.2.1 end=10.1.2.254 gw=10.1.2.1
set 0: subnet=10.1.3.0/24 start=10.1.3.1 end=10.1.3.254 gw=10.1.3.9
`,
		},
		{
			name:  "requested addresses from all three sources",
			args:  "IgnoreUnknown=1;K8S_POD_NAME=p;ip=10.1.2.9;IP=10.1.2.7/24",
			stdin: conf(`{"ranges":[[{"subnet":"10.1.2.0/24"}],[{"subnet":"fd00::/64"}]]}`, `"args":{"cni":{"ips":["10.1.2.7"]}}`, `"runtimeConfig":{"ips":["fd00::7/64"]}`),
			want: `network=net1 dataDir=/var/lib/cni/networks resolvConf=""
set 0: subnet=10.1.2.0/24 start=10.1.2.1 end=10.1.2.254 gw=10.1.2.1
set 0: requested 10.1.2.7 from CNI_ARGS IP
set 1: subnet=fd00::/64 start=fd00::1 end=fd00::ffff:ffff:ffff:ffff gw=fd00::1
set 1: requested fd00::7 from runtimeConfig.ips
`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseConf(tc.stdin, tc.args)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, dump(c)); d != "" {
				t.Errorf("parsed configuration differs (-want +got):\n%s", d)
			}
		})
	}
}

// TestParseConfErrors: every configuration mistake is a CNI error with the right code
// whose message names the offending key.
func TestParseConfErrors(t *testing.T) {
	r := func(rng string) []byte { return conf(`{"ranges":[[` + rng + `]]}`) }
	for _, tc := range []struct {
		name  string
		stdin []byte
		args  string
		code  uint
		want  []string // substrings of the error
	}{
		{"malformed JSON", []byte(`{"ipam":`), "", 6, []string{"network configuration"}},
		{"wrong type", conf(`{"ranges":"10.0.0.0/8"}`), "", 6, []string{"ranges"}},
		{"ipam missing", []byte(`{"cniVersion":"1.1.0","name":"n"}`), "", 7, []string{"invalid ipam", `"ipam" object is missing`}},
		{"no ranges", conf(`{"type":"host-local"}`), "", 7, []string{"invalid ipam.ranges", "no address ranges"}},
		{"empty range set", conf(`{"ranges":[[]]}`), "", 7, []string{"invalid ipam.ranges[0]", "empty"}},
		{"subnet missing", r(`{"rangeStart":"10.0.0.5"}`), "", 7, []string{"ipam.ranges[0][0].subnet", "missing"}},
		{"subnet not a CIDR", r(`{"subnet":"10.0.0.0"}`), "", 7, []string{"ipam.ranges[0][0].subnet", "not a CIDR"}},
		{"subnet host bits", r(`{"subnet":"10.0.0.5/24"}`), "", 7, []string{"ipam.ranges[0][0].subnet", "host bits", "10.0.0.0/24"}},
		{"subnet /31", r(`{"subnet":"10.0.0.0/31"}`), "", 7, []string{"ipam.ranges[0][0].subnet", "too small"}},
		{"subnet v6 /127", r(`{"subnet":"fd00::/127"}`), "", 7, []string{"ipam.ranges[0][0].subnet", "too small"}},
		{"gateway outside subnet", r(`{"subnet":"10.0.0.0/24","gateway":"10.0.1.1"}`), "", 7, []string{"ipam.ranges[0][0].gateway", "outside subnet 10.0.0.0/24"}},
		{"gateway not an IP", r(`{"subnet":"10.0.0.0/24","gateway":"ten"}`), "", 7, []string{"ipam.ranges[0][0].gateway", "not an IP"}},
		{"rangeStart outside subnet", r(`{"subnet":"10.0.0.0/24","rangeStart":"10.0.5.1"}`), "", 7, []string{"ipam.ranges[0][0].rangeStart", "outside"}},
		{"rangeEnd outside subnet", r(`{"subnet":"10.0.0.0/24","rangeEnd":"10.0.5.1"}`), "", 7, []string{"ipam.ranges[0][0].rangeEnd", "outside"}},
		{"rangeStart after rangeEnd", r(`{"subnet":"10.0.0.0/24","rangeStart":"10.0.0.50","rangeEnd":"10.0.0.40"}`), "", 7, []string{"ipam.ranges[0][0].rangeStart", "after rangeEnd 10.0.0.40"}},
		{"only the gateway", r(`{"subnet":"10.0.0.0/24","rangeStart":"10.0.0.1","rangeEnd":"10.0.0.1"}`), "", 7, []string{"ipam.ranges[0][0].rangeStart", "no usable address"}},
		{"v4 rangeStart in v6 subnet", r(`{"subnet":"fd00::/64","rangeStart":"10.0.0.1"}`), "", 7, []string{"ipam.ranges[0][0].rangeStart", "IPv4 but subnet fd00::/64 is IPv6"}},
		{"v6 gateway in v4 subnet", r(`{"subnet":"10.0.0.0/24","gateway":"fd00::1"}`), "", 7, []string{"ipam.ranges[0][0].gateway", "IPv6 but subnet"}},
		{"mixed families in a set", r(`{"subnet":"10.0.0.0/24"},{"subnet":"fd00::/64"}`), "", 7, []string{"ipam.ranges[0][1].subnet", "one address family"}},
		{"overlap within a set", r(`{"subnet":"10.0.0.0/24"},{"subnet":"10.0.0.0/25"}`), "", 7, []string{"ipam.ranges[0][1]", "overlaps"}},
		{"overlap across sets", conf(`{"ranges":[[{"subnet":"10.0.0.0/16"}],[{"subnet":"10.0.3.0/24"}]]}`), "", 7, []string{"ipam.ranges[1]", "overlaps range 10.0.0.1-10.0.255.254 of ipam.ranges[0]"}},
		{"legacy overlaps ranges", conf(`{"subnet":"10.0.0.0/24","ranges":[[{"subnet":"10.0.0.0/24"}]]}`), "", 7, []string{"ipam.ranges[0]", "overlaps", "of ipam"}},
		{"legacy bad gateway", conf(`{"subnet":"10.0.0.0/24","gateway":"10.9.9.9"}`), "", 7, []string{"invalid ipam.gateway"}},
		{"ipRanges bad subnet", conf(`{}`, `"runtimeConfig":{"ipRanges":[[{"subnet":"nope"}]]}`), "", 7, []string{"runtimeConfig.ipRanges[0][0].subnet"}},
		{"relative dataDir", conf(`{"dataDir":"leases","ranges":[[{"subnet":"10.0.0.0/24"}]]}`), "", 7, []string{"ipam.dataDir", "not an absolute path"}},
		{"route without dst", conf(`{"routes":[{"gw":"10.0.0.1"}],"ranges":[[{"subnet":"10.0.0.0/24"}]]}`), "", 7, []string{"ipam.routes[0].dst"}},
		{"CNI_ARGS IP garbage", r(`{"subnet":"10.0.0.0/24"}`), "IP=banana", 4, []string{"CNI_ARGS", "invalid IP address banana"}},
		{"CNI_ARGS ip= in lower case", r(`{"subnet":"10.0.0.0/24"}`), "ip=10.0.0.5", 4, []string{"CNI_ARGS", "unknown args", "host-local reads IgnoreUnknown, IP"}},
		{"CNI_ARGS unknown key", r(`{"subnet":"10.0.0.0/24"}`), "K8S_POD_NAME=p", 4, []string{"CNI_ARGS", "unknown args"}},
		{"CNI_ARGS two addresses", r(`{"subnet":"10.0.0.0/24"}`), "IP=10.0.0.5,10.0.0.6", 4, []string{"CNI_ARGS", "invalid IP address 10.0.0.5,10.0.0.6"}},
		{"CNI_ARGS IP outside", r(`{"subnet":"10.0.0.0/24"}`), "IP=10.9.0.5", 4, []string{"CNI_ARGS", "IP=10.9.0.5 is not in any configured range"}},
		{"CNI_ARGS not key=value", r(`{"subnet":"10.0.0.0/24"}`), "IP", 4, []string{"CNI_ARGS"}},
		{"requested outside every range", r(`{"subnet":"10.0.0.0/24","rangeEnd":"10.0.0.99"}`), "IP=10.0.0.100", 4, []string{"10.0.0.100 is not in any configured range (10.0.0.1-10.0.0.99)"}},
		{"requested gateway", conf(`{"ranges":[[{"subnet":"10.0.0.0/24"}]]}`, `"runtimeConfig":{"ips":["10.0.0.1"]}`), "", 7, []string{"invalid runtimeConfig.ips", "gateway"}},
		{"two requested in one set", conf(`{"ranges":[[{"subnet":"10.0.0.0/24"}]]}`, `"args":{"cni":{"ips":["10.0.0.5","10.0.0.6"]}}`), "", 7, []string{"invalid args.cni.ips", "at most one address per range set"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConf(tc.stdin, tc.args)
			if err == nil {
				t.Fatal("parsed without error")
			}
			if got := cniplumb.Code(err); got != tc.code {
				t.Errorf("code %d, want %d: %v", got, tc.code, err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestParseStoreConf(t *testing.T) {
	// DEL and GC work with ranges that no longer parse.
	sc, err := ParseStoreConf(conf(`{"dataDir":"/tmp/x","ranges":[[{"subnet":"broken"}]]}`), "/wd")
	if err != nil {
		t.Fatal(err)
	}
	if sc.Network != "net1" || sc.DataDir != "/tmp/x" {
		t.Errorf("got %+v", sc)
	}
	// A relative dataDir (which ADD refuses) is where the reference kept its leases:
	// under the working directory.
	sc, err = ParseStoreConf(conf(`{"dataDir":"rel/leases"}`), "/run/containerd")
	if err != nil || sc.DataDir != "/run/containerd/rel/leases" || sc.Relative != "rel/leases" {
		t.Errorf("relative dataDir: %+v, %v", sc, err)
	}
	if _, err := ParseStoreConf(conf(`{"dataDir":"rel"}`), ""); cniplumb.Code(err) != types.ErrInvalidNetworkConfig {
		t.Errorf("relative dataDir without a working directory: %v", err)
	}
}
