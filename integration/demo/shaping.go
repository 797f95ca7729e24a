// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// How the throughput step judges shaping. The kernel's TBF does the shaping whatever
// the CPUs are doing, so the demo judges it from the TBF's own counters over the whole
// window, after a warm-up that empties the token bucket, rather than from what a
// receiver on a busy machine happened to read in each second (a reader scheduled late
// moves bytes from one second to the next: 8.65 Mbit/s one second, 11.3 the next).
const (
	warmUp      = time.Second
	window      = 4 * time.Second
	sampleEvery = 250 * time.Millisecond
	tolerance   = 0.10 // the TBF's own rate over the window, against the limit
	// unshapedAt is the receiver's goodput over the window, as a multiple of the limit,
	// from which the pod is not shaped whatever the qdisc counters say (traffic that
	// bypasses the TBF). Wide, because a late reader shifts bytes across the window's
	// edges; an unshaped veth runs at a hundred times the limit.
	unshapedAt = 1.5
	// busyBelow: when the TBF held packets back in fewer than this fraction of the
	// sample intervals, the sender did not keep it busy and a low rate says nothing
	// about the shaping; the measurement is repeated (attempts times).
	busyBelow = 0.5
	attempts  = 3
)

// flow is one shaping measurement: what the TBF on Link counted and what the receiver
// got, over the window after the warm-up.
type flow struct {
	Limit     float64   // bit/s the pod was given
	Link      string    // the link whose root TBF shapes this direction ("" when none)
	TBFRate   float64   // bit/s the TBF is configured with (0: no TBF found)
	Sent      float64   // bit/s the TBF sent over the window, from its byte counter
	PerSecond []float64 // bit/s the TBF sent in each second of the window
	Drops     uint32    // packets the TBF dropped over the window
	Throttled float64   // fraction of sample intervals in which the TBF held packets back
	Goodput   float64   // TCP payload bit/s the receiver got over the window
}

// verdict is the shaping judgement of f: nil when the pod was shaped to its limit;
// errInconclusive (wrapped) when the machine was too busy to tell; otherwise why not.
func verdict(f flow) error {
	lim := f.Limit / 1e6
	switch {
	case f.Goodput > f.Limit*unshapedAt:
		return fmt.Errorf("not shaped: the receiver got %.1f Mbit/s over %s against the pod's %.0f Mbit/s", f.Goodput/1e6, window, lim)
	case f.TBFRate == 0:
		return fmt.Errorf("not shaped: no TBF qdisc shapes this direction (link %q), and the receiver got %.1f Mbit/s", f.Link, f.Goodput/1e6)
	case f.Sent > f.Limit*(1+tolerance):
		return fmt.Errorf("not shaped to the limit: the TBF on %s sent %.2f Mbit/s over %s, above %.0f Mbit/s +%.0f%%", f.Link, f.Sent/1e6, window, lim, tolerance*100)
	case f.Sent < f.Limit*(1-tolerance) && f.Throttled >= busyBelow:
		return fmt.Errorf("shaped below the limit: the TBF on %s held packets back in %.0f%% of the intervals yet sent only %.2f Mbit/s, below %.0f Mbit/s -%.0f%%", f.Link, f.Throttled*100, f.Sent/1e6, lim, tolerance*100)
	case f.Sent < f.Limit*(1-tolerance):
		return fmt.Errorf("%w: the TBF on %s sent %.2f Mbit/s but held packets back in only %.0f%% of the intervals, so the sender (not the shaper) was short of CPU", errInconclusive, f.Link, f.Sent/1e6, f.Throttled*100)
	}
	return nil
}

var errInconclusive = errors.New("inconclusive")

func (f flow) String() string {
	var s []string
	for _, v := range f.PerSecond {
		s = append(s, fmt.Sprintf("%.2f", v/1e6))
	}
	if f.TBFRate == 0 {
		return fmt.Sprintf("no TBF qdisc (link %q): receiver goodput %.2f Mbit/s over %s", f.Link, f.Goodput/1e6, window)
	}
	tbf := fmt.Sprintf("TBF %.0f Mbit/s on %s", f.TBFRate/1e6, f.Link)
	return fmt.Sprintf("%s: sent %.2f Mbit/s over %s (per second %s; %d drops; held back in %.0f%% of %s intervals); receiver goodput %.2f Mbit/s",
		tbf, f.Sent/1e6, window, strings.Join(s, " "), f.Drops, f.Throttled*100, sampleEvery, f.Goodput/1e6)
}

// shapeDirection measures the flow from src to a receiver at addr:5201 in dst, shaped
// by the root TBF of link in the node netns, and judges it; an inconclusive
// measurement is repeated.
func (d *demo) shapeDirection(ctx context.Context, label string, src, dst ns.NetNS, addr, link string, limit float64) error {
	var err error
	for i := 1; i <= attempts; i++ {
		var f flow
		f, err = d.measureShaped(ctx, src, dst, addr, link, limit)
		if err != nil {
			return err
		}
		say("%s %s", label, f)
		if err = verdict(f); err == nil || !errors.Is(err, errInconclusive) {
			return err
		}
		say("%s attempt %d of %d %v; measuring again", label, i, attempts, err)
	}
	return fmt.Errorf("%w; the machine stayed too busy in %d attempts: run the demo again when it is quieter", err, attempts)
}

// tbfSample is a root TBF's counters at one moment.
type tbfSample struct {
	at         time.Time
	bytes      uint64
	drops      uint32
	overlimits uint32
}

