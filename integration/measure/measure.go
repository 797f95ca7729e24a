// SPDX-License-Identifier: Apache-2.0

// Package measure runs traffic measurements between network namespaces: iperf3
// throughput as the receiver saw it, on the wire, and ping round trips while a load
// runs. Integration tests use it to assert shaping accuracy; `make bench` uses it to
// report it. It asserts nothing itself: errors are returned.
package measure

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// Throughput is one iperf3 run as the receiving side saw it, in bit/s on the wire:
// iperf3 counts TCP payload, a TBF whole Ethernet frames, so each full-size segment of
// MSS payload bytes is MSS+FrameOverhead bytes on the veth. At MTU 1500 payload is
// 95.6% of the wire rate.
type Throughput struct {
	Intervals []float64 // wire bit/s of each full 1-second interval, first included
	Average   float64   // wire bit/s over the whole run
	Goodput   float64   // payload bit/s over the whole run, as iperf3 prints it
}

// FrameOverhead is the bytes each full-size IPv4 TCP segment adds to its payload on a
// veth: Ethernet 14, IPv4 20, TCP 20, timestamps 12.
const FrameOverhead = 14 + 20 + 20 + 12

func (tp Throughput) String() string {
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

// IPerf runs an iperf3 TCP test of secs seconds between a client in netns client and a
// one-shot server it starts in netns server, listening on serverIP. With reverse the
// server sends; either way the intervals are the receiver's, which is what a shaper
// controls. The congestion control is CUBIC, the default on most nodes: it fills a
// shaper's queue (BBR keeps it nearly empty), so it is the worst case for latency.
func IPerf(client, server ns.NetNS, serverIP string, reverse bool, secs int) (Throughput, error) {
	const port = "5201"
	srv := exec.Command("nsenter", "--net="+server.Path(), "iperf3", "-s", "-1", "-J", "-p", port, "-B", serverIP)
	if err := srv.Start(); err != nil {
		return Throughput{}, fmt.Errorf("starting the iperf3 server in %s: %w", server.Path(), err)
	}
	defer func() {
		_ = srv.Process.Kill()
		_ = srv.Wait()
	}()
	args := []string{"-c", serverIP, "-p", port, "-t", strconv.Itoa(secs), "-i", "1", "-J", "--get-server-output", "-C", "cubic"}
	if reverse {
		args = append(args, "-R")
	}
	var out []byte
	var err error
	for try := 0; try < 50; try++ { // until the server listens
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(secs+30)*time.Second)
		out, err = exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + client.Path(), "iperf3"}, args...)...).CombinedOutput()
		cancel()
		if !strings.Contains(string(out), "unable to connect") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	var res iperfJSON
	if jerr := json.Unmarshal(out, &res); jerr != nil {
		return Throughput{}, fmt.Errorf("iperf3 %v: %v, output not JSON (%v):\n%s", args, err, jerr, out)
	}
	if res.Error != "" || err != nil {
		return Throughput{}, fmt.Errorf("iperf3 %v: %v %s", args, err, res.Error)
	}
	recv := &res
	if !reverse {
		if res.ServerOutputJSON == nil {
			return Throughput{}, fmt.Errorf("iperf3 gave no server output:\n%s", out)
		}
		recv = res.ServerOutputJSON
	}
	mss := res.Start.TCPMSSDefault
	if mss < 500 {
		return Throughput{}, fmt.Errorf("iperf3 reported MSS %v", mss)
	}
	wire := (mss + FrameOverhead) / mss
	var tp Throughput
	for _, iv := range recv.Intervals {
		if iv.Sum.Seconds >= 0.5 { // a last sliver of an interval says nothing
			tp.Intervals = append(tp.Intervals, iv.Sum.BitsPerSecond*wire)
		}
	}
	tp.Goodput = res.End.SumReceived.BitsPerSecond
	tp.Average = tp.Goodput * wire
	if len(tp.Intervals) < secs-1 {
		return tp, fmt.Errorf("iperf3 reported %d intervals for %d s:\n%s", len(tp.Intervals), secs, out)
	}
	return tp, nil
}

var pingTime = regexp.MustCompile(`time=([0-9.]+) ms`)

// PingDuring pings addr from netns n every 200 ms while f runs (starting after 1 s, when
// the link is saturated) and returns the round-trip times in ms of the answered pings
// and how many were sent.
func PingDuring(n ns.NetNS, addr string, count int, f func()) (rtts []float64, sent int) {
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
