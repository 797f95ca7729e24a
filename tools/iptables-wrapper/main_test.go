// SPDX-License-Identifier: Apache-2.0

package main

import "testing"

func TestDetect(t *testing.T) {
	rules := func(n int) string {
		s := "*nat\n:PREROUTING ACCEPT [0:0]\n"
		for i := 0; i < n; i++ {
			s += "-A PREROUTING -j ACCEPT\n"
		}
		return s + "COMMIT\n"
	}
	for _, c := range []struct {
		name        string
		nft, legacy string // iptables-save of each mode (all tables)
		nftM, legM  string // iptables-save -t mangle of each mode
		want        string
	}{
		{name: "empty host: nft", want: "nft"},
		{name: "more legacy rules", nft: rules(1), legacy: rules(3), want: "legacy"},
		{name: "more nft rules", nft: rules(3), legacy: rules(1), want: "nft"},
		{name: "equal: nft", nft: rules(2), legacy: rules(2), want: "nft"},
		{name: "kube-proxy's hint in legacy wins over rule counts", nft: rules(9), legM: "*mangle\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n", want: "legacy"},
		{name: "kubelet's canary in nft", legacy: rules(9), nftM: "*mangle\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT\n", want: "nft"},
	} {
		got := detect(func(mode, tool string, args ...string) string {
			if tool != "iptables-save" {
				return ""
			}
			mangle := len(args) == 2 && args[1] == "mangle"
			switch {
			case mode == "nft" && mangle:
				return c.nftM
			case mode == "legacy" && mangle:
				return c.legM
			case mode == "nft":
				return c.nft
			}
			return c.legacy
		})
		if got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
}
