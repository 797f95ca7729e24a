package netfilter

import "testing"

func TestModeOfBinary(t *testing.T) {
	for path, want := range map[string]xtablesMode{
		"/usr/sbin/xtables-nft-multi":    xtNFT,
		"/usr/sbin/iptables-nft":         xtNFT,
		"/usr/sbin/xtables-legacy-multi": xtLegacy,
		"/sbin/iptables-legacy":          xtLegacy,
		"/usr/sbin/iptables":             xtUnknown, // a real file of unknown flavour: list it
		"/usr/sbin/xtables-multi":        xtUnknown,
	} {
		if got := modeOfBinary(path); got != want {
			t.Errorf("modeOfBinary(%s) = %d, want %d", path, got, want)
		}
	}
}
