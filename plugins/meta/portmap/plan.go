// SPDX-License-Identifier: Apache-2.0

package main

import (
	"net"
	"net/netip"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/netfilter"
)

// podAddrs picks the pod's addresses from prevResult as the reference does: the first
// IPv4 and the first IPv6 address that do not belong to a host-side interface or to
// another interface than ifName (addresses without an interface index count).
func podAddrs(res *current.Result, ifName string) []netip.Prefix {
	var v4, v6 netip.Prefix
	for _, ip := range res.IPs {
		if ip == nil {
			continue
		}
		if ip.Interface != nil {
			i := *ip.Interface
			if i >= 0 && i < len(res.Interfaces) && (res.Interfaces[i].Name != ifName || res.Interfaces[i].Sandbox == "") {
				continue
			}
		}
		p, ok := prefixOf(ip.Address)
		if !ok {
			continue
		}
		if p.Addr().Is4() {
			if !v4.IsValid() {
				v4 = p
			}
		} else if !v6.IsValid() {
			v6 = p
		}
	}
	var out []netip.Prefix
	for _, p := range []netip.Prefix{v4, v6} {
		if p.IsValid() {
			out = append(out, p)
		}
	}
	return out
}

func prefixOf(n net.IPNet) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	a = a.Unmap()
	bits := a.BitLen()
	if n.Mask != nil {
		ones, total := n.Mask.Size()
		if total == 0 {
			return netip.Prefix{}, false
		}
		// A 16-byte mask on an IPv4 address: count only its last 32 bits.
		bits = ones - (total - a.BitLen())
		if bits < 0 {
			bits = 0
		}
	}
	return netip.PrefixFrom(a, bits), true
}

// planHostPorts turns the configuration and the pod's addresses into the plan of one
// attachment. It is pure. Each mapping forwards to the pod address of every family, or
// only of its hostIP's family. Mappings without a pod address to forward to are an
// error, since the runtime expects the port to work.
func planHostPorts(c *Conf, o cniplumb.Owner, res *current.Result, ifName string) (netfilter.HostPortPlan, error) {
	p := netfilter.HostPortPlan{
		Owner: o, SNAT: c.SNAT, MasqAll: c.MasqAll,
		Mark: uint32(1) << uint(c.MarkBit), SetMarkChain: c.SetMarkChain, Conditions: c.Conditions,
	}
	if len(c.Mappings) == 0 {
		return p, nil
	}
	pods := podAddrs(res, ifName)
	if len(pods) == 0 {
		return p, cniplumb.ConfigError("prevResult", "prevResult has no address of interface %s in the pod, so the host ports have nowhere to go; put portmap after the plugin that assigns the pod's addresses", ifName)
	}
	for _, m := range c.Mappings {
		for _, pod := range pods {
			if m.HostIP.IsValid() && m.HostIP.Is4() != pod.Addr().Is4() {
				// A hostIP of the other family, skipped as the reference does (0.0.0.0
				// means every IPv4 host address, :: every IPv6 one).
				continue
			}
			p.Ports = append(p.Ports, netfilter.HostPort{Proto: m.Proto, HostPort: m.HostPort, HostIP: m.HostIP,
				Pod: pod, ContainerPort: m.ContainerPort})
		}
	}
	if err := p.Validate(); err != nil {
		return p, cniplumb.ConfigError("runtimeConfig.portMappings", "%v", err)
	}
	return p, nil
}
