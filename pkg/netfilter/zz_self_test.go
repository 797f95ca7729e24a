package netfilter

import (
	"os"
	"testing"
)

func TestZZSelf(t *testing.T) {
	if os.Getenv("ZZDUMP") == "" {
		t.Skip()
	}
	for _, fam := range []Family{IPv4, IPv6} {
		_, restore := binaries(fam)
		if err := xtSelfCheck(fam, restore); err != nil {
			t.Errorf("%s: %v", fam, err)
		}
	}
}
