// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/podwire/podwire/pkg/cleanup"
	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/link"
	"github.com/podwire/podwire/pkg/netfilter"
)

// add applies the attachment's plan step by step. Each step that creates something
// of this attachment pushes its inverse; a failure runs them backwards, so a failed
// ADD leaves exactly what was there before it, and never touches what it did not
// create. The veth comes first and claims the attachment: its name is derived from
// the attachment, and the pod interface's is CNI_IFNAME, so when the attachment is
// live (a repeated ADD) or another ADD of it runs, the kernel refuses the pair
// before any lease is taken. The IPAM plugin runs only after that, so the lease this
// ADD's undo releases is always one this call got for an attachment that was not live.
// The bridge, its gateway addresses and the node's sysctls are shared by every pod
// of the bridge and are never undone.
func (p *plugin) add(ctx context.Context, in *cniplumb.Input) (_ types.Result, err error) {
	c, err := parseConf(in.Stdin, in.Args)
	if err != nil {
		return nil, err
	}
	ch, err := p.choose()
	if err != nil {
		return nil, err
	}
	owner := in.Owner()
	plan, err := planAttachment(c, owner, in.Netns, ch)
	if err != nil {
		return nil, err
	}
	// The masquerade backend is picked before anything changes: a missing one is the
	// operator's to fix and must not leave a half-made pod behind.
	lg := cniplumb.Log(ctx)
	lg.Decision("plan", "bridge", plan.Bridge.Name, "hostVeth", plan.Veth.HostName, "layer3", c.Layer3, "ipMasq", c.raw.IPMasq)
	var masq netfilter.MasqBackend
	if c.raw.IPMasq && c.Layer3 {
		if masq, err = p.masq.Open(c.Backend); err != nil {
			return nil, err
		}
	}
	var undo cleanup.Stack
	defer undo.RunIfFailed(&err)

	done := lg.Step("ensure bridge")
	br, err := p.links.EnsureBridge(ctx, plan.Bridge)
	done()
	if err != nil {
		return nil, err
	}
	lg.Debug("bridge", "name", br.Name, "created", br.Created)
	done = lg.Step("create veth")
	err = p.links.CreateVeth(ctx, plan.Veth)
	done()
	if err != nil {
		if link.IsExists(err) {
			return nil, fmt.Errorf("%w: attachment %s is live (this is a repeated ADD) or was not deleted; the runtime must DEL it before adding it again", err, owner)
		}
		return nil, err
	}
	host := plan.Veth.HostName
	undo.Push("delete veth "+host, func() error { return p.links.Delete(context.WithoutCancel(ctx), link.Ref{Name: host}) })
	brMAC := br.MAC
	if !br.Created || c.raw.IsGateway {
		// A bridge podwire did not create, and a gateway, keep the MAC they had before
		// this port joined, as the reference pins it with isGateway.
		if brMAC, err = p.links.PinBridgeMAC(ctx, br.Name, br.MAC); err != nil {
			return nil, err
		}
	} else if info, err := p.links.Inspect(ctx, link.Ref{Name: br.Name}); err == nil {
		brMAC = info.MAC // the reference's: a new bridge follows its ports' MAC
	}
	if plan.Spoof != nil {
		if err := p.spoof.Apply(ctx, *plan.Spoof); err != nil {
			return nil, fmt.Errorf("installing macspoofchk for %s: %w", host, err)
		}
		undo.Push("remove the macspoofchk rules of "+owner.String(), func() error {
			return p.spoof.Remove(context.WithoutCancel(ctx), owner)
		})
	}
	var ipamRes *current.Result
	if c.Layer3 {
		done := lg.Step("ipam " + c.IPAMType)
		ipamRes, err = p.lease(ctx, in, c, &undo)
		done()
		if err != nil {
			return nil, err
		}
		ap, err := planAddresses(c, owner, ipamRes)
		if err != nil {
			return nil, err
		}
		plan.withAddresses(c, ap)
	}
	if plan.Pod != nil {
		done := lg.Step("configure pod interface")
		err := p.links.ConfigurePod(ctx, *plan.Pod)
		done()
		if err != nil {
			return nil, fmt.Errorf("configuring %s in %s: %w", in.IfName, in.Netns, err)
		}
	}
	done = lg.Step("configure host")
	hr, err := p.links.ConfigureHost(ctx, plan.Host)
	done()
	if err != nil {
		return nil, err
	}
	for _, w := range hr.Warnings {
		p.warn(ctx, w)
	}
	if plan.Masq != nil {
		done := lg.Step("ipMasq rules")
		err := masq.Apply(ctx, *plan.Masq)
		done()
		if err != nil {
			return nil, fmt.Errorf("installing ipMasq rules for %s: %w", owner, err)
		}
		undo.Push("remove the ipMasq rules of "+owner.String(), func() error {
			return masq.Remove(context.WithoutCancel(ctx), owner, plan.Masq.Addrs)
		})
	}
	ifs := []*current.Interface{
		{Name: br.Name, Mac: brMAC.String()},
		{Name: host, Mac: plan.Veth.HostMAC.String()},
		{Name: in.IfName, Mac: plan.Veth.PodMAC.String(), Sandbox: in.Netns},
	}
	if g := hr.GatewayIf; g != nil {
		ifs = append(ifs, &current.Interface{Name: g.Name, Mac: g.MAC.String()})
	}
	var dns types.DNS
	if ipamRes != nil {
		dns = ipamRes.DNS
	}
	return buildResult(c, ifs, plan.Addrs, dns), nil
}

// lease runs the IPAM plugin's ADD and pushes its release.
func (p *plugin) lease(ctx context.Context, in *cniplumb.Input, c *conf, undo *cleanup.Stack) (*current.Result, error) {
	r, err := p.ipam.Add(ctx, in, c.IPAMType)
	if err != nil {
		return nil, fmt.Errorf("IPAM plugin %q: %w", c.IPAMType, err)
	}
	undo.Push("release the IPAM lease of "+in.Owner().String(), func() error {
		return p.ipam.Del(context.WithoutCancel(ctx), in, c.IPAMType)
	})
	res, err := current.NewResultFromResult(r)
	if err != nil {
		return nil, fmt.Errorf("converting the result of IPAM plugin %q: %w", c.IPAMType, err)
	}
	return res, nil
}
