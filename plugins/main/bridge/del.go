// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/link"
)

// del tears the attachment down, best effort: it reads only what teardown needs
// (parseTeardown; the rest of a conflist edited since ADD is a warning on stderr),
// runs every step even when an earlier one failed, returns every failure, and treats
// what is already gone as done. The steps (3 and 4 run while 1 and 2 wait in the
// kernel; 5 comes last, so the pod's address is released only once no interface can
// still hold it):
//
//  1. the pod interface in CNI_NETNS (its host peer goes with it); a netns that is
//     gone or is no longer a network namespace is skipped;
//  2. the host veth by its derived name, and the one prevResult names when it is a
//     veth with prevResult's MAC (a pod the reference made): when the pod's
//     namespace is unreachable but alive (unmounted, still held by a process), this
//     is what removes the pair;
//  3. the macspoofchk rules (the reference's layout, whichever binary made them);
//  4. the masquerade, in both layouts, by name (no addresses needed);
//  5. the lease (IPAM DEL).
func (p *plugin) del(ctx context.Context, in *cniplumb.Input) error {
	t, warnings, err := parseTeardown(in.Stdin)
	if t == nil {
		return err
	}
	for _, w := range warnings {
		p.warn(ctx, fmt.Errorf("DEL goes on despite a configuration ADD would refuse (fix it before the next ADD): %w", w))
	}
	errs := []error{err}
	owner := in.Owner()
	// Deleting a veth blocks in the kernel for an RCU grace period (10-45 ms here)
	// after the link has left both namespaces; the rules do not depend on it and are
	// removed meanwhile (DEL through libcni: 46 ms median without this, 35 ms with it;
	// integration/bridge_latency_test.go). The lease waits for the links.
	lg := cniplumb.Log(ctx)
	linksDone := make(chan error, 1)
	go func() {
		defer lg.Step("delete links")()
		linksDone <- p.deleteLinks(ctx, in, owner)
	}()
	if t.MacSpoofChk {
		done := lg.Step("remove macspoofchk")
		err := p.spoof.Remove(ctx, owner)
		done()
		if err != nil {
			errs = append(errs, fmt.Errorf("removing the macspoofchk rules of %s: %w", owner, err))
		}
	}
	if t.IPMasq && t.IPAMType != "" {
		done := lg.Step("remove ipMasq rules")
		err := p.masq.Remove(ctx, owner, prevAddrs(in.PrevResult))
		done()
		if err != nil {
			errs = append(errs, fmt.Errorf("removing the ipMasq rules of %s: %w", owner, err))
		}
	}
	errs = append(errs, <-linksDone)
	if t.IPAMType != "" {
		done := lg.Step("ipam " + t.IPAMType)
		err := p.ipam.Del(ctx, in, t.IPAMType)
		done()
		if err != nil {
			errs = append(errs, fmt.Errorf("IPAM plugin %q: %w", t.IPAMType, err))
		}
	}
	return errors.Join(errs...)
}

// deleteLinks is DEL's steps 1 and 2.
func (p *plugin) deleteLinks(ctx context.Context, in *cniplumb.Input, owner cniplumb.Owner) error {
	var err error
	if in.Netns != "" {
		if err = p.links.Delete(ctx, link.Ref{Netns: in.Netns, Name: in.IfName}); err != nil {
			err = fmt.Errorf("deleting %s in %s: %w", in.IfName, in.Netns, err)
		}
	}
	return errors.Join(err, p.deleteHostVeth(ctx, owner, in.PrevResult))
}

// deleteHostVeth deletes the attachment's host veth when it outlived the pod end's
// deletion (usually it is gone already: a lookup).
func (p *plugin) deleteHostVeth(ctx context.Context, owner cniplumb.Owner, prev *current.Result) error {
	name, err := hostVethName(owner)
	if err != nil {
		return err
	}
	var errs []error
	if err := p.links.Delete(ctx, link.Ref{Name: name}); err != nil {
		errs = append(errs, fmt.Errorf("deleting host veth %s: %w", name, err))
	}
	if h := prevHostVeth(prev); h != nil && h.Name != name {
		want, _ := net.ParseMAC(h.Mac)
		info, err := p.links.Inspect(ctx, link.Ref{Name: h.Name})
		switch {
		case link.IsNotFound(err):
		case err != nil:
			errs = append(errs, fmt.Errorf("looking up host veth %s: %w", h.Name, err))
		case info.Kind == "veth" && want != nil && bytes.Equal(info.MAC, want):
			if err := p.links.Delete(ctx, link.Ref{Name: h.Name}); err != nil {
				errs = append(errs, fmt.Errorf("deleting host veth %s: %w", h.Name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// prevHostVeth is the host veth in a result: the second interface, without sandbox.
func prevHostVeth(r *current.Result) *current.Interface {
	if r == nil || len(r.Interfaces) < 3 || r.Interfaces[1].Sandbox != "" || r.Interfaces[1].Name == "" {
		return nil
	}
	return r.Interfaces[1]
}

// prevAddrs returns prevResult's addresses with their prefix lengths, nil without a
// prevResult (then DEL removes every masquerade rule of the attachment, both families).
func prevAddrs(r *current.Result) []netip.Prefix {
	if r == nil {
		return nil
	}
	var out []netip.Prefix
	for _, ip := range r.IPs {
		a, ok := netip.AddrFromSlice(ip.Address.IP)
		if !ok {
			continue
		}
		ones, _ := ip.Address.Mask.Size()
		out = append(out, netip.PrefixFrom(a.Unmap(), ones))
	}
	return out
}

// gc forwards to the IPAM plugin, then removes the ipMasq and macspoofchk rules of this
// network's attachments that are not in cni.dev/valid-attachments, in every backend the
// node offers (a node may have switched ipMasqBackend). The reference's macspoofchk
// layout names no network, so an attachment's rules are this network's when its host
// veth is gone or is a port of this network's bridge.
func (p *plugin) gc(ctx context.Context, in *cniplumb.Input) error {
	t, warnings, err := parseTeardown(in.Stdin)
	if t == nil {
		return err
	}
	for _, w := range warnings {
		p.warn(ctx, fmt.Errorf("GC goes on despite a configuration ADD would refuse: %w", w))
	}
	errs := []error{err}
	if t.IPAMType != "" {
		if err := p.ipam.GC(ctx, in, t.IPAMType); err != nil {
			errs = append(errs, fmt.Errorf("IPAM plugin %q: %w", t.IPAMType, err))
		}
	}
	if err := p.masq.GC(ctx, in.Conf.Name, in.ValidAttachments); err != nil {
		errs = append(errs, fmt.Errorf("removing stale ipMasq rules: %w", err))
	}
	ours := link.OnBridgeOrGone(ctx, p.links, t.Bridge)
	if err := p.spoof.GC(ctx, in.ValidAttachments, ours); err != nil {
		errs = append(errs, fmt.Errorf("removing stale macspoofchk rules: %w", err))
	}
	return errors.Join(errs...)
}

// status forwards to the IPAM plugin and reports a configured ipMasq backend the node
// cannot run (code 50).
func (p *plugin) status(ctx context.Context, in *cniplumb.Input) error {
	c, err := parseStatusConf(in.Stdin)
	if err != nil {
		return err
	}
	if c.raw.IPMasq && c.Layer3 {
		if _, err := p.masq.Open(c.Backend); err != nil {
			return err
		}
	}
	if c.Layer3 {
		if err := p.ipam.Status(ctx, in, c.IPAMType); err != nil {
			return fmt.Errorf("IPAM plugin %q: %w", c.IPAMType, err)
		}
	}
	return nil
}
