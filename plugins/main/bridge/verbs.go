package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/link"
	"github.com/podwire/podwire/pkg/netfilter"
)

// del removes the pod's veth, its masquerade and spoof-check rules and its lease. Every
// step runs even when an earlier one failed, and what is already gone is success. A
// vanished netns still gets its rules and lease removed: rules are found by owner, so
// no address is needed (the reference skips its rule cleanup then and leaks chains).
func del(ctx context.Context, in *cniplumb.Input) error {
	defer netfilter.ReleaseOffExit() // a child waits for the kernel to free deleted rules
	c, err := parseTeardownConf(in.Stdin, in.Args)
	if err != nil {
		return err
	}
	owner := in.Owner()
	// The steps are independent (rules are found by owner, the lease by attachment),
	// so they run at once; errors are reported in this order. The lease is released
	// while the veth is deleted; the reference releases it first.
	var steps []chan error
	step := func(f func() error) {
		ch := make(chan error, 1)
		steps = append(steps, ch)
		go func() { ch <- f() }()
	}
	if c.raw.IPMasq && c.Layer3 {
		// Both layouts, as the reference does: the pod may have been made by the
		// reference plugin or with another ipMasqBackend. The addresses in prevResult
		// keep ip6tables out of it for an IPv4-only pod.
		step(func() error {
			if err := netfilter.RemoveMasq(ctx, owner, prevAddrs(in.PrevResult)); err != nil {
				return fmt.Errorf("removing ipMasq rules of %s: %w", owner, err)
			}
			return nil
		})
	}
	if c.raw.MacSpoofChk {
		step(func() error {
			if err := netfilter.NewNFTables().Remove(ctx, netfilter.MacSpoofFeature, owner); err != nil {
				return fmt.Errorf("removing macspoofchk rules of %s: %w", owner, err)
			}
			return nil
		})
	}
	if in.Netns != "" {
		// Deleting the pod interface deletes its host peer too. DEL returns once both
		// have left their namespaces; a child of this plugin waits out the kernel's
		// freeing (link.DeleteOffExit).
		step(func() error {
			err := link.DeleteOffExit(in.Netns, in.IfName)
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("deleting %s in %s: %w", in.IfName, in.Netns, err)
			}
			return nil
		})
	}
	if c.Layer3 {
		step(func() error {
			if err := ipamPlugins.Del(ctx, in, c.IPAMType); err != nil {
				return fmt.Errorf("IPAM plugin %q: %w", c.IPAMType, err)
			}
			return nil
		})
	}
	var errs []error
	for _, ch := range steps {
		errs = append(errs, <-ch)
	}
	return errors.Join(errs...)
}

