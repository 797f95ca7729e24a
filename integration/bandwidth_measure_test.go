// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/podwire/podwire/integration/measure"
	"github.com/podwire/podwire/integration/nstest"
)

// throughput is one iperf3 run as the receiver saw it, in bit/s on the wire
// (measure.Throughput has the details).
type throughput = measure.Throughput

// iperf runs an iperf3 TCP test of secs seconds between a client in client and a
// server in server (reachable at serverIP), failing the test if it cannot. With
// reverse the server sends; either way the intervals are the receiver's.
func iperf(t *testing.T, _ *nstest.H, client, server ns.NetNS, serverIP string, reverse bool, secs int) throughput {
	t.Helper()
	tp, err := measure.IPerf(client, server, serverIP, reverse, secs)
	if err != nil {
		t.Fatal(err)
	}
	return tp
}

// pingDuring pings addr from n every 200 ms while f runs (starting after 1 s, when
// the link is saturated) and returns the round-trip times in ms.
func pingDuring(t *testing.T, n ns.NetNS, addr string, count int, f func()) (rtts []float64, sent int) {
	t.Helper()
	return measure.PingDuring(n, addr, count, f)
}

// requireRate checks the acceptance bounds: every interval within ±10% of want, the
// average within ±5%.
func requireRate(t *testing.T, what string, tp throughput, want float64) {
	t.Helper()
	for i, v := range tp.Intervals {
		if v < 0.9*want || v > 1.1*want {
			t.Errorf("%s: interval %d at %.2f Mbit/s is outside ±10%% of %.0f Mbit/s (%s)", what, i+1, v/1e6, want/1e6, tp)
		}
	}
	if tp.Average < 0.95*want || tp.Average > 1.05*want {
		t.Errorf("%s: average %.2f Mbit/s is outside ±5%% of %.0f Mbit/s (%s)", what, tp.Average/1e6, want/1e6, tp)
	}
}

// requirePing checks the latency bound under saturation: at least half the pings
// answered, every answer below maxMS.
func requirePing(t *testing.T, what string, rtts []float64, sent int, maxMS float64) {
	t.Helper()
	if len(rtts) < sent/2 {
		t.Errorf("%s: only %d of %d pings answered under load", what, len(rtts), sent)
	}
	for _, r := range rtts {
		if r >= maxMS {
			t.Errorf("%s: ping RTT %.1f ms under load, want < %.0f ms (all: %v)", what, r, maxMS, rtts)
			return
		}
	}
}
