// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/link"
	"github.com/podwire/podwire/pkg/netfilter"
)

// plugin is bridge's verbs with the backends they apply plans through. main wires the
// kernel's; unit tests wire fakes (link.Fake, netfilter's fake kernel, an in-memory
// IPAM).
type plugin struct {
	links  link.Backend
	ipam   ipamRunner
	masq   masqBackends
	spoof  spoofBackend
	random func() (net.HardwareAddr, error) // MACs for new links
	stderr io.Writer                        // warnings, which runtimes log
}

// ipamRunner runs the IPAM plugin named in ipam.type (delegate.Delegator).
type ipamRunner interface {
	Add(ctx context.Context, in *cniplumb.Input, plugin string) (types.Result, error)
	Del(ctx context.Context, in *cniplumb.Input, plugin string) error
	Check(ctx context.Context, in *cniplumb.Input, plugin string) error
	GC(ctx context.Context, in *cniplumb.Input, plugin string) error
	Status(ctx context.Context, in *cniplumb.Input, plugin string) error
}

// masqBackends is ipMasq in the reference's layouts: ADD opens the configured (or
// chosen) backend; DEL, CHECK and GC look in both, since a pod may have been made by
// the reference or with another ipMasqBackend.
type masqBackends interface {
	// Open returns the backend ADD installs into; a missing one is code 50.
	Open(want netfilter.Kind) (netfilter.MasqBackend, error)
	Remove(ctx context.Context, o netfilter.Owner, addrs []netip.Prefix) error
	Check(ctx context.Context, want netfilter.Kind, p netfilter.MasqPlan) error
	GC(ctx context.Context, network string, keep cniplumb.Owners) error
}

// spoofBackend is macspoofchk (netfilter.MacSpoof).
type spoofBackend interface {
	Apply(ctx context.Context, p netfilter.MacSpoofPlan) error
	Check(ctx context.Context, p netfilter.MacSpoofPlan) error
	Remove(ctx context.Context, o netfilter.Owner) error
	GC(ctx context.Context, keep cniplumb.Owners, ours func(hostIf string) bool) error
}

// hostMasq is masqBackends on the node.
type hostMasq struct{}

func (hostMasq) Open(want netfilter.Kind) (netfilter.MasqBackend, error) {
	b, _, err := netfilter.OpenMasq(want)
	return b, err
}

func (hostMasq) Remove(ctx context.Context, o netfilter.Owner, addrs []netip.Prefix) error {
	return netfilter.RemoveMasq(ctx, o, addrs)
}

func (hostMasq) Check(ctx context.Context, want netfilter.Kind, p netfilter.MasqPlan) error {
	return netfilter.CheckMasq(ctx, want, p)
}

func (hostMasq) GC(ctx context.Context, network string, keep cniplumb.Owners) error {
	return netfilter.GCMasq(ctx, network, keep)
}

// hostSpoof is macspoofchk on the node; GC skips a node without nf_tables, where no
// pod can have any.
type hostSpoof struct{ *netfilter.MacSpoof }

func (s hostSpoof) GC(ctx context.Context, keep cniplumb.Owners, ours func(string) bool) error {
	if !netfilter.ProbeHost().NFTables {
		return nil
	}
	return s.MacSpoof.GC(ctx, keep, ours)
}

// warn reports a problem that does not fail the verb, on stderr and in the verb's log.
func (p *plugin) warn(ctx context.Context, err error) {
	if err != nil {
		fmt.Fprintf(p.stderr, "bridge: warning: %v\n", err)
		cniplumb.Log(ctx).Warn("warning", "warning", err.Error())
	}
}

// choose picks the random MACs a plan needs.
func (p *plugin) choose() (choices, error) {
	var ch choices
	for _, m := range []*net.HardwareAddr{&ch.BridgeMAC, &ch.HostMAC, &ch.PodMAC, &ch.GatewayMACs[0], &ch.GatewayMACs[1]} {
		var err error
		if *m, err = p.random(); err != nil {
			return ch, err
		}
	}
	return ch, nil
}
