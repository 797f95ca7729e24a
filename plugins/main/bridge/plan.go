// SPDX-License-Identifier: Apache-2.0

package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/ipam"
	"github.com/podwire/podwire/pkg/link"
	"github.com/podwire/podwire/pkg/netfilter"
)

// This file is pure: it turns a validated configuration, the attachment and (after
// IPAM) the addresses into the plan ADD applies. It reads nothing of the host.

// podIfIndex is the pod interface's position in the result: bridge, host veth, pod.
const podIfIndex = 2

// dadTimeout bounds enabledad's wait for the pod's IPv6 addresses.
const dadTimeout = 10 * time.Second

// choices are the random values a plan needs, picked outside so planning is pure.
type choices struct {
	BridgeMAC, HostMAC, PodMAC net.HardwareAddr // PodMAC unless configured
	GatewayMACs                [2]net.HardwareAddr
}

// attachmentPlan is every kernel object ADD makes or configures for one attachment,
// in apply order. Bridge, Veth and Spoof are known before IPAM runs; Pod, Host and
// Masq are completed from its result (withAddresses). It is data: String renders it.
type attachmentPlan struct {
	Owner  cniplumb.Owner
	Bridge link.BridgeSpec
	Veth   link.VethSpec
	Spoof  *netfilter.MacSpoofPlan // nil without macspoofchk
	Pod    *link.PodSpec           // nil: the pod interface stays down (disableContainerInterface)
	Host   link.HostSpec
	Masq   *netfilter.MasqPlan // nil without ipMasq (or without IPAM)
	Addrs  *addrPlan           // nil for layer 2
}

// hostVethName is the attachment's host veth: "veth" and 11 hex digits of its owner
// hash. Derived, never stored: DEL and CHECK find it from the attachment alone, even
// when the pod's namespace is gone or unreachable, and a repeated ADD finds the name
// taken before doing anything.
func hostVethName(o cniplumb.Owner) (string, error) { return link.HostVethName(o) }

// vlanGatewayHost is the host-side veth of a VLAN's gateway pair, derived from
// bridge and VLAN so concurrent ADDs race for one name.
func vlanGatewayHost(bridge string, vlan int) string {
	sum := sha256.Sum256([]byte("vlan-gateway/" + bridge + "/" + strconv.Itoa(vlan)))
	return "veth" + hex.EncodeToString(sum[:])[:11]
}

// vlanGatewayName is the host interface carrying the gateway address of a VLAN, as
// the reference names it.
func vlanGatewayName(bridge string, vlan int) string { return fmt.Sprintf("%s.%d", bridge, vlan) }

// planAttachment plans the links of attachment o into the pod namespace netns.
func planAttachment(c *conf, o cniplumb.Owner, netns string, ch choices) (*attachmentPlan, error) {
	host, err := hostVethName(o)
	if err != nil {
		return nil, err
	}
	podMAC := ch.PodMAC
	if c.MAC != nil {
		podMAC = c.MAC
	}
	n := c.raw
	p := &attachmentPlan{
		Owner: o,
		Bridge: link.BridgeSpec{Name: c.Bridge, MTU: n.MTU, Promisc: n.PromiscMode,
			VlanFiltering: n.Vlan != 0 || n.VlanTrunk != nil, MAC: ch.BridgeMAC},
		Veth: link.VethSpec{HostName: host, HostMAC: ch.HostMAC, PodNetns: netns, PodName: o.IfName, PodMAC: podMAC,
			MTU: n.MTU, Bridge: c.Bridge,
			Port: link.PortSpec{Hairpin: n.HairpinMode, Isolated: n.PortIsolation, Vlan: n.Vlan, Trunk: c.Trunk,
				PreserveDefaultVlan: n.PreserveDefaultVlan},
			// The reference's: routes on the host end are ours (CVE-2020-10749).
			HostSysctls: []link.Sysctl{{Key: "net/ipv6/conf/" + host + "/accept_ra", Value: "0", Optional: true}}},
		Host: link.HostSpec{Bridge: c.Bridge, ForceAddress: n.ForceAddress},
	}
	if n.MacSpoofChk {
		p.Spoof = &netfilter.MacSpoofPlan{Owner: o, HostIf: host, MAC: podMAC}
	}
	if !n.DisableContainerInterface {
		p.Pod = &link.PodSpec{Netns: netns, IfName: o.IfName, Up: true}
	}
	if n.Vlan != 0 && n.IsGateway {
		name := vlanGatewayName(c.Bridge, n.Vlan)
		hostEnd := vlanGatewayHost(c.Bridge, n.Vlan)
		p.Host.VlanGateway = &link.VethSpec{HostName: hostEnd, HostMAC: ch.GatewayMACs[0], PodName: name, PodMAC: ch.GatewayMACs[1],
			MTU: n.MTU, Bridge: c.Bridge, Port: link.PortSpec{Vlan: n.Vlan, PreserveDefaultVlan: n.PreserveDefaultVlan},
			HostSysctls: []link.Sysctl{{Key: "net/ipv6/conf/" + hostEnd + "/accept_ra", Value: "0", Optional: true}}}
	}
	p.Host.Sysctls = nodeSysctls(c, 0)
	return p, nil
}

