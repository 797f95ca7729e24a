// SPDX-License-Identifier: Apache-2.0

package link

import (
	"testing"
)

func TestRandomMAC(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 100; i++ {
		m, err := RandomMAC()
		if err != nil {
			t.Fatal(err)
		}
		if len(m) != 6 || m[0]&1 != 0 || m[0]&2 == 0 {
			t.Fatalf("%s is not a locally administered unicast MAC", m)
		}
		seen[m.String()] = true
	}
	if len(seen) < 99 {
		t.Errorf("only %d distinct MACs in 100", len(seen))
	}
}

func TestSysctlPath(t *testing.T) {
	for in, want := range map[string]string{
		"net/ipv4/ip_forward":                "/proc/sys/net/ipv4/ip_forward",
		"/net/ipv6/conf/cni0.100/accept_ra":  "/proc/sys/net/ipv6/conf/cni0.100/accept_ra",
		"net/bridge/bridge-nf-call-iptables": "/proc/sys/net/bridge/bridge-nf-call-iptables",
	} {
		if got := sysctlPath(in); got != want {
			t.Errorf("sysctlPath(%q) = %q, want %q (interface names keep their dots)", in, got, want)
		}
	}
}
