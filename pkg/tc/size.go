// SPDX-License-Identifier: Apache-2.0

package tc

import (
	"fmt"
	"math/bits"
)

// The sizing rules turn a requested rate and burst into a TBF that delivers the rate,
// never lets a one-second window exceed it by much, and bounds queueing delay. They are
// documented, with the same numbers, in plugins/meta/bandwidth/README.md; change both
// together.
const (
	// MinRate and MaxRate bound an accepted rate in bit/s. 1 kbit/s is kubelet's own
	// lower bound for the bandwidth annotations; above 1 Tbit/s a request is a typo.
	MinRate = 1_000
	MaxRate = 1_000_000_000_000
	// MaxBurst is the largest accepted burst in bits: the reference plugin rejects
	// burst/8 >= 2^32-1, so 2^32-1 bits (containerd's "unset") and everything up to
	// this value are accepted and capped.
	MaxBurst = (1<<32-1)*8 - 1

	// CapWindow caps the bucket: at most 50 ms of traffic at the rate, so any one
	// second carries at most 5% more than the rate (half the 10% the issue allows,
	// leaving the other half to measurement and scheduling noise).
	CapWindow = 50 // ms
	// DefaultWindow is the bucket when the burst is missing or 0.
	DefaultWindow = 20 // ms
	// MinWindow is the smallest bucket in time: the qdisc watchdog can fire a few ms
	// late on a loaded node (CONFIG_HZ=250 is 4 ms a jiffy), and tokens beyond the
	// bucket are lost, so a smaller bucket would deliver less than the rate.
	MinWindow = 5 // ms
	// LatencyWindow is the queueing delay the TBF queue holds at most (above the
	// floor of MinQueuePackets largest packets).
	LatencyWindow = 20 // ms
	// MinQueuePackets is the queue floor in largest packets: fewer and TCP loses
	// whole windows at once.
	MinQueuePackets = 4
	// FrameOverhead is added to the MTU for the largest frame the qdisc sees:
	// an Ethernet header with one VLAN tag.
	FrameOverhead = 18
	// MaxGSOPacket is the largest packet the TBF passes whole at high rates; bigger
	// GSO packets (BIG TCP) are segmented by the TBF.
	MaxGSOPacket = 65536
)

// TBF is a token bucket filter in byte units, as planned. Rate and PeakRate are bytes
// per second; Burst, Limit and MaxPacket are bytes.
type TBF struct {
	Rate  uint64 // token rate
	Burst uint64 // bucket size
	Limit uint32 // bytes the queue holds at most
	// PeakRate and MaxPacket form TBF's second ("peak") bucket. podwire uses it only
	// to cap the largest packet the TBF passes unsegmented (the kernel's max_size is
	// min(Burst, MaxPacket)), so the queue can stay short even when the bucket is
	// large. SizeTBF always sets both; a zero PeakRate means no peak bucket.
	PeakRate  uint64
	MaxPacket uint32
}

// SizeTBF computes the TBF for a rate in bit/s and a burst in bits (0: derive one) on a
// device with the given MTU. It fails on a rate outside [MinRate, MaxRate], a burst
// above MaxBurst, or an MTU below 68; callers validate earlier and report config
// errors, so an error here is a bug in the caller.
//
// With R = rate/8 (bytes/s), F = MTU + FrameOverhead and ms(x) = R*x/1000:
//
//	L0        = ms(LatencyWindow)
//	MaxPacket = clamp(L0 / MinQueuePackets, F, MaxGSOPacket)
//	Limit     = max(L0, MinQueuePackets*MaxPacket)
//	Burst     = burst/8, or ms(DefaultWindow) when burst is 0
//	Burst     = max(min(Burst, ms(CapWindow)), ms(MinWindow), 2*MaxPacket)
//	PeakRate  = 2R (the peak bucket, MaxPacket deep, only caps the packet size)
func SizeTBF(rateBits, burstBits uint64, mtu int) (TBF, error) {
	if rateBits < MinRate || rateBits > MaxRate {
		return TBF{}, fmt.Errorf("rate %d bit/s is outside %d-%d", rateBits, uint64(MinRate), uint64(MaxRate))
	}
	if burstBits > MaxBurst {
		return TBF{}, fmt.Errorf("burst %d bits is above %d", burstBits, uint64(MaxBurst))
	}
	if mtu < 68 || mtu > 1<<20 {
		return TBF{}, fmt.Errorf("MTU %d is outside 68-%d", mtu, 1<<20)
	}
	r := rateBits / 8
	ms := func(x uint64) uint64 { return r * x / 1000 } // r <= 1.25e11: no overflow
	frame := uint64(mtu) + FrameOverhead

	l0 := ms(LatencyWindow)
	maxPkt := min(max(l0/MinQueuePackets, frame), max(MaxGSOPacket, frame))
	limit := max(l0, MinQueuePackets*maxPkt)

	burst := burstBits / 8
	if burst == 0 {
		burst = ms(DefaultWindow)
	}
	burst = max(min(burst, ms(CapWindow)), ms(MinWindow), 2*maxPkt)

	// burst >= 2*maxPkt, so the peak bucket is always what limits the packet size.
	return TBF{Rate: r, Burst: burst, Limit: uint32(min(limit, 1<<32-1)), PeakRate: peakRate(r), MaxPacket: uint32(maxPkt)}, nil
}

