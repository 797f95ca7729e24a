// SPDX-License-Identifier: Apache-2.0

package gc

import (
	"context"
	"errors"

	"github.com/podwire/podwire/pkg/netfilter"
)

// NetfilterRules returns Rules for HostCounter: the network's attachments' masquerade
// and hostPort objects (pkg/netfilter's Object: one attachment's rules in one layout) in
// every backend the host offers, keyed "what backend key". An attachment whose owner is
// not named in full (the reference's iptables layout names network and container) counts
// once per layout, as GC removes it.
func NetfilterRules(ctx context.Context) func(network string) (map[string]bool, error) {
	return func(network string) (map[string]bool, error) {
		objs, err := netfilter.ListMasq(ctx)
		errs := []error{err}
		p := netfilter.ProbeHost()
		for k, ok := range map[netfilter.Kind]bool{netfilter.KindNFTables: p.NFTables, netfilter.KindIPTables: p.IPTables} {
			if ok {
				hp, err := netfilter.ListHostPorts(ctx, k)
				objs = append(objs, hp...)
				errs = append(errs, err)
			}
		}
		if err := errors.Join(errs...); err != nil {
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
