// SPDX-License-Identifier: Apache-2.0

package tc

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/podwire/podwire/pkg/cniplumb"
)

const containerdBurst = 4294967295

func TestSizeTBFGolden(t *testing.T) {
	var b strings.Builder
	for _, c := range []struct {
		rate, burst uint64
		mtu         int
	}{
		{1_000, 0, 1500},
		{1_000_000, 0, 1500},
		{10_000_000, 0, 1500},
		{10_000_000, containerdBurst, 1500},
		{10_000_000, 1_000_000, 1500}, // 125 kB asked, above the 50 ms cap
		{10_000_000, 8_000, 1500},     // 1 kB asked, below the floor
		{100_000_000, 0, 1500},
		{100_000_000, containerdBurst, 1500},
		{100_000_000, 0, 9000},
		{1_000_000_000, 0, 1500},
		{10_000_000_000, containerdBurst, 1500},
		{40_000_000_000, 0, 1500}, // bytes/s above 2^32: TCA_TBF_RATE64
		{1_000_000_000_000, MaxBurst, 1500},
	} {
		tbf, err := SizeTBF(c.rate, c.burst, c.mtu)
		if err != nil {
			t.Fatalf("SizeTBF(%d, %d, %d): %v", c.rate, c.burst, c.mtu, err)
		}
		fmt.Fprintf(&b, "%d/%d/%d: %s buffer=%d\n", c.rate, c.burst, c.mtu, tbf, BufferTicks(tbf.Rate, tbf.Burst))
	}
	want := `1000/0/1500: tbf rate 1000bit burst 3036B limit 6072B peakrate 2000bit maxpacket 1518B buffer=379500000
1000000/0/1500: tbf rate 1000000bit burst 3036B limit 6072B peakrate 2000000bit maxpacket 1518B buffer=379500
10000000/0/1500: tbf rate 10000000bit burst 25000B limit 25000B peakrate 20000000bit maxpacket 6250B buffer=312500
10000000/4294967295/1500: tbf rate 10000000bit burst 62500B limit 25000B peakrate 20000000bit maxpacket 6250B buffer=781250
10000000/1000000/1500: tbf rate 10000000bit burst 62500B limit 25000B peakrate 20000000bit maxpacket 6250B buffer=781250
10000000/8000/1500: tbf rate 10000000bit burst 12500B limit 25000B peakrate 20000000bit maxpacket 6250B buffer=156250
100000000/0/1500: tbf rate 100000000bit burst 250000B limit 250000B peakrate 200000000bit maxpacket 62500B buffer=312500
100000000/4294967295/1500: tbf rate 100000000bit burst 625000B limit 250000B peakrate 200000000bit maxpacket 62500B buffer=781250
100000000/0/9000: tbf rate 100000000bit burst 250000B limit 250000B peakrate 200000000bit maxpacket 62500B buffer=312500
1000000000/0/1500: tbf rate 1000000000bit burst 2500000B limit 2500000B peakrate 2000000000bit maxpacket 65536B buffer=312500
10000000000/4294967295/1500: tbf rate 10000000000bit burst 62500000B limit 25000000B peakrate 20000000000bit maxpacket 65536B buffer=781250
40000000000/0/1500: tbf rate 40000000000bit burst 100000000B limit 100000000B peakrate 80000000000bit maxpacket 65536B buffer=312500
1000000000000/34359738359/1500: tbf rate 1000000000000bit burst 4294967294B limit 2500000000B peakrate 2000000000000bit maxpacket 65536B buffer=536870
`
	if d := cmp.Diff(want, b.String()); d != "" {
		t.Errorf("sizing changed; update README.md's table too (-want +got):\n%s", d)
	}
}

func TestSizeTBFErrors(t *testing.T) {
	for _, c := range []struct {
		rate, burst uint64
		mtu         int
		want        string
	}{
		{999, 0, 1500, "rate 999 bit/s is outside"},
		{MaxRate + 1, 0, 1500, "is outside"},
		{MinRate, MaxBurst + 1, 1500, "burst 34359738360 bits is above"},
		{MinRate, 0, 0, "MTU 0"},
	} {
		_, err := SizeTBF(c.rate, c.burst, c.mtu)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("SizeTBF(%d, %d, %d) = %v, want %q", c.rate, c.burst, c.mtu, err, c.want)
		}
	}
}