// check verifies what ADD made against prevResult: the bridge, the pod interface with
// its addresses and routes, the host veth as its peer on the bridge, and the rules.
func check(ctx context.Context, in *cniplumb.Input) error {
	c, err := parseConf(in.Stdin, in.Args)
	if err != nil {
		return err
	}
	prev, err := in.RequirePrevResult()
	if err != nil {
		return err
	}
	if c.Layer3 {
		if err := ipamPlugins.Check(ctx, in, c.IPAMType); err != nil {
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
	bl, err := netlinksafe.LinkByName(c.Bridge)
	if err != nil {
		return fmt.Errorf("bridge %s: %w", c.Bridge, err)
	}
	br, ok := bl.(*netlink.Bridge)
	if !ok {
		return fmt.Errorf("%s is a %s, not a bridge", c.Bridge, bl.Type())
	}
	if (br.Promisc != 0) != c.raw.PromiscMode {
		return fmt.Errorf("bridge %s promiscuous mode is %v, configured %v", c.Bridge, br.Promisc != 0, c.raw.PromiscMode)
	}

	var pod netlink.Link
	err = ns.WithNetNSPath(in.Netns, func(ns.NetNS) error {
		if pod, err = netlinksafe.LinkByName(in.IfName); err != nil {
			return fmt.Errorf("pod interface %s: %w", in.IfName, err)
		}
		if _, ok := pod.(*netlink.Veth); !ok {
			return fmt.Errorf("pod interface %s is a %s, not a veth", in.IfName, pod.Type())
		}
		if podIf.Mac != "" && podIf.Mac != pod.Attrs().HardwareAddr.String() {
			return fmt.Errorf("pod interface %s has MAC %s, prevResult says %s", in.IfName, pod.Attrs().HardwareAddr, podIf.Mac)
		}
		return checkAddrsRoutes(pod, prev, podIndexIn(prev, podIf))
	})
	if err != nil {
		return err
	}
	// The host end: the veth whose peer is the pod interface, enslaved to the bridge.
	found := false
	for _, h := range hostIfs {
		l, err := netlinksafe.LinkByName(h.Name)
		if err != nil {
			continue
		}
		if _, ok := l.(*netlink.Veth); !ok || l.Attrs().Index != pod.Attrs().ParentIndex {
			continue
		}
		if l.Attrs().MasterIndex != br.Index {
			return fmt.Errorf("host veth %s is not on bridge %s; run DEL and ADD again", h.Name, c.Bridge)
		}
		found = true
	}
	if !found {
		return fmt.Errorf("no host veth in prevResult is the peer of %s on bridge %s", in.IfName, c.Bridge)
	}
	if c.raw.IPMasq && c.Layer3 {
		ap, err := planAddresses(c, in.Owner(), &current.Result{IPs: prev.IPs})
		if err != nil {
			return err
		}
		if err := netfilter.CheckMasq(ctx, c.Backend, *ap.Masq); err != nil {
			return fmt.Errorf("ipMasq rules: %w", err)
		}
	}
	if c.raw.MacSpoofChk {
		mac, _ := net.ParseMAC(podIf.Mac)
		var hostName string
		for _, h := range hostIfs {
			if h.Name != c.Bridge {
				hostName = h.Name
				break
			}
		}
		if err := netfilter.NewNFTables().Check(ctx, netfilter.PlanMacSpoof(in.Owner(), hostName, mac)); err != nil {
			return fmt.Errorf("macspoofchk rules: %w", err)
		}
	}
	return nil
}

func podIndexIn(r *current.Result, podIf *current.Interface) int {
	for i, x := range r.Interfaces {
		if x == podIf {
			return i
		}
	}
	return -1
}

// checkAddrsRoutes runs in the pod's namespace.
func checkAddrsRoutes(pod netlink.Link, prev *current.Result, podIdx int) error {
	addrs, err := netlinksafe.AddrList(pod, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("listing addresses of %s: %w", pod.Attrs().Name, err)
	}
	for _, ip := range prev.IPs {
		if ip.Interface != nil && *ip.Interface != podIdx {
			continue
		}
		ok := false
		for _, a := range addrs {
			if a.IPNet.String() == ip.Address.String() {
				ok = true
			}
		}
		if !ok {
			return fmt.Errorf("address %s is missing from %s", ip.Address.String(), pod.Attrs().Name)
		}
	}
	for _, r := range prev.Routes {
		dst := r.Dst
		routes, err := netlinksafe.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Dst: &dst, Table: 0}, netlink.RT_FILTER_DST)
		if err != nil {
			return fmt.Errorf("listing routes to %s: %w", dst.String(), err)
		}
		ok := false
		for _, rt := range routes {
			if r.GW == nil || rt.Gw.Equal(r.GW) {
				ok = true
			}
		}
		if !ok {
			return fmt.Errorf("route to %s via %v is missing in the pod", dst.String(), r.GW)
		}
	}
	return nil
}

// gc forwards to the IPAM plugin, then removes the ipMasq and macspoofchk rules of this
// network's attachments that are not in cni.dev/valid-attachments, in every backend the
// node offers (a node may have switched ipMasqBackend).
func gc(ctx context.Context, in *cniplumb.Input) error {
	defer netfilter.ReleaseOffExit()
	c, err := parseTeardownConf(in.Stdin, in.Args)
	if err != nil {
		return err
	}
	var errs []error
	if c.Layer3 {
		if err := ipamPlugins.GC(ctx, in, c.IPAMType); err != nil {
			errs = append(errs, fmt.Errorf("IPAM plugin %q: %w", c.IPAMType, err))
		}
	}
	if err := netfilter.GCMasq(ctx, in.Conf.Name, in.ValidAttachments); err != nil {
		errs = append(errs, fmt.Errorf("removing stale ipMasq rules: %w", err))
	}
	if netfilter.ProbeHost().NFTables {
		if err := netfilter.NewNFTables().GC(ctx, netfilter.MacSpoofFeature, in.Conf.Name, in.ValidAttachments); err != nil {
			errs = append(errs, fmt.Errorf("removing stale macspoofchk rules: %w", err))
		}
	}
	return errors.Join(errs...)
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

// status forwards to the IPAM plugin and reports a configured ipMasq backend the node
// cannot run (code 50).
func status(ctx context.Context, in *cniplumb.Input) error {
	c, err := parseTeardownConf(in.Stdin, in.Args)
	if err != nil {
		return err
	}
	if c.raw.IPMasq && c.Layer3 {
		if _, _, err := netfilter.OpenMasq(c.Backend); err != nil {
			return err
		}
	}
	if c.Layer3 {
		if err := ipamPlugins.Status(ctx, in, c.IPAMType); err != nil {
			return fmt.Errorf("IPAM plugin %q: %w", c.IPAMType, err)
		}
	}
	return nil
}
