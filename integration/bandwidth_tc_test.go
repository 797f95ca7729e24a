// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"context"
	"fmt"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/podwire/podwire/integration/nstest"
	"github.com/podwire/podwire/pkg/tc"
)

// TestBandwidthTCDirect shapes a plain veth between the host netns and a pod netns with
// pkg/tc directly (no plugin, no bridge) and measures it with iperf3 both ways, so a
// failure of TestBandwidthShaping can be told apart from a problem in the main plugin.
// One case suffices here; TestBandwidthShaping runs the full matrix.
func TestBandwidthTCDirect(t *testing.T) {
	h := nstest.New(t)
	before := h.Snapshot()
	pod := h.NewPod()
	dev := h.Name("h0")
	h.Run(h.HostNS, "ip", "link", "add", dev, "type", "veth", "peer", "name", "eth0", "netns", pod.Path())
	h.Run(h.HostNS, "ip", "addr", "add", "10.250.0.1/30", "dev", dev)
	h.Run(h.HostNS, "ip", "link", "set", dev, "up")
	h.Run(pod, "ip", "addr", "add", "10.250.0.2/30", "dev", "eth0")
	h.Run(pod, "ip", "link", "set", "eth0", "up")
	h.Run(pod, "ip", "link", "set", "lo", "up")

	for _, c := range []struct {
		rate, burst uint64
	}{{10_000_000, 4294967295}} {
		t.Run(fmt.Sprintf("%dMbit-burst%d", c.rate/1_000_000, c.burst), func(t *testing.T) {
			tbf, err := tc.SizeTBF(c.rate, c.burst, 1500)
			if err != nil {
				t.Fatal(err)
			}
			p := tc.Plan{Dev: dev, MTU: 1500, IFB: h.Name("ifb"), Alias: "podwire:test", Ingress: &tbf, Egress: &tbf}
			inHost(t, h, func() error { b := tc.NewNetlink(nil); defer b.Close(); return b.Apply(context.Background(), p) })
			defer inHost(t, h, func() error {
				b := tc.NewNetlink(nil)
				defer b.Close()
				return b.Remove(context.Background(), tc.Removal{Dev: dev, IFBs: []string{p.IFB}})
			})
			want := float64(c.rate)
			var in, out throughput
			rtts, sent := pingDuring(t, h.HostNS, "10.250.0.2", 10, func() { in = iperf(t, h, pod, h.HostNS, "10.250.0.1", true, 4) })
			t.Logf("into the pod: %s; ping %v ms", in, rtts)
			requireRate(t, "into the pod", in, want)
			requirePing(t, "into the pod", rtts, sent, 30)
			rtts, sent = pingDuring(t, pod, "10.250.0.1", 10, func() { out = iperf(t, h, pod, h.HostNS, "10.250.0.1", false, 4) })
			t.Logf("out of the pod: %s; ping %v ms", out, rtts)
			requireRate(t, "out of the pod", out, want)
			requirePing(t, "out of the pod", rtts, sent, 30)
		})
	}
	h.Run(h.HostNS, "ip", "link", "del", dev)
	h.RequireUnchanged(before)
}

func inHost(t *testing.T, h *nstest.H, f func() error) {
	t.Helper()
	if err := h.HostNS.Do(func(ns.NetNS) error { return f() }); err != nil {
		t.Fatal(err)
	}
}
