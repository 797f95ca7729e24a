// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/podwire/podwire/integration/measure"
	"github.com/podwire/podwire/integration/nstest"
)

const shapingConf = `{"cniVersion":"1.1.0","name":"@NAME@","plugins":[
 {"type":"bridge","bridge":"@PREFIX@br","isGateway":true,
  "ipam":{"type":"host-local","ranges":[[{"subnet":"10.94.0.0/24"}]],"dataDir":"@DATADIR@"}},
 {"type":"bandwidth","capabilities":{"bandwidth":true}}]}`

func benchShaping(e *env, t *testing.T) {
	tbl := e.rep.section("6. Shaping accuracy",
		"set", "rate", "direction", "first second", "worst second", "average", "every second (Mbit/s)", "ping RTT under load ms (median / max, answered)")
	tbl.intro = "bridge + host-local + bandwidth with containerd's burst (4294967295 bits) for both directions. iperf3 (TCP, " +
		"CUBIC) between the shaped pod and an unshaped pod on the same bridge, 1-second intervals as the receiver saw them, " +
		"converted to the wire rate the shaper enforces (payload + 66 bytes of headers per segment); pings from the " +
		"unshaped pod to the shaped one every 200 ms while the link is saturated. Percentages are off the configured rate. " +
		"The floor does no shaping and has no column here."
	rates := []uint64{10_000_000, 100_000_000}
	secs := 4
	if e.quick {
		rates, secs = rates[:1], 3
		tbl.note("bench-quick measures 10 Mbit/s only, 3-second runs")
	}
	runners := available(tbl, []*runner{e.base[e.ref.Name], e.base[e.ours.Name]}, "bridge", "host-local", "bandwidth")
	type world struct {
		h      *nstest.H
		peer   ns.NetNS
		peerIP string
		sh     *runner
		list   *libcni.NetworkConfigList
	}
	worlds := map[*runner]*world{}
	quality := map[*set]*shapeQuality{}
	for _, r := range runners {
		h := nstest.New(t)
		w := &world{h: h, peer: h.NewPod()}
		w.sh = &runner{label: r.label, set: r.set, h: h, pod: w.peer}
		var err error
		w.list, err = e.conflist(w.sh, "bench", shapingConf)
		must(t, err, "conflist")
		res, err := e.add(w.sh, w.list, rtFor(w.sh, "shaping-peer", "eth0", nil))
		must(t, err, "%s: ADD of the unshaped peer", r.label)
		w.peerIP = res.IPs[0].Address.IP.String()
		worlds[r] = w
	}
	for k, rate := range rates {
		for j := range runners {
			r := runners[(k+j)%len(runners)]
			w := worlds[r]
			pod := &runner{label: r.label, set: r.set, h: w.h, pod: w.h.NewPod()}
			list, err := e.conflist(pod, "bench", shapingConf)
			must(t, err, "conflist")
			rt := rtFor(pod, fmt.Sprintf("shaping-%d", rate), "eth0", map[string]any{"bandwidth": map[string]any{
				"ingressRate": rate, "ingressBurst": containerdBurst, "egressRate": rate, "egressBurst": containerdBurst}})
			res, err := e.add(pod, list, rt)
			if err != nil {
				t.Errorf("%s: ADD of the shaped pod at %d bit/s: %v", r.label, rate, err)
				tbl.note("%s: ADD of the shaped pod failed: %s", r.label, oneLine(err))
				continue
			}
			podIP := res.IPs[0].Address.IP.String()
			for _, dir := range []struct {
				name    string
				reverse bool
			}{{"into the pod", true}, {"out of the pod", false}} {
				var tp measure.Throughput
				var ierr error
				rtts, sent := measure.PingDuring(w.peer, podIP, 10, func() {
					tp, ierr = measure.IPerf(pod.pod, w.peer, w.peerIP, dir.reverse, secs)
				})
				if ierr != nil {
					t.Errorf("%s %s at %d bit/s: %v", r.label, dir.name, rate, ierr)
					tbl.note("%s %s at %d Mbit/s: iperf3 failed: %s", r.label, dir.name, rate/1e6, oneLine(ierr))
					continue
				}
				t.Logf("%s %s at %d Mbit/s: %s; ping %v", r.label, dir.name, rate/1_000_000, tp, rtts)
				tbl.row(shapingRow(r.label, float64(rate), dir.name, tp, rtts, sent)...)
				q := quality[r.set]
				if q == nil {
					q = &shapeQuality{}
					quality[r.set] = q
				}
				q.add(float64(rate), tp, rtts, sent)
			}
			if err := e.del(pod, list, rt); err != nil {
				t.Errorf("%s: DEL of the shaped pod: %v", r.label, err)
			}
		}
	}
	for _, w := range worlds {
		if err := e.del(w.sh, w.list, rtFor(w.sh, "shaping-peer", "eth0", nil)); err != nil {
			t.Errorf("%s: DEL of the unshaped peer: %v", w.sh.label, err)
		}
	}
	qo, qr := quality[e.ours], quality[e.ref]
	var okRate, okRTT *bool
	if qo != nil && qo.runs > 0 {
		okRate, okRTT = boolp(qo.worstOff <= 0.10), boolp(qo.maxRTT < 30 && qo.lost == 0)
	}
	e.target("shaping-rate", qo.offString(), qr.offString(), okRate)
	e.target("shaping-rtt", qo.rttString(), qr.rttString(), okRTT)
	sort.SliceStable(tbl.rows, func(i, j int) bool { return tbl.rows[i][0]+tbl.rows[i][1] < tbl.rows[j][0]+tbl.rows[j][1] })
}

