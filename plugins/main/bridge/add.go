package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/link"
	"github.com/podwire/podwire/pkg/netfilter"
)

// undoStack holds the inverses of ADD's side effects; a failed ADD runs them backwards.
type undoStack []undoStep

type undoStep struct {
	what string
	do   func() error
}

func (u *undoStack) push(what string, do func() error) { *u = append(*u, undoStep{what, do}) }

// runIfFailed undoes everything when *err is set, reporting undo failures on stderr
// (the runtime's log) without hiding the original error.
func (u *undoStack) runIfFailed(err *error) {
	if *err == nil {
		return
	}
	for i := len(*u) - 1; i >= 0; i-- {
		if uerr := (*u)[i].do(); uerr != nil {
			fmt.Fprintf(os.Stderr, "bridge: undoing failed ADD: %s: %v\n", (*u)[i].what, uerr)
		}
	}
}

func add(ctx context.Context, in *cniplumb.Input) (_ types.Result, err error) {
	c, err := parseConf(in.Stdin, in.Args)
	if err != nil {
		return nil, err
	}
	owner := in.Owner()

	var undo undoStack
	defer undo.runIfFailed(&err)

	// The IPAM plugin starts first: it runs (in this process when it is podwire's
	// host-local, see ipamPlugins) while this one checks the backend and makes the
	// bridge and the veth, none of which depend on the addresses. Its release is the
	// first undo step, so it runs last, after the veth is gone, and waits for the
	// allocation when a later step fails before it returned.
	type ipamOut struct {
		r   types.Result
		err error
	}
	var ipamWait func() ipamOut
	if c.Layer3 {
		ipamDone := make(chan ipamOut, 1)
		go func() {
			r, err := ipamPlugins.Add(ctx, in, c.IPAMType)
			ipamDone <- ipamOut{r, err}
		}()
		var got *ipamOut
		ipamWait = func() ipamOut {
			if got == nil {
				o := <-ipamDone
				got = &o
			}
			return *got
		}
		undo.push("releasing the IPAM lease", func() error {
			if ipamWait().err != nil {
				return nil
			}
			return ipamPlugins.Del(context.WithoutCancel(ctx), in, c.IPAMType)
		})
	}

	// Pick the backend before changing anything on the node: a missing backend is the
	// operator's to fix and must not leave a half-made pod behind.
	var fw netfilter.MasqBackend
	if c.raw.IPMasq && c.Layer3 {
		if fw, _, err = netfilter.OpenMasq(c.Backend); err != nil {
			return nil, err
		}
	}
	podNS, err := ns.GetNS(in.Netns)
	if err != nil {
		return nil, cniplumb.EnvError("CNI_NETNS", "opening network namespace %q: %v", in.Netns, err)
	}
	defer podNS.Close()

	br, err := link.EnsureBridge(link.BridgeSpec{Name: c.Bridge, MTU: c.raw.MTU, Promisc: c.raw.PromiscMode,
		VlanFiltering: c.raw.Vlan != 0 || c.raw.VlanTrunk != nil})
	if err != nil {
		return nil, err
	}

	veth, vethErr := link.CreateVeth(link.VethSpec{PodIfName: in.IfName, PodNSFd: int(podNS.Fd()), PodMAC: c.MAC,
		MTU: c.raw.MTU, BridgeIdx: br.Index}, func(name string) bool { return podHasLink(podNS, name) })
	var portErr error
	if vethErr == nil {
		portErr = link.ConfigurePort(veth.Host, link.PortSpec{Hairpin: c.raw.HairpinMode, Isolated: c.raw.PortIsolation,
			Vlan: c.raw.Vlan, Trunk: c.Trunk, PreserveDefaultVlan: c.raw.PreserveDefaultVlan, DefaultPVID: pvidOf(br)})
	}

	// Errors keep the order the steps had when they ran one after the other: IPAM's
	// first.
	var ipamRes *current.Result
	var ipamErr error
	if c.Layer3 {
		o := ipamWait()
		if o.err != nil {
			ipamErr = fmt.Errorf("IPAM plugin %q: %w", c.IPAMType, o.err)
		} else if ipamRes, ipamErr = current.NewResultFromResult(o.r); ipamErr != nil {
			ipamErr = fmt.Errorf("converting the result of IPAM plugin %q: %w", c.IPAMType, ipamErr)
		}
	}
	if vethErr == nil {
		hostName := veth.Host.Name
		undo.push("deleting veth "+hostName, func() error { return link.DeleteByName(hostName) })
	}
	if ipamErr != nil {
		return nil, ipamErr
	}
	var ap *addrPlan
	if c.Layer3 {
		if ap, err = planAddresses(c, owner, ipamRes); err != nil {
			return nil, err
		}
	}
	if vethErr != nil {
		if errors.Is(vethErr, link.ErrPodIfExists) {
			return nil, fmt.Errorf("%w: %q in %s; the runtime must not ADD the same interface twice", vethErr, in.IfName, in.Netns)
		}
		return nil, vethErr
	}
	if portErr != nil {
		return nil, portErr
	}
	hostName := veth.Host.Name

	if c.raw.MacSpoofChk {
		nft := netfilter.NewNFTables()
		if err := nft.Apply(ctx, netfilter.PlanMacSpoof(owner, hostName, veth.PodMAC)); err != nil {
			return nil, fmt.Errorf("installing macspoofchk for %s: %w", hostName, err)
		}
		undo.push("removing macspoofchk rules", func() error {
			return nft.Remove(context.WithoutCancel(ctx), netfilter.MacSpoofFeature, owner)
		})
	}

	// The masquerade depends only on the addresses: it is installed while the pod
	// interface and the gateway are configured. Its undo step is pushed once both are
	// done, so a failure on either side leaves nothing behind, and errors keep the
	// sequential order (pod, gateway, then masquerade).
	var masqDone chan error
	if ap != nil && ap.Masq != nil {
		masqDone = make(chan error, 1)
		go func() { masqDone <- fw.Apply(ctx, *ap.Masq) }()
	}
	ifs, err := configureNode(c, in, podNS, br, hostName, veth, ap)
	if masqDone != nil {
		if merr := <-masqDone; merr != nil {
			if err == nil {
				err = fmt.Errorf("installing ipMasq rules for %s: %w", owner, merr)
			}
		} else {
			undo.push("removing ipMasq rules", func() error {
				return fw.Remove(context.WithoutCancel(ctx), owner, ap.Masq.Addrs)
			})
		}
	}
	if err != nil {
		return nil, err
	}
	// The bridge's MAC followed the new port or was pinned: report it as it is now, as
	// the reference does.
	brNow, err := netlinksafe.LinkByName(br.Name)
	if err != nil {
		return nil, fmt.Errorf("reading back bridge %q: %w", br.Name, err)
	}
	ifs[0].Mac = brNow.Attrs().HardwareAddr.String()
	var dns types.DNS
	if ipamRes != nil {
		dns = ipamRes.DNS
	}
	return buildResult(c, ifs, ap, dns), nil
}

