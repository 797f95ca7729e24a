// SPDX-License-Identifier: Apache-2.0

package main

import (
	"testing"

	"github.com/podwire/podwire/pkg/cniplumb"
)

// FuzzParseConf feeds arbitrary configuration (plugin-level keys and
// runtimeConfig.bandwidth) to bandwidth's parser and plans shaping for what it accepts.
// Rejections must carry a CNI code; accepted requests must plan or fail cleanly.
func FuzzParseConf(f *testing.F) {
	for _, s := range []string{
		`{"cniVersion":"1.0.0","name":"n","type":"bandwidth","runtimeConfig":{"bandwidth":{"ingressRate":10000000,"ingressBurst":4294967295,"egressRate":10000000,"egressBurst":0}}}`,
		`{"cniVersion":"1.0.0","name":"n","type":"bandwidth","ingressRate":1000,"ingressBurst":1}`,
		`{"cniVersion":"1.0.0","name":"n","type":"bandwidth","egressRate":-5}`,
		`{"cniVersion":"1.0.0","name":"n","type":"bandwidth","runtimeConfig":{"bandwidth":{"IngressRate":1e13}}}`,
		`{"cniVersion":"1.0.0","name":"n","type":"bandwidth","egressRate":"10M"}`,
	} {
		f.Add([]byte(s), uint16(1500))
	}
	owner := cniplumb.Owner{Network: "n", ContainerID: "c", IfName: "eth0"}
	f.Fuzz(func(t *testing.T, stdin []byte, mtu uint16) {
		req, err := parseConf(stdin)
		if err != nil {
			if cniplumb.Code(err) == cniplumb.CodeInternal {
				t.Fatalf("rejection without a CNI code: %v", err)
			}
			return
		}
		if req.Empty() {
			return
		}
		_, _ = planShaping(owner, req, "veth0", "bwp0123456789ab", int(mtu))
	})
}
