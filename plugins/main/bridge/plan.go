package main

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/podwire/podwire/pkg/ipam"
	"github.com/podwire/podwire/pkg/netfilter"
)

// podIfIndex is the pod interface's position in the result: bridge, host veth, pod.
const podIfIndex = 2

// addrPlan is what ADD does with an IPAM result: the pod's addresses and routes, the
// gateway addresses the bridge (or VLAN gateway interface) gets, and the masquerade.
type addrPlan struct {
	IPs    []*current.IPConfig
	Routes []*types.Route // the pod's kernel routes
	// ResultRoutes are the routes the result reports: IPAM's as it gave them (a route
	// without "gw" stays without, as in the reference's result) and the default routes
	// isDefaultGateway adds.
	ResultRoutes []*types.Route
	Gateways     []net.IPNet // gateway address with the subnet's mask
	Families     netfilter.Families
	Masq         *netfilter.MasqPlan // nil without ipMasq
}

// planAddresses is pure. It fills in missing gateways (the subnet's first address,
// when isGateway), sends IPAM routes without "gw" through their family's gateway in the
// kernel (the result reports them as IPAM gave them, as the reference's does), adds a
// default route per family via the gateway (isDefaultGateway, unless IPAM already gave
// one), and points every address at the pod interface.
func planAddresses(c *conf, owner netfilter.Owner, ipam *current.Result) (*addrPlan, error) {
	if len(ipam.IPs) == 0 {
		return nil, fmt.Errorf("IPAM plugin %q returned no IP address; check its configuration (ranges/subnet)", c.IPAMType)
	}
	p := &addrPlan{}
	// The first gateway of each family: routes without "gw" go through it, as the
	// reference's ConfigureIface does (a gateway-less default route would leave the pod
	// with "default dev eth0" and no way past the bridge).
	familyGW := map[netfilter.Family]net.IP{}
	var masq []netip.Prefix
	for _, ipc := range ipam.IPs {
		if ipc.Address.IP == nil {
			return nil, fmt.Errorf("IPAM plugin %q returned an IP entry without an address", c.IPAMType)
		}
		ip := *ipc
		ip.Interface = current.Int(podIfIndex)
		fam := familyOf(ip.Address.IP)
		if ip.Gateway == nil && c.raw.IsGateway {
			ip.Gateway = firstAddress(ip.Address)
		}
		if ip.Gateway != nil && familyGW[fam] == nil {
			familyGW[fam] = ip.Gateway
		}
		if c.raw.IsGateway {
			p.Gateways = append(p.Gateways, net.IPNet{IP: ip.Gateway, Mask: ip.Address.Mask})
		}
		if fam == netfilter.IPv4 {
			p.Families |= netfilter.V4
		} else {
			p.Families |= netfilter.V6
		}
		p.IPs = append(p.IPs, &ip)
		a, ok := netip.AddrFromSlice(ip.Address.IP)
		if !ok {
			return nil, fmt.Errorf("IPAM returned a malformed address %v", ip.Address.IP)
		}
		a = a.Unmap()
		ones, _ := ip.Address.Mask.Size()
		masq = append(masq, netip.PrefixFrom(a, ones))
	}
	hasDefault := map[netfilter.Family]bool{}
	for _, r := range ipam.Routes {
		rc := *r
		fam := familyOf(rc.Dst.IP)
		if rc.GW == nil {
			rc.GW = familyGW[fam] // nil when the family has no gateway: an on-link route
		}
		if rc.GW != nil && isDefault(rc.Dst) {
			hasDefault[fam] = true
		}
		p.Routes = append(p.Routes, &rc)
		p.ResultRoutes = append(p.ResultRoutes, r)
	}
	if c.raw.IsDefaultGateway {
		for _, fam := range []netfilter.Family{netfilter.IPv4, netfilter.IPv6} {
			if gw := familyGW[fam]; gw != nil && !hasDefault[fam] {
				p.Routes = append(p.Routes, &types.Route{Dst: defaultNet(fam), GW: gw})
				p.ResultRoutes = append(p.ResultRoutes, &types.Route{Dst: defaultNet(fam), GW: gw})
			}
		}
	}
	if c.raw.IPMasq {
		p.Masq = &netfilter.MasqPlan{Owner: owner, Addrs: masq}
	}
	return p, nil
}

func familyOf(ip net.IP) netfilter.Family {
	if ip.To4() != nil {
		return netfilter.IPv4
	}
	return netfilter.IPv6
}

func isDefault(n net.IPNet) bool {
	ones, _ := n.Mask.Size()
	return ones == 0 && n.IP.IsUnspecified()
}

func defaultNet(f netfilter.Family) net.IPNet {
	if f == netfilter.IPv4 {
		return net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}
	}
	return net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
}

// firstAddress is the subnet's network address plus one, the conventional gateway.
func firstAddress(n net.IPNet) net.IP {
	ip := n.IP.Mask(n.Mask)
	if v4 := ip.To4(); v4 != nil {
		ip = v4
	}
	return ipam.NextIP(ip)
}

// buildResult assembles ADD's result: the bridge, the host veth, the pod interface
// (with its sandbox), then the VLAN gateway interface if there is one.
func buildResult(c *conf, ifs []*current.Interface, ap *addrPlan, ipamDNS types.DNS) *current.Result {
	r := &current.Result{CNIVersion: current.ImplementedSpecVersion, Interfaces: ifs}
	if ap != nil {
		r.IPs, r.Routes, r.DNS = ap.IPs, ap.ResultRoutes, ipamDNS
	}
	if d := c.raw.DNS; d.Nameservers != nil || d.Search != nil || d.Options != nil || d.Domain != "" {
		r.DNS = d
	}
	return r
}