// configureNode configures the pod interface, then the gateway and the node's sysctls,
// and returns the result's interfaces.
func configureNode(c *conf, in *cniplumb.Input, podNS ns.NetNS, br *netlink.Bridge, hostName string, veth *link.Veth, ap *addrPlan) ([]*current.Interface, error) {
	if err := podNS.Do(func(ns.NetNS) error { return configurePod(c, in.IfName, ap) }); err != nil {
		return nil, fmt.Errorf("configuring %s in %s: %w", in.IfName, in.Netns, err)
	}
	ifs := []*current.Interface{
		{Name: br.Name, Mac: br.HardwareAddr.String()},
		{Name: hostName, Mac: veth.HostMAC.String()},
		{Name: in.IfName, Mac: veth.PodMAC.String(), Sandbox: in.Netns},
	}
	if ap == nil {
		ensureNodeSysctls(c, 0)
		return ifs, nil
	}
	gwIf, err := ensureGateways(c, br, ap)
	if err != nil {
		return nil, err
	}
	if gwIf != nil {
		ifs = append(ifs, gwIf)
	}
	ensureNodeSysctls(c, ap.Families)
	return ifs, nil
}

func pvidOf(br *netlink.Bridge) uint16 {
	if br.VlanDefaultPVID != nil {
		return *br.VlanDefaultPVID
	}
	return 1
}

