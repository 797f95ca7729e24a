// SPDX-License-Identifier: Apache-2.0

package usage

import (
	"net/netip"
	"testing"
)

func TestCount(t *testing.T) {
	leases := map[string]bool{"10.244.1.2": true, "10.244.1.3": true, "fd00::5": true, "10.9.9.9": true}
	got := Count([]netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00::/120"),
		netip.MustParsePrefix("fd01::/64"), netip.MustParsePrefix("10.0.0.0/31")}, leases)
	want := []Range{{"10.244.1.0/24", 2, 251}, {"fd00::/120", 1, 253}, {"fd01::/64", 0, 1 << 62}, {"10.0.0.0/31", 0, 0}}
	if len(got) != len(want) {
		t.Fatalf("%v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("range %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	if a := Annotation(got[:2]); a != `{"10.244.1.0/24":251,"fd00::/120":253}` {
		t.Errorf("annotation %s", a)
	}
}