// nodeSysctls are the node-wide settings bridged pods need: forwarding for the
// families in use when the bridge is the gateway (as the reference), and
// bridge-nf-call-iptables (-ip6tables for IPv6) = 1, the Kubernetes network-plugin
// requirement that lets kube-proxy see bridged traffic. None of them fails the pod:
// an operator may manage them elsewhere, and a pod on a node without br_netfilter
// still has connectivity. They are reported on stderr, which runtimes log.
func nodeSysctls(c *conf, fams netfilter.Families) []link.Sysctl {
	var out []link.Sysctl
	if c.raw.IsGateway && fams.Has(netfilter.IPv4) {
		out = append(out, link.Sysctl{Key: "net/ipv4/ip_forward", Value: "1", Optional: true})
	}
	if c.raw.IsGateway && fams.Has(netfilter.IPv6) {
		out = append(out, link.Sysctl{Key: "net/ipv6/conf/all/forwarding", Value: "1", Optional: true})
	}
	out = append(out, link.Sysctl{Key: "net/bridge/bridge-nf-call-iptables", Value: "1", Optional: true})
	if fams.Has(netfilter.IPv6) {
		out = append(out, link.Sysctl{Key: "net/bridge/bridge-nf-call-ip6tables", Value: "1", Optional: true})
	}
	return out
}

// withAddresses completes the plan from the address plan: the pod's sysctls,
// addresses and routes, the gateways and node sysctls, the masquerade.
func (p *attachmentPlan) withAddresses(c *conf, ap *addrPlan) {
	p.Addrs = ap
	p.Masq = ap.Masq
	ifName := p.Owner.IfName
	pod := p.Pod
	// As the reference (plugins/main/bridge, pkg/ipam ConfigureIface), before any
	// address: enabledad turns on (enhanced) DAD, otherwise DAD is off so IPv6
	// addresses are usable at once; ARP announcements on; and, when the pod gets
	// IPv6, IPv6 enabled on lo and the interface (a pod namespace may have it off)
	// and its addresses kept when the link goes down.
	if c.raw.EnableDad {
		pod.Sysctls = append(pod.Sysctls, link.Sysctl{Key: "net/ipv6/conf/" + ifName + "/enhanced_dad", Value: "1", Optional: true},
			link.Sysctl{Key: "net/ipv6/conf/" + ifName + "/accept_dad", Value: "1", Optional: true})
	} else {
		pod.Sysctls = append(pod.Sysctls, link.Sysctl{Key: "net/ipv6/conf/" + ifName + "/accept_dad", Value: "0", Optional: true})
	}
	pod.Sysctls = append(pod.Sysctls, link.Sysctl{Key: "net/ipv4/conf/" + ifName + "/arp_notify", Value: "1", Optional: true})
	if ap.Families.Has(netfilter.IPv6) {
		pod.Sysctls = append(pod.Sysctls, link.Sysctl{Key: "net/ipv6/conf/lo/disable_ipv6", Value: "0"},
			link.Sysctl{Key: "net/ipv6/conf/" + ifName + "/disable_ipv6", Value: "0"},
			link.Sysctl{Key: "net/ipv6/conf/" + ifName + "/keep_addr_on_down", Value: "1"})
		if c.raw.EnableDad {
			pod.WaitDAD = dadTimeout
		}
	}
	for _, ip := range ap.IPs {
		pod.Addrs = append(pod.Addrs, prefixOf(ip.Address))
	}
	for _, r := range ap.Routes {
		lr := link.Route{Dst: prefixOf(r.Dst).Masked(), Priority: r.Priority, MTU: r.MTU, AdvMSS: r.AdvMSS, Scope: r.Scope}
		if r.GW != nil {
			lr.GW = addrOf(r.GW)
		}
		if r.Table != nil {
			lr.Table = *r.Table
		}
		pod.Routes = append(pod.Routes, lr)
	}
	for _, g := range ap.Gateways {
		p.Host.Gateways = append(p.Host.Gateways, prefixOf(g))
	}
	p.Host.Sysctls = nodeSysctls(c, ap.Families)
}

