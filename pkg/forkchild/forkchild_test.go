package forkchild

import "testing"

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
