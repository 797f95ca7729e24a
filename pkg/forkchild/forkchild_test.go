package forkchild

import "testing"

func TestRunnableFits(t *testing.T) {
	for _, tc := range []struct {
		loadavg string
		cpus    int
		want    bool
	}{
		{"0.52 0.58 0.59 1/467 12345\n", 2, true},
		{"0.52 0.58 0.59 2/467 12345\n", 2, true},
		{"7.10 3.00 1.00 3/467 12345\n", 2, false},
		{"7.10 3.00 1.00 40/900 12345\n", 8, false},
		{"garbage", 2, true},
		{"1 2 3 x/4 5", 2, true},
	} {
		if got := runnableFits(tc.loadavg, tc.cpus); got != tc.want {
			t.Errorf("runnableFits(%q, %d) = %v, want %v", tc.loadavg, tc.cpus, got, tc.want)
		}
	}
}
