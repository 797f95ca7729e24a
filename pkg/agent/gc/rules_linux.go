// SPDX-License-Identifier: Apache-2.0

package gc

import (
	"context"

	"github.com/podwire/podwire/pkg/netfilter"
)

// NetfilterRules returns Rules for HostCounter: the network's attachments' objects
// (pkg/netfilter's Object: one attachment's rules in one layout) as netfilter's Lister
// reads them in every backend the host offers, keyed "what backend key". An attachment
// whose owner is not named in full (the reference's iptables layout names network and
// container) counts once per layout, as GC removes it; layouts that name no network
// (macspoofchk, the reference portmap's cni_hostport) are not counted.
func NetfilterRules(ctx context.Context) func(network string) (map[string]bool, error) {
	l := netfilter.NewLister()
	return func(network string) (map[string]bool, error) {
		objs, err := l.List(ctx)
		if err != nil {
			return nil, err
		}
		out := map[string]bool{}
		for _, o := range objs {
			if o.InNetwork(network) {
				out[o.String()] = true
			}
		}
		return out, nil
	}
}
