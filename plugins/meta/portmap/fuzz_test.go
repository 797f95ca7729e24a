// SPDX-License-Identifier: Apache-2.0

package main

import (
	"strings"
	"testing"

	"github.com/podwire/podwire/pkg/cniplumb"
)

// FuzzParseConf feeds arbitrary configurations to the parser and the planner: they
// must never panic, every rejection must be a CNI error with a code, and whatever is
// accepted must render in both backends without a line break or a quote that could
// change an iptables-restore transaction.
func FuzzParseConf(f *testing.F) {
	for _, s := range []string{
		`{"runtimeConfig":{"portMappings":[{"hostPort":80,"containerPort":8080,"protocol":"udp","hostIP":"192.0.2.1"}]}}`,
		`{"conditionsV4":["-s","10.0.0.0/8","!","-d","192.0.2.0/24","-i","eth0"],"conditionsV6":["ip6 saddr != fd00::/8"]}`,
		`{"externalSetMarkChain":"KUBE-MARK-MASQ","snat":false,"masqAll":true}`,
		`{"markMasqBit":31,"backend":"nftables"}`,
		`{"conditionsV4":["-j","ACCEPT\n-A X"]}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, conf string) {
		c, err := parseConf([]byte(conf))
		if err != nil {
			if cniplumb.Code(err) == cniplumb.CodeInternal {
				t.Fatalf("rejection without a CNI code: %v", err)
			}
			return
		}
		_ = parseTeardownConf([]byte(conf))
		p, err := planHostPorts(c, owner1, dualStack(), "eth0")
		if err != nil {
			return
		}
		if r, err := p.Rules(); err == nil {
			for _, rule := range r.Rules {
				if strings.ContainsAny(rule.String(), "\n\r\"") {
					t.Fatalf("rule text %q", rule)
				}
			}
		}
		for _, cond := range c.Conditions {
			if strings.ContainsAny(cond.InIface, " \t\n\r\"'") {
				t.Fatalf("interface %q", cond.InIface)
			}
		}
		if strings.ContainsAny(c.SetMarkChain, " \t\n\r\"'") {
			t.Fatalf("chain %q", c.SetMarkChain)
		}
	})
}
