// SPDX-License-Identifier: Apache-2.0

package main

import (
	"strings"
	"testing"
)

func TestRecogniseCRIO(t *testing.T) {
	none := func(string) bool { return false }
	for _, tc := range []struct {
		name   string
		found  []foundRuntime
		exists func(string) bool
		via    string
		others []string
	}{
		{"CRI socket", []foundRuntime{{"cri-o", "1.34.0", "CRI /run/crio/crio.sock"}}, none, "cri-o 1.34.0 via CRI /run/crio/crio.sock", nil},
		{"binary", []foundRuntime{{"cri-o", "1.34.0", "binary /usr/bin/crio (not running)"}}, none, "cri-o 1.34.0 via binary /usr/bin/crio (not running)", nil},
		{"config only", nil, func(p string) bool { return p == "/etc/crio/crio.conf.d" }, "config /etc/crio/crio.conf.d", nil},
		{"containerd node", []foundRuntime{{"containerd", "2.4.2", "CRI /run/containerd/containerd.sock"}}, none, "", []string{"containerd 2.4.2"}},
		{"both", []foundRuntime{{"containerd", "1.6.20", "CRI x"}, {"CRI-O", "1.34.0", "CRI y"}}, none, "CRI-O 1.34.0 via CRI y", []string{"containerd 1.6.20"}},
		{"nothing", nil, none, "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			via, others := recogniseCRIO(tc.found, tc.exists)
			if via != tc.via || strings.Join(others, ",") != strings.Join(tc.others, ",") {
				t.Errorf("recogniseCRIO = %q, %v; want %q, %v", via, others, tc.via, tc.others)
			}
		})
	}
}

func TestCRIOChecks(t *testing.T) {
	status := func(cs []Check) map[string]string {
		m := map[string]string{}
		for _, c := range cs {
			m[c.Name] = c.Status
		}
		return m
	}
	if cs := crioChecks(crioNode{RouteLocalnet: "0", BridgeNF: "0"}); len(cs) != 0 {
		t.Errorf("no CRI-O node, checks %v; want none", cs)
	}
	for _, tc := range []struct {
		name string
		node crioNode
		want map[string]string
		hint string // a detail must carry the fix
	}{
		{"ready", crioNode{Via: "x", RouteLocalnet: "1", BridgeNF: "1"},
			map[string]string{"crio": "info", "crio-hostport-localhost": "ok", "crio-hostport-hairpin": "ok"}, ""},
		{"no route_localnet", crioNode{Via: "x", RouteLocalnet: "0", BridgeNF: "1"},
			map[string]string{"crio": "info", "crio-hostport-localhost": "warning", "crio-hostport-hairpin": "ok"},
			"sysctl -w net.ipv4.conf.all.route_localnet=1"},
		{"bridge-nf off", crioNode{Via: "x", RouteLocalnet: "1", BridgeNF: "0"},
			map[string]string{"crio": "info", "crio-hostport-localhost": "ok", "crio-hostport-hairpin": "problem"},
			"sysctl -w net.bridge.bridge-nf-call-iptables=1"},
		{"no br_netfilter", crioNode{Via: "x", RouteLocalnet: "", BridgeNF: ""},
			map[string]string{"crio": "info", "crio-hostport-localhost": "warning", "crio-hostport-hairpin": "problem"},
			"modprobe br_netfilter"},
		{"shared node", crioNode{Via: "x", RouteLocalnet: "1", BridgeNF: "1", Others: []string{"containerd 2.4.2"}},
			map[string]string{"crio": "info", "crio-hostport-localhost": "ok", "crio-hostport-hairpin": "ok", "crio-network-name": "warning"},
			"its own \"name\""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := crioChecks(tc.node)
			got := status(cs)
			if len(got) != len(tc.want) {
				t.Errorf("checks %v, want %v", got, tc.want)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("check %s = %q, want %q (all: %+v)", k, got[k], v, cs)
				}
			}
			if tc.hint != "" {
				var all []string
				for _, c := range cs {
					all = append(all, c.Detail)
				}
				if !strings.Contains(strings.Join(all, "\n"), tc.hint) {
					t.Errorf("no detail says %q:\n%s", tc.hint, strings.Join(all, "\n"))
				}
			}
		})
	}
}