func addrOf(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}

func prefixOf(n net.IPNet) netip.Prefix {
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(addrOf(n.IP), ones)
}

// String renders the plan, one object per line, in apply order.
func (p *attachmentPlan) String() string {
	var b strings.Builder
	br := p.Bridge
	fmt.Fprintf(&b, "bridge %s mtu=%d promisc=%v vlan_filtering=%v accept_ra=0 (if created: mac %s; else its MAC pinned)\n",
		br.Name, br.MTU, br.Promisc, br.VlanFiltering, br.MAC)
	writeVeth(&b, "veth", p.Veth)
	if p.Spoof != nil {
		b.WriteString(p.Spoof.String())
	}
	if p.Addrs != nil {
		fmt.Fprintf(&b, "ipam lease for %s\n", p.Owner)
	}
	if pod := p.Pod; pod != nil {
		for _, s := range pod.Sysctls {
			fmt.Fprintf(&b, "pod sysctl %s\n", s)
		}
		for _, a := range pod.Addrs {
			fmt.Fprintf(&b, "pod addr %s dev %s\n", a, pod.IfName)
		}
		fmt.Fprintf(&b, "pod up %s\n", pod.IfName)
		for _, r := range pod.Routes {
			fmt.Fprintf(&b, "pod route %s dev %s\n", r, pod.IfName)
		}
		if pod.WaitDAD > 0 {
			fmt.Fprintf(&b, "pod wait for DAD (at most %s)\n", pod.WaitDAD)
		}
	}
	target := p.Host.Bridge
	if v := p.Host.VlanGateway; v != nil && len(p.Host.Gateways) > 0 {
		writeVeth(&b, "vlan gateway veth", *v)
		target = v.PodName
	}
	for _, g := range p.Host.Gateways {
		fmt.Fprintf(&b, "host gateway %s on %s force=%v\n", g, target, p.Host.ForceAddress)
	}
	for _, s := range p.Host.Sysctls {
		fmt.Fprintf(&b, "node sysctl %s\n", s)
	}
	if p.Masq != nil {
		b.WriteString(p.Masq.String())
	}
	return b.String()
}

func writeVeth(b *strings.Builder, what string, v link.VethSpec) {
	where := v.PodNetns
	if where == "" {
		where = "the node"
	}
	fmt.Fprintf(b, "%s %s mac=%s <-> %s in %s mac=%s mtu=%d on %s\n", what, v.HostName, v.HostMAC, v.PodName, where, v.PodMAC, v.MTU, v.Bridge)
	pt := v.Port
	fmt.Fprintf(b, "port %s hairpin=%v isolated=%v vlan=%d trunk=%v preserveDefaultVlan=%v\n", v.HostName, pt.Hairpin, pt.Isolated, pt.Vlan, pt.Trunk, pt.PreserveDefaultVlan)
	for _, s := range v.HostSysctls {
		fmt.Fprintf(b, "host sysctl %s\n", s)
	}
}

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
