package integration

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/podwire/podwire/integration/nstest"
)

// throughput is one iperf3 run as the receiving side saw it, in bit/s on the wire:
// iperf3 counts TCP payload, the TBF whole Ethernet frames, so each full-size segment
// of MSS payload bytes is MSS+66 bytes on the veth (Ethernet 14, IPv4 20, TCP 20,
// timestamps 12). At MTU 1500 payload is 95.6% of the wire rate.
type throughput struct {
	Intervals []float64 // wire bit/s of each full 1-second interval, first included
	Average   float64   // wire bit/s over the whole run
	Goodput   float64   // payload bit/s over the whole run, as iperf3 prints it
}

// frameOverhead is the bytes each full-size IPv4 TCP segment adds to its payload on
// the veth.
const frameOverhead = 14 + 20 + 20 + 12

func (tp throughput) String() string {
	var iv []string
	for _, v := range tp.Intervals {
		iv = append(iv, fmt.Sprintf("%.2f", v/1e6))
	}
	return fmt.Sprintf("wire intervals [%s] Mbit/s, wire average %.2f Mbit/s (iperf3 goodput %.2f)", strings.Join(iv, " "), tp.Average/1e6, tp.Goodput/1e6)
}

type iperfJSON struct {
	Start struct {
		TCPMSSDefault float64 `json:"tcp_mss_default"`
	} `json:"start"`
	Intervals []struct {
		Sum struct {
			Seconds       float64 `json:"seconds"`
			BitsPerSecond float64 `json:"bits_per_second"`
		} `json:"sum"`
	} `json:"intervals"`
	End struct {
		SumReceived struct {
			BitsPerSecond float64 `json:"bits_per_second"`
		} `json:"sum_received"`
	} `json:"end"`
	Error            string     `json:"error"`
	ServerOutputJSON *iperfJSON `json:"server_output_json"`
}

// iperf runs an iperf3 TCP test of secs seconds between a client in client and a
// server in server (reachable at serverIP). With reverse the server sends; either way
// the intervals are the receiver's, which is what the shaper controls.
func iperf(t *testing.T, h *nstest.H, client, server ns.NetNS, serverIP string, reverse bool, secs int) throughput {
	t.Helper()
	port := "5201"
	srv := h.Start(server, "iperf3", "-s", "-1", "-J", "-p", port, "-B", serverIP)
	defer func() { _ = srv.Process.Kill() }()
	// CUBIC, the default on most nodes, fills the shaper's queue (BBR keeps it nearly
	// empty), so it is the worst case for the latency bound.
	args := []string{"-c", serverIP, "-p", port, "-t", strconv.Itoa(secs), "-i", "1", "-J", "--get-server-output", "-C", "cubic"}
	if reverse {
		args = append(args, "-R")
	}
	var out string
	var err error
	for try := 0; try < 50; try++ { // until the server listens
		out, err = nstest.RunIn(client, "iperf3", args...)
		if !strings.Contains(out, "unable to connect") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	var res iperfJSON
	if jerr := json.Unmarshal([]byte(out), &res); jerr != nil {
		t.Fatalf("iperf3 %v: %v, output not JSON (%v):\n%s", args, err, jerr, out)
	}
	if res.Error != "" || err != nil {
		t.Fatalf("iperf3 %v: %v %s", args, err, res.Error)
	}
	recv := &res
	if !reverse {
		if res.ServerOutputJSON == nil {
			t.Fatalf("iperf3 gave no server output:\n%s", out)
		}
		recv = res.ServerOutputJSON
	}
	mss := res.Start.TCPMSSDefault
	if mss < 500 {
		t.Fatalf("iperf3 reported MSS %v", mss)
	}
	wire := (mss + frameOverhead) / mss
	var tp throughput
	for _, iv := range recv.Intervals {
		if iv.Sum.Seconds >= 0.5 { // a last sliver of an interval says nothing
			tp.Intervals = append(tp.Intervals, iv.Sum.BitsPerSecond*wire)
		}
	}
	tp.Goodput = res.End.SumReceived.BitsPerSecond
	tp.Average = tp.Goodput * wire
	if len(tp.Intervals) < secs-1 {
		t.Fatalf("iperf3 reported %d intervals for %d s:\n%s", len(tp.Intervals), secs, out)
	}
	return tp
}

var pingTime = regexp.MustCompile(`time=([0-9.]+) ms`)

// pingDuring pings addr from n every 200 ms while f runs (starting after 1 s, when
// the link is saturated) and returns the round-trip times in ms.
func pingDuring(t *testing.T, n ns.NetNS, addr string, count int, f func()) (rtts []float64, sent int) {
	t.Helper()
	var wg sync.WaitGroup
	var out []byte
	wg.Add(1)
	go func() {
		defer wg.Done()
		time.Sleep(time.Second)
		out, _ = exec.Command("nsenter", "--net="+n.Path(), "ping", "-n", "-c", strconv.Itoa(count), "-i", "0.2", "-W", "1", addr).CombinedOutput()
	}()
	f()
	wg.Wait()
	for _, m := range pingTime.FindAllStringSubmatch(string(out), -1) {
		v, _ := strconv.ParseFloat(m[1], 64)
		rtts = append(rtts, v)
	}
	return rtts, count
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