func shapingRow(label string, rate float64, dir string, tp measure.Throughput, rtts []float64, sent int) []string {
	off := func(v float64) string { return fmt.Sprintf("%+.0f%%", (v/rate-1)*100) }
	mbit := func(v float64) string { return fmt.Sprintf("%.1f Mbit/s (%s)", v/1e6, off(v)) }
	worst := tp.Intervals[0]
	var every []string
	for _, v := range tp.Intervals {
		if math.Abs(v-rate) > math.Abs(worst-rate) {
			worst = v
		}
		every = append(every, fmt.Sprintf("%.1f", v/1e6))
	}
	ping := "none answered"
	if len(rtts) > 0 {
		s := append([]float64(nil), rtts...)
		sort.Float64s(s)
		ping = fmt.Sprintf("%.1f / %.1f (%d/%d)", s[len(s)/2], s[len(s)-1], len(s), sent)
	}
	return []string{label, fmt.Sprintf("%.0f Mbit/s", rate/1e6), dir, mbit(tp.Intervals[0]), mbit(worst),
		mbit(tp.Average), strings.Join(every, ", "), ping}
}

// add runs ADD for runner r outside any timing and returns the result as 1.x.
func (e *env) add(r *runner, list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) (*current.Result, error) {
	c := e.cni(r.set)
	var res *current.Result
	err := r.h.InHost(func() error {
		out, err := c.AddNetworkList(ctxBG(), list, rt)
		if err != nil {
			return err
		}
		res, err = current.NewResultFromResult(out)
		return err
	})
	if err == nil && len(res.IPs) == 0 {
		err = fmt.Errorf("ADD returned no address")
	}
	return res, err
}

// del runs DEL for runner r outside any timing.
func (e *env) del(r *runner, list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) error {
	c := e.cni(r.set)
	return r.h.InHost(func() error { return c.DelNetworkList(ctxBG(), list, rt) })
}

// shapeQuality is the worst of a set's shaping runs.
type shapeQuality struct {
	runs     int
	worstOff float64 // largest |interval/rate - 1|
	maxRTT   float64 // ms
	lost     int     // pings not answered
}

func (q *shapeQuality) add(rate float64, tp measure.Throughput, rtts []float64, sent int) {
	q.runs++
	for _, v := range tp.Intervals {
		q.worstOff = math.Max(q.worstOff, math.Abs(v/rate-1))
	}
	for _, r := range rtts {
		q.maxRTT = math.Max(q.maxRTT, r)
	}
	q.lost += sent - len(rtts)
}

func (q *shapeQuality) offString() string {
	if q == nil || q.runs == 0 {
		return "n/a"
	}
	return fmt.Sprintf("worst %.0f%% off", q.worstOff*100)
}

func (q *shapeQuality) rttString() string {
	if q == nil || q.runs == 0 {
		return "n/a"
	}
	s := fmt.Sprintf("max %.0f ms", q.maxRTT)
	if q.lost > 0 {
		s += fmt.Sprintf(", %d pings unanswered", q.lost)
	}
	return s
}