// rootTBF returns the root TBF on link in the node netns and its counters; rate 0
// when the link has no root TBF.
func rootTBF(h *netlink.Handle, link string) (rate float64, s tbfSample, err error) {
	if link == "" {
		return 0, tbfSample{at: time.Now()}, nil
	}
	l, err := h.LinkByName(link)
	if err != nil {
		return 0, s, fmt.Errorf("looking up %s in the node: %w", link, err)
	}
	var qs []netlink.Qdisc
	for i := 0; ; i++ {
		qs, err = h.QdiscList(l)
		if !errors.Is(err, netlink.ErrDumpInterrupted) || i == 5 {
			break
		}
	}
	s.at = time.Now()
	if err != nil {
		return 0, s, fmt.Errorf("listing qdiscs on %s: %w", link, err)
	}
	for _, q := range qs {
		t, ok := q.(*netlink.Tbf)
		if !ok || q.Attrs().Parent != netlink.HANDLE_ROOT {
			continue
		}
		if st := q.Attrs().Statistics; st != nil && st.Basic != nil && st.Queue != nil {
			s.bytes, s.drops, s.overlimits = st.Basic.Bytes, st.Queue.Drops, st.Queue.Overlimits
		}
		return float64(t.Rate) * 8, s, nil
	}
	return 0, s, nil
}

// measureShaped streams TCP from src to dst for warmUp+window, sampling the TBF on
// link (in the node netns) every sampleEvery during the window.
func (d *demo) measureShaped(ctx context.Context, src, dst ns.NetNS, addr, link string, limit float64) (flow, error) {
	f := flow{Limit: limit, Link: link}
	nh, err := netns.GetFromPath(d.node.Path())
	if err != nil {
		return f, fmt.Errorf("opening the node netns: %w", err)
	}
	defer nh.Close()
	h, err := netlink.NewHandleAt(nh)
	if err != nil {
		return f, fmt.Errorf("netlink in the node netns: %w", err)
	}
	defer h.Close()

	var l net.Listener
	err = dst.Do(func(ns.NetNS) error {
		l, err = net.Listen("tcp", net.JoinHostPort(addr, "5201"))
		return err
	})
	if err != nil {
		return f, fmt.Errorf("receiver: %w", err)
	}
	defer l.Close()
	var received atomic.Int64
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			received.Add(int64(n))
			if err != nil {
				return // the sender closed the connection
			}
		}
	}()
	conn, err := dialIn(src)(ctx, "tcp", net.JoinHostPort(addr, "5201"))
	if err != nil {
		return f, fmt.Errorf("sender: %w", err)
	}
	defer conn.Close()
	go func() {
		buf := make([]byte, 64<<10)
		_ = conn.SetWriteDeadline(time.Now().Add(warmUp + window + 5*time.Second))
		for {
			if _, err := conn.Write(buf); err != nil {
				return
			}
		}
	}()

	select {
	case <-time.After(warmUp):
	case <-ctx.Done():
		return f, ctx.Err()
	}
	rate, first, err := rootTBF(h, link)
	if err != nil {
		return f, err
	}
	f.TBFRate = rate
	r0, t0 := received.Load(), time.Now()
	samples := []tbfSample{first}
	throttled := 0
	for time.Since(first.at) < window {
		select {
		case <-time.After(sampleEvery):
		case <-ctx.Done():
			return f, ctx.Err()
		}
		_, s, err := rootTBF(h, link)
		if err != nil {
			return f, err
		}
		if s.overlimits != samples[len(samples)-1].overlimits {
			throttled++
		}
		samples = append(samples, s)
	}
	r1, t1 := received.Load(), time.Now()
	conn.Close()
	last := samples[len(samples)-1]
	f.Goodput = float64(r1-r0) * 8 / t1.Sub(t0).Seconds()
	if rate == 0 {
		return f, nil
	}
	f.Sent = float64(last.bytes-first.bytes) * 8 / last.at.Sub(first.at).Seconds()
	f.Drops = last.drops - first.drops
	f.Throttled = float64(throttled) / float64(len(samples)-1)
	// Per second of the window: from each sample to the first one a second later (the
	// samples' own times, as sampling runs late on a busy machine).
	a := samples[0]
	for _, b := range samples[1:] {
		if b.at.Sub(a.at) >= time.Second-sampleEvery/2 {
			f.PerSecond = append(f.PerSecond, float64(b.bytes-a.bytes)*8/b.at.Sub(a.at).Seconds())
			a = b
		}
	}
	return f, nil
}

// shapers returns pod B's host veth (its root TBF shapes traffic to the pod) and its
// IFB (whose root TBF shapes traffic from the pod), from ADD's result; "" for one
// that does not exist.
func (d *demo) shapers() (veth, ifb string, err error) {
	err = d.inNode(func() error {
		for _, i := range d.b.res.Interfaces {
			if i.Sandbox != "" {
				continue
			}
			l, err := netlink.LinkByName(i.Name)
			if err != nil {
				return fmt.Errorf("interface %s of pod-b's result: %w", i.Name, err)
			}
			switch l.Type() {
			case "veth":
				veth = i.Name
			case "ifb":
				ifb = i.Name
			}
		}
		return nil
	})
	if err == nil && veth == "" {
		err = fmt.Errorf("pod-b's ADD result names no host veth: %v", d.b.res.Interfaces)
	}
	return veth, ifb, err
}
