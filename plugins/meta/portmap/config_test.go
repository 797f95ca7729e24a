// SPDX-License-Identifier: Apache-2.0

package main

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/netfilter"
)

func confWith(extra string) []byte {
	return []byte(`{"cniVersion":"1.1.0","name":"net1","type":"portmap"` + extra + `}`)
}

func TestParseConfDefaults(t *testing.T) {
	c, err := parseConf(confWith(`,"runtimeConfig":{"portMappings":[
		{"hostPort":8080,"containerPort":80},
		{"hostPort":5353,"containerPort":53,"protocol":"UDP","hostIP":"192.0.2.1"},
		{"hostPort":8080,"containerPort":80,"protocol":"tcp"},
		{"hostPort":9000,"containerPort":9000,"protocol":"sctp","hostIP":"::ffff:192.0.2.9"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Backend != netfilter.Auto || !c.SNAT || c.MasqAll || c.MarkBit != 13 || c.SetMarkChain != "" || len(c.Conditions) != 0 {
		t.Errorf("defaults: %+v", c)
	}
	want := []Mapping{
		{HostPort: 8080, ContainerPort: 80, Proto: netfilter.TCP},
		{HostPort: 5353, ContainerPort: 53, Proto: netfilter.UDP, HostIP: addr("192.0.2.1")},
		{HostPort: 9000, ContainerPort: 9000, Proto: netfilter.SCTP, HostIP: addr("192.0.2.9")},
	}
	if d := cmp.Diff(want, c.Mappings, cmp.Comparer(func(a, b Mapping) bool { return a == b })); d != "" {
		t.Errorf("mappings (-want +got):\n%s", d)
	}

	c, err = parseConf(confWith(`,"snat":false,"masqAll":true,"markMasqBit":0,"backend":"nftables","conditionsV4":["-s","10.0.0.0/8"],"conditionsV6":[""]`))
	if err != nil {
		t.Fatal(err)
	}
	if c.SNAT || !c.MasqAll || c.MarkBit != 0 || c.Backend != netfilter.KindNFTables || len(c.Conditions) != 1 ||
		c.Conditions[netfilter.IPv4].Src != pfx("10.0.0.0/8") {
		t.Errorf("explicit keys: %+v", c)
	}

	c, err = parseConf(confWith(`,"externalSetMarkChain":"KUBE-MARK-MASQ"`))
	if err != nil || c.Backend != netfilter.KindIPTables || c.SetMarkChain != "KUBE-MARK-MASQ" {
		t.Errorf("externalSetMarkChain implies iptables: %+v, %v", c, err)
	}
}

func TestParseConfErrors(t *testing.T) {
	for _, tc := range []struct {
		name, extra string
		code        uint
		want        string
	}{
		{"host port 0", `,"runtimeConfig":{"portMappings":[{"hostPort":0,"containerPort":80}]}`, 7, "hostPort 0 is outside 1-65535"},
		{"host port too large", `,"runtimeConfig":{"portMappings":[{"hostPort":65536,"containerPort":80}]}`, 7, "65536 is outside 1-65535"},
		{"negative host port", `,"runtimeConfig":{"portMappings":[{"hostPort":-1,"containerPort":80}]}`, 7, "outside 1-65535"},
		{"missing host port", `,"runtimeConfig":{"portMappings":[{"containerPort":80}]}`, 7, "hostPort missing"},
		{"string port", `,"runtimeConfig":{"portMappings":[{"hostPort":"80","containerPort":80}]}`, 7, "a string, not a number"},
		{"fractional port", `,"runtimeConfig":{"portMappings":[{"hostPort":80.5,"containerPort":80}]}`, 7, "not a whole number"},
		{"container port too large", `,"runtimeConfig":{"portMappings":[{"hostPort":80,"containerPort":70000}]}`, 7, "containerPort 70000 is outside 1-65535"},
		{"unknown protocol", `,"runtimeConfig":{"portMappings":[{"hostPort":80,"containerPort":80,"protocol":"icmp"}]}`, 7, `protocol "icmp"`},
		{"protocol not a string", `,"runtimeConfig":{"portMappings":[{"hostPort":80,"containerPort":80,"protocol":6}]}`, 7, "must be a string"},
		{"invalid hostIP", `,"runtimeConfig":{"portMappings":[{"hostPort":80,"containerPort":80,"hostIP":"1.2.3"}]}`, 7, `hostIP "1.2.3"`},
		{"hostIP name", `,"runtimeConfig":{"portMappings":[{"hostPort":80,"containerPort":80,"hostIP":"localhost"}]}`, 7, "not an IPv4 or IPv6 address"},
		{"hostIP with zone", `,"runtimeConfig":{"portMappings":[{"hostPort":80,"containerPort":80,"hostIP":"fe80::1%eth0"}]}`, 7, "not an IPv4 or IPv6 address"},
		{"conflicting mappings", `,"runtimeConfig":{"portMappings":[{"hostPort":80,"containerPort":80},{"hostPort":80,"containerPort":81}]}`, 7, "mapped twice"},
		{"portMappings not a list", `,"runtimeConfig":{"portMappings":{"hostPort":80}}`, 7, "runtimeConfig.portMappings must be a JSON array"},
		{"snat not a bool", `,"snat":"yes"`, 7, "snat must be a JSON boolean"},
		{"unknown backend", `,"backend":"ebtables"`, 7, `"ebtables" is not a netfilter backend`},
		{"mark bit too large", `,"markMasqBit":32`, 7, "markMasqBit is 32"},
		{"mark bit negative", `,"markMasqBit":-1`, 7, "markMasqBit is -1"},
		{"mark bit and external chain", `,"markMasqBit":13,"externalSetMarkChain":"KUBE-MARK-MASQ"`, 7, "exclude each other"},
		{"external chain with nftables", `,"backend":"nftables","externalSetMarkChain":"KUBE-MARK-MASQ"`, 7, "nftables backend cannot jump"},
		{"external chain injection", `,"externalSetMarkChain":"KUBE-MARK-MASQ -j ACCEPT"`, 7, "not an iptables chain name"},
		{"external chain newline", `,"externalSetMarkChain":"X\nCOMMIT"`, 7, "not an iptables chain name"},
		{"external chain builtin target", `,"externalSetMarkChain":"ACCEPT"`, 7, "built-in iptables target"},
		{"condition injection", `,"conditionsV4":["-j","ACCEPT"]`, 7, `has the option "-j"`},
		{"condition garbage", `,"conditionsV4":["-m","comment"]`, 7, `has the option "-m"`},
		{"malformed JSON", `,`, 6, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseConf(confWith(tc.extra))
			if cniplumb.Code(err) != tc.code || !strings.Contains(errText(err), tc.want) {
				t.Errorf("parseConf = %v (code %d); want code %d containing %q", errText(err), cniplumb.Code(err), tc.code, tc.want)
			}
		})
	}
}

func errText(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

func TestParseTeardownConf(t *testing.T) {
	// DEL must cope with what ADD refuses (the reference accepted these).
	tc := parseTeardownConf(confWith(`,"backend":"bogus","runtimeConfig":{"portMappings":[{"hostPort":70000,"containerPort":1,"protocol":"udp"},{"hostPort":53,"containerPort":53,"protocol":"UDP"},{"hostPort":53,"containerPort":53,"protocol":"udp"}]}`))
	if !tc.HasMappings || tc.Backend != netfilter.Auto || len(tc.UDPPorts) != 1 || tc.UDPPorts[0] != 53 {
		t.Errorf("teardown conf = %+v", tc)
	}
	if tc := parseTeardownConf(confWith(`,"snat":"bad","runtimeConfig":{"portMappings":[{"hostPort":1}]}`)); !tc.HasMappings {
		t.Errorf("type errors hide the mappings: %+v", tc)
	}
	if tc := parseTeardownConf(confWith(``)); tc.HasMappings {
		t.Errorf("no mappings: %+v", tc)
	}
	if tc := parseTeardownConf(confWith(`,"externalSetMarkChain":"KUBE-MARK-MASQ"`)); tc.Backend != netfilter.KindIPTables {
		t.Errorf("external chain: %+v", tc)
	}
}
