// SPDX-License-Identifier: Apache-2.0

package main

import (
	"net"
	"testing"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/netfilter"
)

// FuzzParseConf feeds arbitrary configuration and CNI_ARGS to bridge's parser and, when
// it accepts them, plans addresses for a fixed IPAM result. Rejections must carry a
// CNI code; nothing may panic.
func FuzzParseConf(f *testing.F) {
	for _, s := range []string{
		string(conf1(`"isGateway":true,"ipMasq":true,"mtu":1400`)),
		string(conf1(`"vlan":100,"preserveDefaultVlan":false`)),
		string(conf1(`"vlanTrunk":[{"minID":10,"maxID":20},{"id":30}]`)),
		string(conf1(`"ipMasqBackend":"nftables","macspoofchk":true`)),
		string(conf1(`"runtimeConfig":{"mac":"02:00:00:00:00:01"},"args":{"cni":{"mac":"zz"}}`)),
		`{"cniVersion":"1.0.0","name":"n","type":"bridge","mtu":-1}`,
		`{"cniVersion":"1.0.0","name":"n","type":"bridge","bridge":"../../etc"}`,
	} {
		f.Add([]byte(s), "MAC=02:00:00:00:00:02;IgnoreUnknown=1")
	}
	ipam := &current.Result{IPs: []*current.IPConfig{{Address: net.IPNet{IP: net.ParseIP("10.0.0.5").To4(), Mask: net.CIDRMask(24, 32)}}}}
	f.Fuzz(func(t *testing.T, stdin []byte, args string) {
		c, err := parseConf(stdin, args)
		if err != nil {
			if cniplumb.Code(err) == cniplumb.CodeInternal {
				t.Fatalf("rejection without a CNI code: %v", err)
			}
			return
		}
		_, _ = planAddresses(c, netfilter.Owner{Network: "n", ContainerID: "c", IfName: "eth0"}, ipam)
	})
}
