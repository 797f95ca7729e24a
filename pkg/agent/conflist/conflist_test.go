// SPDX-License-Identifier: Apache-2.0

package conflist

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
)

func TestRenderDualStack(t *testing.T) {
	p := Params{Network: "podwire", CNIVersion: "1.1.0", Bridge: "cni0",
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:10:244:1::/64")}}
	b, err := Render(p)
	if err != nil {
		t.Fatal(err)
	}
	want := `{
  "cniVersion": "1.1.0",
  "name": "podwire",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [
          [
            {
              "subnet": "10.244.1.0/24"
            }
          ],
          [
            {
              "subnet": "fd00:10:244:1::/64"
            }
          ]
        ],
        "routes": [
          {
            "dst": "0.0.0.0/0"
          },
          {
            "dst": "::/0"
          }
        ]
      }
    },
    {
      "type": "portmap",
      "capabilities": {
        "portMappings": true
      },
      "snat": true
    },
    {
      "type": "bandwidth",
      "capabilities": {
        "bandwidth": true
      }
    }
  ]
}
`
	if string(b) != want {
		t.Errorf("Render:\n%s\nwant:\n%s", b, want)
	}
	// libcni, as the runtime will, must accept it.
	l, err := libcni.ConfListFromBytes(b)
	if err != nil {
		t.Fatalf("libcni refuses the conflist: %v", err)
	}
	if l.Name != "podwire" || len(l.Plugins) != 3 || l.CNIVersion != "1.1.0" {
		t.Errorf("libcni read %s %s with %d plugins", l.Name, l.CNIVersion, len(l.Plugins))
	}
}

func TestValidate(t *testing.T) {
	v4 := netip.MustParsePrefix("10.244.1.0/24")
	ok := Params{Network: "n", CNIVersion: "1.0.0", Bridge: "cni0", PodCIDRs: []netip.Prefix{v4}}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	bad := map[string]func(p *Params){
		"no network":    func(p *Params) { p.Network = "" },
		"version 0.4.0": func(p *Params) { p.CNIVersion = "0.4.0" },
		"no cidr":       func(p *Params) { p.PodCIDRs = nil },
		"two v4":        func(p *Params) { p.PodCIDRs = []netip.Prefix{v4, netip.MustParsePrefix("10.245.0.0/24")} },
		"host bits":     func(p *Params) { p.PodCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.1.1/24")} },
		"long bridge":   func(p *Params) { p.Bridge = strings.Repeat("b", 16) },
	}
	for name, mut := range bad {
		p := ok
		mut(&p)
		if err := p.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
