// SPDX-License-Identifier: Apache-2.0

// Package conflist renders the node's network configuration list: the kubenet chain
// (bridge with host-local, portmap, bandwidth) for the Node's pod CIDRs. It is pure: the
// same inputs give the same bytes, so the agent can compare before it writes.
package conflist

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
)

// Params is what the conflist depends on.
type Params struct {
	Network    string         // the conflist's "name"
	CNIVersion string         // "1.0.0" or "1.1.0"
	Bridge     string         // the bridge's name (cni0)
	PodCIDRs   []netip.Prefix // the Node's spec.podCIDRs: one host-local range each
	MTU        int            // 0: the bridge plugin's default
	DataDir    string         // host-local's dataDir; "" leaves its default
}

// SupportedVersions are the cniVersions the agent writes.
var SupportedVersions = []string{"1.0.0", "1.1.0"}

type rangeEntry struct {
	Subnet string `json:"subnet"`
}

type route struct {
	Dst string `json:"dst"`
}

type ipam struct {
	Type    string         `json:"type"`
	DataDir string         `json:"dataDir,omitempty"`
	Ranges  [][]rangeEntry `json:"ranges"`
	Routes  []route        `json:"routes"`
}

type bridge struct {
	Type        string `json:"type"`
	Bridge      string `json:"bridge"`
	MTU         int    `json:"mtu,omitempty"`
	IsGateway   bool   `json:"isGateway"`
	IPMasq      bool   `json:"ipMasq"`
	HairpinMode bool   `json:"hairpinMode"`
	IPAM        ipam   `json:"ipam"`
}

type capPlugin struct {
	Type         string          `json:"type"`
	Capabilities map[string]bool `json:"capabilities"`
	SNAT         *bool           `json:"snat,omitempty"`
}

type list struct {
	CNIVersion string `json:"cniVersion"`
	Name       string `json:"name"`
	Plugins    []any  `json:"plugins"`
}

// Validate reports parameters that cannot make a working conflist.
func (p Params) Validate() error {
	if p.Network == "" {
		return fmt.Errorf("no network name; set --network-name")
	}
	if !slices.Contains(SupportedVersions, p.CNIVersion) {
		return fmt.Errorf("cniVersion %q is not one the agent writes (%v); set --cni-version", p.CNIVersion, SupportedVersions)
	}
	if p.Bridge == "" || len(p.Bridge) > 15 {
		return fmt.Errorf("bridge name %q must have 1 to 15 bytes", p.Bridge)
	}
	if len(p.PodCIDRs) == 0 {
		return fmt.Errorf("the Node has no pod CIDR yet (spec.podCIDRs is empty); the controller manager assigns them with --allocate-node-cidrs, or set them on the Node")
	}
	if len(p.PodCIDRs) > 2 || (len(p.PodCIDRs) == 2 && p.PodCIDRs[0].Addr().Is4() == p.PodCIDRs[1].Addr().Is4()) {
		return fmt.Errorf("pod CIDRs %v: at most one IPv4 and one IPv6 CIDR, as Kubernetes allows", p.PodCIDRs)
	}
	for _, c := range p.PodCIDRs {
		if !c.IsValid() || c.Masked() != c {
			return fmt.Errorf("pod CIDR %s is not a network prefix", c)
		}
	}
	return nil
}

// Render returns the conflist's bytes, indented, with a trailing newline.
func Render(p Params) ([]byte, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	br := bridge{Type: "bridge", Bridge: p.Bridge, MTU: p.MTU, IsGateway: true, HairpinMode: true,
		IPAM: ipam{Type: "host-local", DataDir: p.DataDir}}
	for _, c := range p.PodCIDRs {
		br.IPAM.Ranges = append(br.IPAM.Ranges, []rangeEntry{{Subnet: c.String()}})
		dst := "0.0.0.0/0"
		if c.Addr().Is6() {
			dst = "::/0"
		}
		br.IPAM.Routes = append(br.IPAM.Routes, route{Dst: dst})
	}
	snat := true
	l := list{CNIVersion: p.CNIVersion, Name: p.Network, Plugins: []any{
		br,
		capPlugin{Type: "portmap", Capabilities: map[string]bool{"portMappings": true}, SNAT: &snat},
		capPlugin{Type: "bandwidth", Capabilities: map[string]bool{"bandwidth": true}},
	}}
	b, err := json.MarshalIndent(l, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// Plugins are the plugin types the conflist runs (the binaries it needs besides
// loopback, which the runtime runs itself).
var Plugins = []string{"bridge", "host-local", "portmap", "bandwidth"}
