package forkchild

import (
	"testing"
	"unsafe"
)

func TestOthersFit(t *testing.T) {
	for _, tc := range []struct {
		loadavg   string
		own, cpus int
		want      bool
	}{
		{"0.52 0.58 0.59 1/467 12345\n", 1, 2, true},
		{"0.52 0.58 0.59 3/467 12345\n", 2, 2, true},
		{"0.52 0.58 0.59 4/467 12345\n", 3, 2, true},
		{"7.10 3.00 1.00 3/467 12345\n", 1, 2, false},
		{"7.10 3.00 1.00 40/900 12345\n", 2, 8, false},
		{"garbage", 1, 2, true},
		{"1 2 3 x/4 5", 1, 2, true},
	} {
		if got := othersFit(tc.loadavg, tc.own, tc.cpus); got != tc.want {
			t.Errorf("othersFit(%q, %d, %d) = %v, want %v", tc.loadavg, tc.own, tc.cpus, got, tc.want)
		}
	}
}

// This test process itself runs: at least one thread, the caller.
func TestOwnRunning(t *testing.T) {
	if n := ownRunning(); n < 1 {
		t.Errorf("ownRunning() = %d", n)
	}
}

// clonevm_linux_amd64.s reads vmProg at these offsets.
func TestVMProgLayout(t *testing.T) {
	var p vmProg
	for name, got := range map[string]uintptr{
		"n": unsafe.Offsetof(p.n), "ranges": unsafe.Offsetof(p.ranges), "writeFD": unsafe.Offsetof(p.writeFD),
		"wp": unsafe.Offsetof(p.wp), "wn": unsafe.Offsetof(p.wn), "readFD": unsafe.Offsetof(p.readFD), "rp": unsafe.Offsetof(p.rp),
	} {
		want := map[string]uintptr{"n": 0, "ranges": 8, "writeFD": 264, "wp": 272, "wn": 280, "readFD": 288, "rp": 296}[name]
		if got != want {
			t.Errorf("vmProg.%s at offset %d, clonevm_linux_amd64.s reads %d", name, got, want)
		}
	}
}
