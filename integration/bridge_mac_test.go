// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"context"
	"strings"
	"testing"

	"github.com/podwire/podwire/integration/nstest"
)

// bridgeMAC is the bridge's current MAC address.
func bridgeMAC(t *testing.T, h *nstest.H, br string) string {
	t.Helper()
	f := strings.Fields(h.Run(h.HostNS, "ip", "-o", "link", "show", br))
	for i, w := range f {
		if w == "link/ether" && i+1 < len(f) {
			return f[i+1]
		}
	}
	t.Fatalf("no MAC for %s", br)
	return ""
}

// TestBridgeMACPinnedOnForeignBridge: on a bridge podwire did not create, the kernel
// gives the bridge the lowest MAC of its ports, so it changes as ports come and go.
// podwire pins it as the reference does (the bridge's MAC set to itself), so the MAC
// in ADD's result stays the bridge's, and both podwire's and the reference's CHECK
// pass on podwire's result while other ports join and leave.
func TestBridgeMACPinnedOnForeignBridge(t *testing.T) {
	for _, gw := range []string{"isGateway", "no gateway"} {
		t.Run(gw, func(t *testing.T) {
			c := newCompat(t)
			h := c.h
			br := h.Name("br")
			h.Run(h.HostNS, "ip", "link", "add", br, "type", "bridge")
			h.Run(h.HostNS, "ip", "link", "set", br, "up")
			extra := ""
			if gw == "isGateway" {
				extra = `"isGateway":true`
			}
			list := bridgeConf(h, extra, `[[{"subnet":"10.36.0.0/24"}]]`)
			p := h.NewPod()
			rt := h.RT(p, "eth0")
			r := c.add(t, c.ours, list, rt)
			if got := bridgeMAC(t, h, br); r.Interfaces[0].Mac != got {
				t.Errorf("ADD's result gives the bridge MAC %s; the bridge has %s", r.Interfaces[0].Mac, got)
			}
			// A port with a MAC lower than any other joins, then leaves.
			low := h.Name("lo")
			h.Run(h.HostNS, "ip", "link", "add", low, "address", "02:00:00:00:00:01", "type", "veth", "peer", "name", low+"p")
			h.Run(h.HostNS, "ip", "link", "set", low, "master", br)
			for i, when := range []string{"with a lower port", "after it left"} {
				if got := bridgeMAC(t, h, br); got != r.Interfaces[0].Mac {
					t.Errorf("%s the bridge's MAC changed from %s to %s", when, r.Interfaces[0].Mac, got)
				}
				if err := h.InHost(func() error { return c.ref.CheckNetworkList(context.Background(), list, rt) }); err != nil {
					t.Errorf("%s the reference's CHECK of podwire's pod: %v", when, err)
				}
				c.check(t, list, rt)
				if i == 0 {
					h.Run(h.HostNS, "ip", "link", "del", low)
				}
			}
			c.del(t, c.ours, list, rt)
		})
	}
}
