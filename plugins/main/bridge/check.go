// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"net"
	"slices"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/link"
	"github.com/podwire/podwire/pkg/netfilter"
)

// check verifies what ADD made against prevResult, as the reference's CHECK does and
// with the same outcome on a pod either plugin made: the bridge (type, promiscuous
// mode, the MAC in the result), the pod interface (a veth, its MAC, addresses and
// routes), a host veth of the result that is its peer on the bridge, the lease, and
// the masquerade and spoof-check rules ADD installs. A pod whose host veth does not
// have podwire's derived name was made by another implementation (the reference
// plugin, or a podwire before derived names); its failures say so.
func (p *plugin) check(ctx context.Context, in *cniplumb.Input) error {
	c, err := parseConf(in.Stdin, in.Args)
	if err != nil {
		return err
	}
	prev, err := in.RequirePrevResult()
	if err != nil {
		return err
	}
	if c.Layer3 {
		if err := p.ipam.Check(ctx, in, c.IPAMType); err != nil {
			return fmt.Errorf("IPAM plugin %q: %w", c.IPAMType, err)
		}
	}
	var brIf, podIf *current.Interface
	var hostIfs []*current.Interface
	for _, i := range prev.Interfaces {
		switch {
		case i.Sandbox == "" && i.Name == c.Bridge:
			brIf = i
		case i.Sandbox != "" && i.Name == in.IfName:
			podIf = i
		case i.Sandbox == "":
			hostIfs = append(hostIfs, i)
		}
	}
	if brIf == nil || podIf == nil {
		return fmt.Errorf("prevResult lacks the bridge %q or the pod interface %q; run DEL and ADD again", c.Bridge, in.IfName)
	}
	if podIf.Sandbox != in.Netns {
		return fmt.Errorf("prevResult puts %s in %s, not in CNI_NETNS %s", in.IfName, podIf.Sandbox, in.Netns)
	}
	hostVeth, err := p.checkLinks(ctx, c, in, prev, brIf, podIf, hostIfs)
	if err == nil {
		err = p.checkRules(ctx, c, in, prev, hostVeth, podIf)
	}
	if err != nil && !slices.ContainsFunc(hostIfs, func(i *current.Interface) bool { n, _ := hostVethName(in.Owner()); return i.Name == n }) {
		return fmt.Errorf("%w (this pod was made by another implementation, the reference bridge plugin or an older podwire: its host veth is not named as podwire names it; DEL and ADD the pod again to have it made by this podwire)", err)
	}
	return err
}

// checkLinks checks the bridge, the pod interface and its host peer; it returns the
// host veth's name.
func (p *plugin) checkLinks(ctx context.Context, c *conf, in *cniplumb.Input, prev *current.Result, brIf, podIf *current.Interface, hostIfs []*current.Interface) (string, error) {
	br, err := p.links.Inspect(ctx, link.Ref{Name: c.Bridge})
	if err != nil {
		return "", fmt.Errorf("bridge %s: %w", c.Bridge, err)
	}
	if br.Kind != "bridge" {
		return "", fmt.Errorf("%s is a %s, not a bridge", c.Bridge, br.Kind)
	}
	if br.Promisc != c.raw.PromiscMode {
		return "", fmt.Errorf("bridge %s promiscuous mode is %v, configured %v", c.Bridge, br.Promisc, c.raw.PromiscMode)
	}
	if brIf.Mac != "" && brIf.Mac != br.MAC.String() {
		return "", fmt.Errorf("bridge %s has MAC %s, prevResult says %s (the bridge's MAC was not pinned, or was changed); run DEL and ADD again", c.Bridge, br.MAC, brIf.Mac)
	}
	pod, err := p.links.Inspect(ctx, link.Ref{Netns: in.Netns, Name: in.IfName})
	if err != nil {
		return "", fmt.Errorf("pod interface %s: %w", in.IfName, err)
	}
	if pod.Kind != "veth" {
		return "", fmt.Errorf("pod interface %s is a %s, not a veth", in.IfName, pod.Kind)
	}
	if podIf.Mac != "" && podIf.Mac != pod.MAC.String() {
		return "", fmt.Errorf("pod interface %s has MAC %s, prevResult says %s", in.IfName, pod.MAC, podIf.Mac)
	}
	podIdx := slices.Index(prev.Interfaces, podIf)
	for _, ip := range prev.IPs {
		if ip.Interface != nil && *ip.Interface != podIdx {
			continue
		}
		if !slices.Contains(pod.Addrs, prefixOf(ip.Address)) {
			return "", fmt.Errorf("address %s is missing from %s", ip.Address.String(), in.IfName)
		}
	}
	for _, r := range prev.Routes {
		dst := prefixOf(r.Dst).Masked()
		if !slices.ContainsFunc(pod.Routes, func(lr link.Route) bool {
			return lr.Dst == dst && (r.GW == nil || lr.GW == addrOf(r.GW))
		}) {
			return "", fmt.Errorf("route to %s via %v is missing in the pod", dst, r.GW)
		}
	}
	// The host end: the veth whose peer is the pod interface, on the bridge.
	for _, h := range hostIfs {
		l, err := p.links.Inspect(ctx, link.Ref{Name: h.Name})
		if err != nil || l.Kind != "veth" || l.Index != pod.PeerIndex {
			continue
		}
		if l.MasterIndex != br.Index {
			return "", fmt.Errorf("host veth %s is not on bridge %s; run DEL and ADD again", h.Name, c.Bridge)
		}
		if h.Mac != "" && h.Mac != l.MAC.String() {
			return "", fmt.Errorf("host veth %s has MAC %s, prevResult says %s", h.Name, l.MAC, h.Mac)
		}
		return h.Name, nil
	}
	return "", fmt.Errorf("no host veth in prevResult is the peer of %s on bridge %s; run DEL and ADD again", in.IfName, c.Bridge)
}

// checkRules checks the masquerade and the spoof check ADD installs.
func (p *plugin) checkRules(ctx context.Context, c *conf, in *cniplumb.Input, prev *current.Result, hostVeth string, podIf *current.Interface) error {
	if c.raw.IPMasq && c.Layer3 {
		ap, err := planAddresses(c, in.Owner(), &current.Result{IPs: prev.IPs})
		if err != nil {
			return err
		}
		if err := p.masq.Check(ctx, c.Backend, *ap.Masq); err != nil {
			return fmt.Errorf("ipMasq rules: %w", err)
		}
	}
	if c.raw.MacSpoofChk {
		mac, _ := net.ParseMAC(podIf.Mac)
		if err := p.spoof.Check(ctx, netfilter.MacSpoofPlan{Owner: in.Owner(), HostIf: hostVeth, MAC: mac}); err != nil {
			return fmt.Errorf("macspoofchk rules: %w", err)
		}
	}
	return nil
}
