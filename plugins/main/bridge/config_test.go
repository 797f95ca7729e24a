// SPDX-License-Identifier: Apache-2.0

package main

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/netfilter"
)

func conf1(extra string) []byte {
	if extra != "" {
		extra = "," + extra
	}
	return []byte(`{"cniVersion":"1.1.0","name":"n","type":"bridge"` + extra + `}`)
}

func TestParseDefaults(t *testing.T) {
	c, err := parseConf(conf1(`"ipam":{"type":"host-local"}`), "")
	if err != nil {
		t.Fatal(err)
	}
	if c.Bridge != "cni0" || !c.Layer3 || c.IPAMType != "host-local" || c.Backend != netfilter.Auto || c.MAC != nil || c.raw.IsGateway {
		t.Errorf("defaults = %+v", c)
	}
	c, err = parseConf(conf1(`"isDefaultGateway":true,"ipMasqBackend":"iptables","bridge":"br-x"`), "")
	if err != nil {
		t.Fatal(err)
	}
	if !c.raw.IsGateway || c.Backend != netfilter.KindIPTables || c.Bridge != "br-x" || c.Layer3 {
		t.Errorf("isDefaultGateway should imply isGateway: %+v", c)
	}
}

func TestParseTrunk(t *testing.T) {
	c, err := parseConf(conf1(`"vlanTrunk":[{"minID":5,"maxID":7},{"id":3},{"id":6}]`), "")
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]int{3, 5, 6, 7}, c.Trunk); d != "" {
		t.Error(d)
	}
}

func TestParseMAC(t *testing.T) {
	for _, tc := range []struct {
		name, conf, args, want string
	}{
		{"none", "", "", ""},
		{"CNI_ARGS", "", "IgnoreUnknown=1;MAC=02:00:00:00:00:01", "02:00:00:00:00:01"},
		{"args.cni.mac beats CNI_ARGS", `"args":{"cni":{"mac":"02:00:00:00:00:02"}}`, "MAC=02:00:00:00:00:01", "02:00:00:00:00:02"},
		{"lower-case mac= is not MAC", "", "IgnoreUnknown=1;mac=02:00:00:00:00:01", ""},
		{"runtimeConfig beats all", `"args":{"cni":{"mac":"02:00:00:00:00:02"}},"runtimeConfig":{"mac":"02:00:00:00:00:03"}`, "MAC=02:00:00:00:00:01", "02:00:00:00:00:03"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := parseConf(conf1(tc.conf), tc.args)
			if err != nil {
				t.Fatal(err)
			}
			got := ""
			if c.MAC != nil {
				got = c.MAC.String()
			}
			if got != tc.want {
				t.Errorf("MAC = %q, want %q", got, tc.want)
			}
		})
	}
	// DEL and GC ignore a bad MAC.
	if _, warnings, err := parseTeardown(conf1(`"runtimeConfig":{"mac":"bad"}`)); err != nil || len(warnings) != 0 {
		t.Errorf("teardown parse of a bad MAC: %v, %v", warnings, err)
	}
}

