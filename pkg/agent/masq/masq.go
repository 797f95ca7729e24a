// SPDX-License-Identifier: Apache-2.0

// Package masq plans the agent's masquerade: pod traffic from this node's pod CIDRs to
// anywhere outside the cluster CIDRs is masqueraded; pod-to-pod traffic across nodes is
// not (the Kubernetes network model: pods see each other's real addresses). The rules go
// through the shared netfilter layer (pkg/netfilter) as a Plan of backend-neutral rules
// in podwire's own nftables table inet podwire_agent, tagged with the agent's owner, so
// nothing else's rules are ever touched.
package masq

import (
	"context"
	"net/netip"

	"github.com/podwire/podwire/pkg/netfilter"
)

// Feature is the agent's table: inet podwire_agent, base chain nat postrouting.
var Feature = netfilter.Feature{Name: "agent", Hooks: []netfilter.Hook{netfilter.NATPostrouting}}

// Owner tags the agent's rules.
var Owner = netfilter.Owner{Network: "podwire-agent", ContainerID: "masquerade", IfName: "node"}

// Backend is the part of netfilter.NFTables the agent uses.
type Backend interface {
	Apply(ctx context.Context, p netfilter.Plan) error
	Check(ctx context.Context, p netfilter.Plan) error
	Remove(ctx context.Context, f netfilter.Feature, o netfilter.Owner) error
}

var _ Backend = (*netfilter.NFTables)(nil)

// Plan returns the rules for the node's pod CIDRs: per pod CIDR, a return for each
// cluster CIDR of its family, then a masquerade. A family without a cluster CIDR
// exempts only the pod CIDR itself (uncovered reports those families, for a warning).
func Plan(podCIDRs, clusterCIDRs []netip.Prefix) (p netfilter.Plan, uncovered []netip.Prefix) {
	p = netfilter.Plan{Feature: Feature, Owner: Owner}
	for _, pod := range podCIDRs {
		fam := netfilter.FamilyOf(pod.Addr())
		var exempt []netip.Prefix
		for _, c := range clusterCIDRs {
			if netfilter.FamilyOf(c.Addr()) == fam {
				exempt = append(exempt, c.Masked())
			}
		}
		if len(exempt) == 0 {
			uncovered = append(uncovered, pod)
			exempt = []netip.Prefix{pod.Masked()}
		}
		for _, c := range exempt {
			p.Rules = append(p.Rules, netfilter.Rule{Hook: netfilter.NATPostrouting, Family: fam,
				Match:  netfilter.Match{Src: pod.Masked(), Dst: c},
				Action: netfilter.Action{Kind: netfilter.Return}})
		}
		p.Rules = append(p.Rules, netfilter.Rule{Hook: netfilter.NATPostrouting, Family: fam,
			Match:  netfilter.Match{Src: pod.Masked()},
			Action: netfilter.Action{Kind: netfilter.Masquerade}})
	}
	return p, uncovered
}

// Sync installs p (an empty plan removes the agent's rules and its table).
func Sync(ctx context.Context, b Backend, p netfilter.Plan) error {
	if len(p.Rules) == 0 {
		return b.Remove(ctx, Feature, Owner)
	}
	if b.Check(ctx, p) == nil {
		return nil
	}
	return b.Apply(ctx, p)
}

// Remove deletes the agent's rules (uninstall).
func Remove(ctx context.Context, b Backend) error { return b.Remove(ctx, Feature, Owner) }