// peakRate is twice the rate, nudged when its low 32 bits are zero: the kernel only
// looks at the 64-bit peak rate when the 32-bit field is non-zero.
func peakRate(r uint64) uint64 {
	p := 2 * r
	if uint32(p) == 0 {
		p++
	}
	return p
}

// TickNS is the length of one psched tick, the unit of TBF's buffer: PSCHED_SHIFT is 6
// in every kernel since 2.6.31 (/proc/net/psched reads 000003e8 00000040).
const TickNS = 64

// BufferTicks is the time to send size bytes at rate bytes/s, in psched ticks, as the
// kernel's TCA_TBF_PARMS buffer field wants it (rounded down, capped at 2^32-1).
func BufferTicks(rate, size uint64) uint32 {
	if rate == 0 {
		return 1<<32 - 1
	}
	hi, lo := bits.Mul64(size, 1_000_000_000/TickNS) // size * 1e9 / 64 without overflow
	if hi >= rate {
		return 1<<32 - 1
	}
	q, _ := bits.Div64(hi, lo, rate)
	return uint32(min(q, 1<<32-1))
}

// KernelTBF is a TBF as the kernel stores and reports it, which is what CHECK
// compares: the bucket as a buffer time in psched ticks.
type KernelTBF struct {
	Rate     uint64 // bytes/s
	Buffer   uint32 // ticks
	Limit    uint32 // bytes
	PeakRate uint64 // bytes/s, 0: none
}

func (t TBF) Kernel() KernelTBF {
	return KernelTBF{Rate: t.Rate, Buffer: BufferTicks(t.Rate, t.Burst), Limit: t.Limit, PeakRate: t.PeakRate}
}

func (k KernelTBF) String() string {
	s := fmt.Sprintf("tbf rate %s burst %dB (buffer %d ticks) limit %dB", bitRate(k.Rate), burstOf(k), k.Buffer, k.Limit)
	if k.PeakRate != 0 {
		s += " peakrate " + bitRate(k.PeakRate)
	}
	return s
}

// burstOf recovers the bucket in bytes from the buffer time, for messages.
func burstOf(k KernelTBF) uint64 {
	hi, lo := bits.Mul64(uint64(k.Buffer)*TickNS, k.Rate)
	q, _ := bits.Div64(hi, lo, 1_000_000_000) // hi < 2^14: Buffer*64 < 2^38, Rate < 2^38
	return q
}

func (t TBF) String() string {
	s := fmt.Sprintf("tbf rate %s burst %dB limit %dB", bitRate(t.Rate), t.Burst, t.Limit)
	if t.PeakRate != 0 {
		s += fmt.Sprintf(" peakrate %s maxpacket %dB", bitRate(t.PeakRate), t.MaxPacket)
	}
	return s
}

// bitRate renders bytes/s as bit/s.
func bitRate(bytesPerSec uint64) string {
	return fmt.Sprintf("%dbit", bytesPerSec*8)
}
