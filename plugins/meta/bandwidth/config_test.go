// SPDX-License-Identifier: Apache-2.0

package main

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/podwire/podwire/pkg/cniplumb"
)

func TestParseConf(t *testing.T) {
	const head = `{"cniVersion":"1.0.0","name":"net","type":"bandwidth"`
	for _, c := range []struct {
		name, conf string
		want       Request
		wantErr    string // substring of a code-7 error
	}{
		{name: "nothing", conf: head + `}`, want: Request{}},
		{name: "empty runtimeConfig", conf: head + `,"runtimeConfig":{}}`, want: Request{}},
		{name: "runtimeConfig, containerd bursts", conf: head + `,"runtimeConfig":{"bandwidth":{"ingressRate":10000000,"ingressBurst":4294967295,"egressRate":20000000,"egressBurst":4294967295}}}`,
			want: Request{Ingress: Direction{10_000_000, 4294967295}, Egress: Direction{20_000_000, 4294967295}, From: "runtimeConfig.bandwidth"}},
		{name: "plugin level", conf: head + `,"ingressRate":1000000,"ingressBurst":8000}`,
			want: Request{Ingress: Direction{1_000_000, 8000}}},
		{name: "runtimeConfig wins as a whole", conf: head + `,"ingressRate":1000000,"egressRate":5000000,"runtimeConfig":{"bandwidth":{"egressRate":7000000}}}`,
			want: Request{Egress: Direction{7_000_000, 0}, From: "runtimeConfig.bandwidth"}},
		{name: "null runtime bandwidth falls back", conf: head + `,"ingressRate":1000000,"runtimeConfig":{"bandwidth":null}}`,
			want: Request{Ingress: Direction{1_000_000, 0}}},
		{name: "burst 0 is fine", conf: head + `,"egressRate":100000000,"egressBurst":0}`, want: Request{Egress: Direction{100_000_000, 0}}},
		{name: "exponent form", conf: head + `,"egressRate":1e8}`, want: Request{Egress: Direction{100_000_000, 0}}},
		{name: "1 Tbit/s", conf: head + `,"egressRate":1000000000000}`, want: Request{Egress: Direction{1_000_000_000_000, 0}}},
		{name: "max burst", conf: head + `,"egressRate":1000,"egressBurst":34359738359}`, want: Request{Egress: Direction{1000, 34359738359}}},
		{name: "empty subnets", conf: head + `,"unshapedSubnets":[],"egressRate":1000}`, want: Request{Egress: Direction{1000, 0}}},

		{name: "negative rate", conf: head + `,"runtimeConfig":{"bandwidth":{"ingressRate":-1}}}`, wantErr: "runtimeConfig.bandwidth.ingressRate is -1: negative"},
		{name: "negative burst", conf: head + `,"egressRate":1000,"egressBurst":-8}`, wantErr: "egressBurst is -8: negative"},
		{name: "string rate", conf: head + `,"ingressRate":"10M"}`, wantErr: `ingressRate is "10M": a string`},
		{name: "fraction", conf: head + `,"ingressRate":1000.5}`, wantErr: "not a whole number"},
		{name: "bool", conf: head + `,"ingressRate":true}`, wantErr: "not a number"},
		{name: "above 1 Tbit/s", conf: head + `,"ingressRate":1000000000001}`, wantErr: "too large"},
		{name: "huge exponent", conf: head + `,"ingressRate":1e400}`, wantErr: "too large"},
		{name: "burst above the reference's 4 GiB", conf: head + `,"ingressRate":1000,"ingressBurst":34359738360}`, wantErr: "too large"},
		{name: "below 1 kbit/s", conf: head + `,"egressRate":999}`, wantErr: "smallest rate is 1000"},
		{name: "burst without rate", conf: head + `,"egressBurst":1000}`, wantErr: "egressBurst is 1000 but egressRate is 0"},
		{name: "plugin-level unshapedSubnets, no annotations", conf: head + `,"unshapedSubnets":["10.0.0.0/8"],"egressRate":1000}`, wantErr: "unshapedSubnets is not supported"},
		{name: "plugin-level unshapedSubnets, annotated pod", conf: head + `,"unshapedSubnets":["10.0.0.0/8"],"runtimeConfig":{"bandwidth":{"egressRate":7000000,"egressBurst":4294967295}}}`, wantErr: "unshapedSubnets is not supported"},
		{name: "plugin-level shapedSubnets, annotated pod", conf: head + `,"shapedSubnets":["10.0.0.0/8"],"runtimeConfig":{"bandwidth":{"egressRate":7000000}}}`, wantErr: "shapedSubnets is not supported"},
		{name: "plugin-level unshapedSubnets, nothing shaped", conf: head + `,"unshapedSubnets":["10.0.0.0/8"]}`, wantErr: "unshapedSubnets is not supported"},
		{name: "empty subnets, annotated pod", conf: head + `,"unshapedSubnets":[],"runtimeConfig":{"bandwidth":{"egressRate":7000000}}}`,
			want: Request{Egress: Direction{7_000_000, 0}, From: "runtimeConfig.bandwidth"}},
		{name: "subnets unsupported", conf: head + `,"runtimeConfig":{"bandwidth":{"shapedSubnets":["10.0.0.0/8"]}}}`, wantErr: "shapedSubnets is not supported"},
		{name: "bandwidth not an object", conf: head + `,"runtimeConfig":{"bandwidth":42}}`, wantErr: "must be an object"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := parseConf([]byte(c.conf))
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) || cniplumb.Code(err) != cniplumb.CodeInvalidConfig {
					t.Fatalf("err = %v (code %d), want code 7 containing %q", err, cniplumb.Code(err), c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(c.want, got); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}
