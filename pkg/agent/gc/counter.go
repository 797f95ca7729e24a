// SPDX-License-Identifier: Apache-2.0

package gc

import (
	"net/netip"
	"os"
	"path/filepath"
)

// Leases lists the host-local leases of network in dataDir (one file per address, named
// by it), as keys "address".
func Leases(dataDir, network string) (map[string]bool, error) {
	ents, err := os.ReadDir(filepath.Join(dataDir, network))
	if os.IsNotExist(err) {
		return map[string]bool{}, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, e := range ents {
		if a, err := netip.ParseAddr(e.Name()); err == nil && e.Type().IsRegular() {
			out[a.String()] = true
		}
	}
	return out, nil
}

// HostCounter snapshots leases (host-local's files), cached attachments (libcni's cache),
// through Links the host's veths on the bridge and IFBs, and through Rules the
// network's netfilter objects.
type HostCounter struct {
	DataDir string
	CNI     CNI
	// Links returns link keys by kind ("veth", "ifb"); nil skips them.
	Links func() (map[string]map[string]bool, error)
	// Rules returns the keys of the network's netfilter objects ("rule"); nil skips them.
	Rules func(network string) (map[string]bool, error)
}

// Snapshot implements Counter.
func (h HostCounter) Snapshot(network string) (Snapshot, error) {
	s := Snapshot{}
	l, err := Leases(h.DataDir, network)
	if err != nil {
		return nil, err
	}
	s["lease"] = l
	cached, err := h.CNI.GetCachedAttachments("")
	if err != nil {
		return nil, err
	}
	s["attachment"] = map[string]bool{}
	for _, a := range cached {
		if a.Network == network {
			s["attachment"][a.ContainerID+"/"+a.IfName] = true
		}
	}
	if h.Links != nil {
		links, err := h.Links()
		if err != nil {
			return nil, err
		}
		for k, v := range links {
			s[k] = v
		}
	}
	if h.Rules != nil {
		if s["rule"], err = h.Rules(network); err != nil {
			return nil, err
		}
	}
	return s, nil
}