// TestParseTeardown: DEL and GC read only what teardown needs; what ADD would refuse
// is a warning, and a key teardown needs that cannot be read is an error while the
// other keys still count.
func TestParseTeardown(t *testing.T) {
	for _, tc := range []struct {
		name, conf string
		want       teardownConf
		warn, err  string
	}{
		{name: "valid", conf: `"ipMasq":true,"macspoofchk":true,"bridge":"br0","ipam":{"type":"host-local"}`,
			want: teardownConf{IPAMType: "host-local", IPMasq: true, MacSpoofChk: true, Bridge: "br0"}},
		{name: "defaults", conf: ``, want: teardownConf{Bridge: "cni0"}},
		{name: "backend typo", conf: `"ipMasq":true,"ipMasqBackend":"nftabels","ipam":{"type":"host-local"}`,
			want: teardownConf{IPAMType: "host-local", IPMasq: true, Bridge: "cni0"}, warn: "nftabels"},
		{name: "mtu out of range", conf: `"mtu":-5,"ipam":{"type":"x"}`, want: teardownConf{IPAMType: "x", Bridge: "cni0"}, warn: "mtu -5"},
		{name: "bridge name too long", conf: `"bridge":"abcdefghijklmnopq"`, want: teardownConf{Bridge: "abcdefghijklmnopq"}, warn: "at most 15"},
		{name: "hairpin and promisc", conf: `"hairpinMode":true,"promiscMode":true`, want: teardownConf{Bridge: "cni0"}, warn: "hairpin"},
		{name: "mtu not a number", conf: `"mtu":"big","ipMasq":true,"ipam":{"type":"x"}`,
			want: teardownConf{IPAMType: "x", IPMasq: true, Bridge: "cni0"}, warn: "mtu"},
		{name: "ipMasq not a bool", conf: `"ipMasq":"yes","ipam":{"type":"x"}`,
			want: teardownConf{IPAMType: "x", IPMasq: true, Bridge: "cni0"}, warn: "ipMasq", err: "ipMasq"},
		{name: "ipam not an object", conf: `"ipam":"host-local"`, want: teardownConf{Bridge: "cni0"}, warn: "ipam", err: "ipam"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, warnings, err := parseTeardown(conf1(tc.conf))
			if got == nil {
				t.Fatalf("no teardown conf: %v", err)
			}
			if d := cmp.Diff(tc.want, *got); d != "" {
				t.Errorf("teardown conf (-want +got):\n%s", d)
			}
			if (tc.warn == "") != (len(warnings) == 0) || tc.warn != "" && !strings.Contains(warnings[0].Error(), tc.warn) {
				t.Errorf("warnings = %v, want one containing %q", warnings, tc.warn)
			}
			if (tc.err == "") != (err == nil) || tc.err != "" && !strings.Contains(err.Error(), tc.err) {
				t.Errorf("error = %v, want %q", err, tc.err)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name, conf, args string
		code             uint
		want             string
	}{
		{"malformed JSON", `"mtu":"big"`, "", 6, "mtu"},
		{"empty bridge name", `"bridge":""`, "", 7, "is empty"},
		{"long bridge name", `"bridge":"abcdefghijklmnop"`, "", 7, "at most 15"},
		{"bridge name with slash", `"bridge":"a/b"`, "", 7, "'/'"},
		{"negative mtu", `"mtu":-1`, "", 7, "out of range"},
		{"huge mtu", `"mtu":70000`, "", 7, "out of range"},
		{"tiny mtu", `"mtu":40`, "", 7, "below IPv4's minimum"},
		{"vlan too big", `"vlan":4095`, "", 7, "invalid VLAN ID 4095"},
		{"vlan negative", `"vlan":-2`, "", 7, "invalid VLAN ID -2"},
		{"vlan gateway name too long", `"bridge":"abcdefghijklm","vlan":100,"isGateway":true`, "", 7, "longer than Linux's 15 bytes"},
		{"trunk minID zero", `"vlanTrunk":[{"minID":0,"maxID":5}]`, "", 7, "minID parameter 0"},
		{"trunk maxID big", `"vlanTrunk":[{"minID":1,"maxID":5000}]`, "", 7, "maxID parameter 5000"},
		{"trunk min > max", `"vlanTrunk":[{"minID":9,"maxID":5}]`, "", 7, "greater than maxID"},
		{"trunk min only", `"vlanTrunk":[{"minID":9}]`, "", 7, "maxID is missing"},
		{"trunk max only", `"vlanTrunk":[{"maxID":9}]`, "", 7, "minID is missing"},
		{"trunk id big", `"vlanTrunk":[{"id":4095}]`, "", 7, "trunk id parameter 4095"},
		{"hairpin and promisc", `"hairpinMode":true,"promiscMode":true`, "", 7, "hairpin mode and promiscuous mode"},
		{"ipam with disableContainerInterface", `"disableContainerInterface":true,"ipam":{"type":"host-local"}`, "", 7, "disableContainerInterface"},
		{"unknown backend", `"ipMasqBackend":"ebtables"`, "", 7, `"ebtables" is not a netfilter backend`},
		{"bad MAC in CNI_ARGS", "", "MAC=zz", 7, `"zz" is not a MAC address`},
		{"bad MAC in args", `"args":{"cni":{"mac":"1:2:3"}}`, "", 7, "args.cni.mac"},
		{"EUI-64 MAC", `"runtimeConfig":{"mac":"02:00:00:00:00:00:00:01"}`, "", 7, "runtimeConfig.mac"},
		{"malformed CNI_ARGS", "", "garbage", 4, `invalid pair "garbage"`},
		{"lower-case mac= without IgnoreUnknown", "", "mac=02:00:00:00:00:01", 4, "unknown args"},
		{"unknown CNI_ARGS key", "", "K8S_POD_NAME=p", 4, "bridge reads IgnoreUnknown, MAC"},
		{"empty CNI_ARGS entry", "", "MAC=02:00:00:00:00:01;", 4, `invalid pair ""`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseConf(conf1(tc.conf), tc.args)
			if err == nil {
				t.Fatal("accepted")
			}
			if cniplumb.Code(err) != tc.code || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error = %v (code %d), want code %d containing %q", err, cniplumb.Code(err), tc.code, tc.want)
			}
		})
	}
}