func podHasLink(podNS ns.NetNS, name string) bool {
	found := false
	_ = podNS.Do(func(ns.NetNS) error {
		_, err := netlinksafe.LinkByName(name)
		found = err == nil
		return nil
	})
	return found
}

// configurePod runs inside the pod's namespace: DAD settings, addresses, up, routes,
// and the wait for IPv6 addresses to become usable.
func configurePod(c *conf, ifName string, ap *addrPlan) error {
	if ap == nil {
		if c.raw.DisableContainerInterface {
			return nil
		}
		l, err := netlinksafe.LinkByName(ifName)
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	}
	// As the reference: enabledad turns on (enhanced) DAD; otherwise DAD is off on the
	// pod interface, so its IPv6 addresses are usable at once. Set before the addresses
	// are added. The knobs are absent when IPv6 is disabled, which is fine.
	if c.raw.EnableDad {
		_ = link.WriteSysctl("net/ipv6/conf/"+ifName+"/enhanced_dad", "1")
		_ = link.WriteSysctl("net/ipv6/conf/"+ifName+"/accept_dad", "1")
	} else {
		_ = link.WriteSysctl("net/ipv6/conf/"+ifName+"/accept_dad", "0")
	}
	_ = link.WriteSysctl("net/ipv4/conf/"+ifName+"/arp_notify", "1")
	l, err := netlinksafe.LinkByName(ifName)
	if err != nil {
		return err
	}
	if slices.ContainsFunc(ap.IPs, func(ip *current.IPConfig) bool { return ip.Address.IP.To4() == nil }) {
		if err := link.PrepareIPv6(ifName); err != nil {
			return err
		}
	}
	var v6 []net.IP
	for _, ip := range ap.IPs {
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: ip.Address.IP, Mask: ip.Address.Mask}}
		if err := netlink.AddrAdd(l, addr); err != nil {
			return fmt.Errorf("adding address %s: %w", ip.Address.String(), err)
		}
		if ip.Address.IP.To4() == nil {
			v6 = append(v6, ip.Address.IP)
		}
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return fmt.Errorf("bringing %s up: %w", ifName, err)
	}
	for _, r := range ap.Routes {
		dst := r.Dst
		nr := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: &dst, Gw: r.GW, Priority: r.Priority}
		if r.MTU > 0 {
			nr.MTU = r.MTU
		}
		if r.AdvMSS > 0 {
			nr.AdvMSS = r.AdvMSS
		}
		if r.Table != nil {
			nr.Table = *r.Table
		}
		if r.Scope != nil {
			nr.Scope = netlink.Scope(*r.Scope)
		}
		if err := netlink.RouteAdd(nr); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("adding route to %s via %v: %w", dst.String(), r.GW, err)
		}
	}
	if c.raw.EnableDad && len(v6) > 0 {
		return waitDAD(l, v6, 10*time.Second)
	}
	return nil
}