// TestSizeTBFProperties checks the promises of the README over random inputs: the bucket
// never lets a second carry more than 5% over the rate (where the floor of two largest
// packets allows it), the queue holds at most 20 ms (where the floor of four largest
// packets allows it), the queue always takes a largest packet, and the buffer fits.
func TestSizeTBFProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		rate := MinRate + r.Uint64N(MaxRate-MinRate+1)
		if r.IntN(2) == 0 { // favour realistic rates
			rate = MinRate + r.Uint64N(10_000_000_000)
		}
		burst := []uint64{0, containerdBurst, MaxBurst, r.Uint64N(MaxBurst + 1)}[r.IntN(4)]
		mtu := []int{1280, 1450, 1500, 9000}[r.IntN(4)]
		tbf, err := SizeTBF(rate, burst, mtu)
		if err != nil {
			t.Fatal(err)
		}
		frame := uint64(mtu + FrameOverhead)
		R := rate / 8
		if tbf.Burst > R*CapWindow/1000 && tbf.Burst > 2*max(frame, uint64(tbf.MaxPacket)) {
			t.Fatalf("rate %d burst %d: bucket %d B exceeds 50 ms of rate", rate, burst, tbf.Burst)
		}
		if tbf.Burst < R*MinWindow/1000 || tbf.Burst < 2*uint64(tbf.MaxPacket) {
			t.Fatalf("rate %d burst %d: bucket %d B below the floor", rate, burst, tbf.Burst)
		}
		if uint64(tbf.Limit) > R*LatencyWindow/1000 && uint64(tbf.Limit) > MinQueuePackets*uint64(tbf.MaxPacket) {
			t.Fatalf("rate %d: limit %d B holds more than 20 ms", rate, tbf.Limit)
		}
		if uint64(tbf.Limit) < MinQueuePackets*uint64(tbf.MaxPacket) || uint64(tbf.MaxPacket) < frame {
			t.Fatalf("rate %d: limit %d B or max packet %d B too small for MTU %d", rate, tbf.Limit, tbf.MaxPacket, mtu)
		}
		if b := BufferTicks(tbf.Rate, tbf.Burst); b == 1<<32-1 || b == 0 {
			t.Fatalf("rate %d: buffer %d ticks out of range", rate, b)
		}
		if tbf.PeakRate <= tbf.Rate || uint32(tbf.PeakRate) == 0 {
			t.Fatalf("rate %d: peak rate %d unusable", rate, tbf.PeakRate)
		}
	}
}

func TestBufferTicks(t *testing.T) {
	for _, c := range []struct {
		rate, size uint64
		want       uint32
	}{
		{1_250_000, 25_000, 312_500}, // 20 ms at 10 Mbit/s, 64 ns a tick
		{1, 1, 15_625_000},           // 1 s
		{1, 1 << 40, 1<<32 - 1},      // capped
		{0, 100, 1<<32 - 1},
		{125_000_000_000, 6_250_000_000, 781_250}, // 50 ms at 1 Tbit/s
	} {
		if got := BufferTicks(c.rate, c.size); got != c.want {
			t.Errorf("BufferTicks(%d, %d) = %d, want %d", c.rate, c.size, got, c.want)
		}
	}
	k := KernelTBF{Rate: 1_250_000, Buffer: 312_500}
	if got := burstOf(k); got != 25_000 {
		t.Errorf("burstOf = %d, want 25000", got)
	}
}

func TestOwnerOfAlias(t *testing.T) {
	o := cniplumb.Owner{Network: "net", ContainerID: "c1", IfName: "eth0"}
	got, ok := OwnerOfAlias(AliasFor(o, "veth1"))
	if !ok || got != o {
		t.Errorf("OwnerOfAlias(AliasFor(%v)) = %v %v", o, got, ok)
	}
	if _, ok := OwnerOfAlias("someone else's"); ok {
		t.Error("a foreign alias has an owner")
	}
}
