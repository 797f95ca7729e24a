// SPDX-License-Identifier: Apache-2.0

package link

import (
	"context"
	"fmt"

	"github.com/containernetworking/plugins/pkg/netlinksafe"

	"github.com/podwire/podwire/pkg/cniplumb"
)

// HostVethName is the name bridge gives the host end of o's veth: derived from the
// owner, so `podwire inspect` finds an attachment's veth, and a veth no lease names,
// without bridge storing anything.
func HostVethName(o cniplumb.Owner) (string, error) { return o.KernelName("veth", 15) }

// BridgePorts lists the names of the veths whose master is the bridge named bridge,
// in the calling thread's network namespace (read-only, one dump). A missing bridge
// has no ports.
func BridgePorts(bridge string) ([]string, error) {
	br, err := netlinksafe.LinkByName(bridge)
	if isKernelNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("looking up bridge %s: %w", bridge, err)
	}
	links, err := netlinksafe.LinkList()
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	var out []string
	for _, l := range links {
		if a := l.Attrs(); a.MasterIndex == br.Attrs().Index && l.Type() == "veth" {
			out = append(out, a.Name)
		}
	}
	return out, nil
}

// OnBridgeOrGone returns bridge's GC test of whether a host veth is the network's: it
// is gone, or a port of bridge (when bridge is a bridge). The reference's macspoofchk
// rules name no network, so this is how GC (and `podwire gc --dry-run`) tells.
func OnBridgeOrGone(ctx context.Context, b Backend, bridge string) func(hostIf string) bool {
	index := -1
	if bridge != "" {
		if info, err := b.Inspect(ctx, Ref{Name: bridge}); err == nil && info.Kind == "bridge" {
			index = info.Index
		}
	}
	return func(hostIf string) bool {
		info, err := b.Inspect(ctx, Ref{Name: hostIf})
		return IsNotFound(err) || err == nil && info.MasterIndex == index
	}
}