// waitDAD waits until none of addrs on l is tentative. A failed DAD (a duplicate on
// the bridge) is an error naming the address.
func waitDAD(l netlink.Link, addrs []net.IP, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		list, err := netlinksafe.AddrList(l, netlink.FAMILY_V6)
		if err != nil {
			return fmt.Errorf("listing IPv6 addresses of %s: %w", l.Attrs().Name, err)
		}
		pending := ""
		for _, a := range list {
			for _, want := range addrs {
				if !a.IP.Equal(want) {
					continue
				}
				if a.Flags&unix.IFA_F_DADFAILED != 0 {
					return fmt.Errorf("IPv6 duplicate address detection failed for %s: another host on the bridge uses it", want)
				}
				if a.Flags&unix.IFA_F_TENTATIVE != 0 {
					pending = want.String()
				}
			}
		}
		if pending == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("IPv6 address %s still tentative after %s", pending, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ensureGateways puts the gateway addresses on the bridge, or on the VLAN's gateway
// interface, and returns that interface for the result when it is not the bridge.
func ensureGateways(c *conf, br *netlink.Bridge, ap *addrPlan) (*current.Interface, error) {
	if len(ap.Gateways) == 0 {
		return nil, nil
	}
	var target netlink.Link = br
	var gwIf *current.Interface
	if c.raw.Vlan != 0 {
		l, err := ensureVlanGateway(c, br)
		if err != nil {
			return nil, err
		}
		target = l
		gwIf = &current.Interface{Name: l.Attrs().Name, Mac: l.Attrs().HardwareAddr.String()}
	}
	for _, gw := range ap.Gateways {
		if err := ensureAddr(target, gw, c.raw.ForceAddress); err != nil {
			return nil, err
		}
	}
	if c.raw.Vlan == 0 {
		// br is as it was before this pod's port joined: keep that MAC from now on.
		if err := link.PinBridgeMAC(br, br.HardwareAddr); err != nil {
			return nil, err
		}
	}
	return gwIf, nil
}

// ensureVlanGateway returns <bridge>.<vlan>, the reference's gateway interface for a
// VLAN: one end of a veth pair in the node's namespace whose other end is an access
// port of that VLAN on the bridge. Concurrent ADDs may race to create it.
func ensureVlanGateway(c *conf, br *netlink.Bridge) (netlink.Link, error) {
	name := vlanGatewayName(c.Bridge, c.raw.Vlan)
	if l, err := netlinksafe.LinkByName(name); err == nil {
		return l, nil
	}
	hostNS, err := ns.GetCurrentNS()
	if err != nil {
		return nil, err
	}
	defer hostNS.Close()
	v, err := link.CreateVeth(link.VethSpec{PodIfName: name, PodNSFd: int(hostNS.Fd()), MTU: c.raw.MTU, BridgeIdx: br.Index},
		func(n string) bool { _, err := netlinksafe.LinkByName(n); return err == nil })
	if err != nil && !errors.Is(err, link.ErrPodIfExists) {
		return nil, fmt.Errorf("creating VLAN gateway interface %s: %w", name, err)
	}
	if err == nil {
		if err := link.ConfigurePort(v.Host, link.PortSpec{Vlan: c.raw.Vlan, PreserveDefaultVlan: c.raw.PreserveDefaultVlan, DefaultPVID: pvidOf(br)}); err != nil {
			return nil, err
		}
	}
	l, err := netlinksafe.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("looking up VLAN gateway interface %s: %w", name, err)
	}
	if l.Attrs().Flags&net.FlagUp == 0 {
		if err := netlink.LinkSetUp(l); err != nil {
			return nil, fmt.Errorf("bringing %s up: %w", name, err)
		}
	}
	return l, nil
}

// ensureAddr puts gw on l. Another IPv4 address on l, or an overlapping IPv6 one, is an
// error unless forceAddress, which replaces it (the reference's rules).
func ensureAddr(l netlink.Link, gw net.IPNet, force bool) error {
	fam := netlink.FAMILY_V4
	if gw.IP.To4() == nil {
		fam = netlink.FAMILY_V6
	}
	addrs, err := netlinksafe.AddrList(l, fam)
	if err != nil {
		return fmt.Errorf("listing addresses of %s: %w", l.Attrs().Name, err)
	}
	for _, a := range addrs {
		if a.IPNet.String() == gw.String() {
			return nil
		}
		if a.IP.IsLinkLocalUnicast() {
			continue
		}
		if fam == netlink.FAMILY_V4 || a.IPNet.Contains(gw.IP) || gw.Contains(a.IP) {
			if !force {
				return fmt.Errorf("%q already has address %s, not the gateway %s; set \"forceAddress\": true to replace it, or fix the subnet", l.Attrs().Name, a.IPNet, gw.String())
			}
			if err := netlink.AddrDel(l, &a); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
				return fmt.Errorf("removing %s from %s: %w", a.IPNet, l.Attrs().Name, err)
			}
		}
	}
	if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &gw}); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("adding gateway %s to %s: %w", gw.String(), l.Attrs().Name, err)
	}
	return nil
}
