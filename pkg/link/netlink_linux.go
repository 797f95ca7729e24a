// SPDX-License-Identifier: Apache-2.0

package link

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// Netlink is the Backend on the kernel: the node is the network namespace the plugin
// runs in, pods are namespaces named by path. Work inside a pod's namespace runs on a
// thread locked into it (ns.Do), since its sysctls are only reachable from there.
//
// ConfigurePod and ConfigureHost are not undone on failure: the first changes only the
// fresh pod interface, which the caller's undo deletes; the second's gateway addresses
// and node sysctls are shared by every pod of the bridge and stay, as the reference's.
type Netlink struct {
	loadBrNetfilter sync.Once
}

var _ Backend = (*Netlink)(nil)

// NewNetlink returns the kernel backend.
func NewNetlink() *Netlink { return &Netlink{} }

// openNetns opens the namespace at path; one that is gone or is not a network
// namespace is IsNotFound.
func openNetns(path string) (ns.NetNS, error) {
	n, err := ns.GetNS(path)
	var gone ns.NSPathNotExistErr
	var notNS ns.NSPathNotNSErr
	if errors.As(err, &gone) || errors.As(err, &notNS) {
		return nil, notFound("network namespace %s does not exist or is not a network namespace: %v", path, err)
	}
	if err != nil {
		return nil, fmt.Errorf("opening network namespace %s: %w", path, err)
	}
	return n, nil
}

// in runs f in the namespace at path ("" for the node's, where the plugin runs).
func in(path string, f func() error) error {
	if path == "" {
		return f()
	}
	n, err := openNetns(path)
	if err != nil {
		return err
	}
	defer n.Close()
	return n.Do(func(ns.NetNS) error { return f() })
}

// EnsureBridge implements Backend. The bridge usually exists (every pod after the
// node's first), so it is looked up first: one request instead of a refused create
// plus the lookup.
func (b *Netlink) EnsureBridge(_ context.Context, s BridgeSpec) (Bridge, error) {
	created := false
	l, err := netlinksafe.LinkByName(s.Name)
	if isKernelNotFound(err) {
		if created, err = createBridge(s); err != nil {
			return Bridge{}, err
		}
		l, err = netlinksafe.LinkByName(s.Name)
	}
	if err != nil {
		return Bridge{}, fmt.Errorf("looking up bridge %q: %w", s.Name, err)
	}
	br, ok := l.(*netlink.Bridge)
	if !ok {
		return Bridge{}, fmt.Errorf("device %q exists but is a %s, not a bridge: pick another \"bridge\" name in the conflist or remove the device", s.Name, l.Type())
	}
	// Routes on the bridge are ours; a router advertisement must not add others
	// (CVE-2020-10749). Absent when IPv6 is off, which is fine.
	_ = ensureSysctl("net/ipv6/conf/"+s.Name+"/accept_ra", "0")
	if s.Promisc && br.Promisc == 0 {
		if err := netlink.SetPromiscOn(br); err != nil {
			return Bridge{}, fmt.Errorf("setting bridge %q promiscuous: %w", s.Name, err)
		}
	}
	if br.Flags&net.FlagUp == 0 {
		if err := netlink.LinkSetUp(br); err != nil {
			return Bridge{}, fmt.Errorf("bringing bridge %q up: %w", s.Name, err)
		}
	}
	pvid := uint16(1)
	if br.VlanDefaultPVID != nil {
		pvid = *br.VlanDefaultPVID
	}
	return Bridge{Name: s.Name, Index: br.Index, MAC: br.HardwareAddr, Created: created, DefaultPVID: pvid}, nil
}

// createBridge creates the bridge of s; it reports false when another process created
// a device of that name first (EEXIST), which the caller then checks. As the
// reference's, the bridge gets no MAC of its own (the kernel gives it the lowest of its
// ports' until one is set; PinBridgeMAC sets one where the reference does).
func createBridge(s BridgeSpec) (bool, error) {
	attrs := netlink.NewLinkAttrs()
	attrs.Name, attrs.MTU = s.Name, s.MTU
	br := &netlink.Bridge{LinkAttrs: attrs}
	if s.VlanFiltering {
		on := true
		br.VlanFiltering = &on
	}
	if err := netlink.LinkAdd(br); err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) && s.VlanFiltering {
			return false, fmt.Errorf("creating bridge %q with VLAN filtering: %w; the kernel lacks CONFIG_BRIDGE_VLAN_FILTERING, so drop \"vlan\"/\"vlanTrunk\" or use a kernel with it", s.Name, err)
		}
		if !errors.Is(err, unix.EEXIST) {
			return false, fmt.Errorf("creating bridge %q: %w", s.Name, err)
		}
		return false, nil
	}
	return true, nil
}

// PinBridgeMAC implements Backend. Setting a bridge's MAC, even to the one it has,
// pins it (the kernel stops picking it from the ports), and also flushes the bridge's
// neighbour table, so it is done only when the bridge may still follow its ports:
// its MAC is zero (its last port left), changed since before (this call's port was
// the lowest), or belongs to a port (the bridge's forwarding entry for it points at
// a port, not at the bridge). A bridge whose MAC is its own stays as it is.
func (b *Netlink) PinBridgeMAC(_ context.Context, bridge string, before net.HardwareAddr) (net.HardwareAddr, error) {
	l, err := netlinksafe.LinkByName(bridge)
	if err != nil {
		return nil, fmt.Errorf("looking up bridge %q: %w", bridge, err)
	}
	cur := l.Attrs().HardwareAddr
	target := cur
	switch {
	case isZeroMAC(cur) && isZeroMAC(before):
		if target, err = RandomMAC(); err != nil {
			return nil, err
		}
	case isZeroMAC(cur) || !bytes.Equal(cur, before) && !isZeroMAC(before):
		target = before
	default:
		owner, err := fdbOwner(l.Attrs().Index, cur)
		if err != nil {
			return nil, fmt.Errorf("looking up the forwarding entry of bridge %s's MAC %s: %w", bridge, cur, err)
		}
		if owner == l.Attrs().Index {
			return cur, nil
		}
	}
	if err := netlink.LinkSetHardwareAddr(l, target); err != nil {
		return nil, fmt.Errorf("pinning the MAC of bridge %s to %s: %w", bridge, target, err)
	}
	return target, nil
}

// fdbOwner returns the ifindex of the device the bridge's forwarding entry for mac
// points at (the bridge itself for its own address, a port for a port's), 0 when
// there is none: one RTM_GETNEIGH, as `bridge fdb get <mac> br <bridge>`.
func fdbOwner(bridgeIndex int, mac net.HardwareAddr) (int, error) {
	req := nl.NewNetlinkRequest(unix.RTM_GETNEIGH, 0)
	req.AddData(&netlink.Ndmsg{Family: unix.AF_BRIDGE})
	req.AddData(nl.NewRtAttr(unix.NDA_LLADDR, mac))
	req.AddData(nl.NewRtAttr(unix.NDA_MASTER, nl.Uint32Attr(uint32(bridgeIndex))))
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWNEIGH)
	if errors.Is(err, unix.ENOENT) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	if len(msgs) == 0 {
		return 0, nil
	}
	n, err := netlink.NeighDeserialize(msgs[0])
	if err != nil {
		return 0, err
	}
	return n.LinkIndex, nil
}

// CreateVeth implements Backend.
func (b *Netlink) CreateVeth(_ context.Context, s VethSpec) (err error) {
	var peerNS netlink.NsFd
	if s.PodNetns == "" {
		self, err := ns.GetCurrentNS()
		if err != nil {
			return err
		}
		defer self.Close()
		peerNS = netlink.NsFd(self.Fd())
	} else {
		pod, err := openNetns(s.PodNetns)
		if err != nil {
			return err
		}
		defer pod.Close()
		peerNS = netlink.NsFd(pod.Fd())
	}
	br, err := netlinksafe.LinkByName(s.Bridge)
	if err != nil {
		return fmt.Errorf("looking up bridge %s: %w", s.Bridge, err)
	}
	attrs := netlink.NewLinkAttrs()
	attrs.Name, attrs.MTU, attrs.HardwareAddr = s.HostName, s.MTU, s.HostMAC
	attrs.Flags = net.FlagUp
	attrs.MasterIndex = br.Attrs().Index
	// The reference's txqueuelens: it creates the pair from the pod's side with the
	// library's defaults, so the pod end gets the kernel's veth default (1000) and its
	// peer, the host end, an explicit 0. The library sends the peer's length unless it
	// is negative, falling back to the main end's, so both are set here.
	attrs.TxQLen = 0
	v := &netlink.Veth{LinkAttrs: attrs, PeerName: s.PodName, PeerHardwareAddr: s.PodMAC, PeerNamespace: peerNS,
		PeerTxQLen: 1000}
	if s.MTU > 0 {
		v.PeerMTU = uint32(s.MTU)
	}
	// One request creates both ends, the pod's directly in its namespace under its
	// final name, and enslaves the host end: the kernel does all of it or none.
	if err := netlink.LinkAdd(v); err != nil {
		if errors.Is(err, unix.EEXIST) {
			if _, lerr := netlinksafe.LinkByName(s.HostName); lerr == nil {
				return exists("creating veth %s: a device of that name already exists", s.HostName)
			}
			return exists("creating veth for %q: an interface of that name already exists in %s", s.PodName, nsName(s.PodNetns))
		}
		if errors.Is(err, unix.EADDRNOTAVAIL) {
			return fmt.Errorf("creating veth pair %s/%s: the kernel rejects MAC %s or %s (multicast or all-zero); pass a unicast MAC: %w", s.HostName, s.PodName, s.PodMAC, s.HostMAC, err)
		}
		return fmt.Errorf("creating veth pair %s/%s: %w", s.HostName, s.PodName, err)
	}
	defer func() {
		if err != nil {
			if derr := deleteLink(s.HostName); derr != nil {
				err = fmt.Errorf("%w (deleting the new veth %s also failed: %v)", err, s.HostName, derr)
			}
		}
	}()
	if err := configurePort(v, s.Port, pvidOf(br)); err != nil {
		return err
	}
	for _, sc := range s.HostSysctls {
		if err := ensureSysctl(sc.Key, sc.Value); err != nil && !sc.Optional {
			return err
		}
	}
	return nil
}

func pvidOf(l netlink.Link) uint16 {
	if br, ok := l.(*netlink.Bridge); ok && br.VlanDefaultPVID != nil {
		return *br.VlanDefaultPVID
	}
	return 1
}

// configurePort applies s to the host veth; a fresh port already has hairpin and
// isolation off, so only what differs from the defaults costs a request.
func configurePort(l netlink.Link, s PortSpec, defaultPVID uint16) error {
	name := l.Attrs().Name
	if s.Hairpin {
		if err := netlink.LinkSetHairpin(l, true); err != nil {
			return fmt.Errorf("enabling hairpin on %s: %w", name, err)
		}
	}
	if s.Isolated {
		if err := netlink.LinkSetIsolated(l, true); err != nil {
			return fmt.Errorf("isolating port %s: %w", name, err)
		}
	}
	if s.Vlan == 0 && len(s.Trunk) == 0 {
		return nil
	}
	if !s.PreserveDefaultVlan {
		// A new port holds only the bridge's default PVID; removing it is what the
		// reference does by listing every port's VLANs, without the dump.
		if err := netlink.BridgeVlanDel(l, defaultPVID, true, true, false, true); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("removing default VLAN %d from %s: %w", defaultPVID, name, err)
		}
	}
	if s.Vlan != 0 {
		if err := netlink.BridgeVlanAdd(l, uint16(s.Vlan), true, true, false, true); err != nil {
			return fmt.Errorf("setting VLAN %d on %s: %w", s.Vlan, name, err)
		}
	}
	for _, v := range s.Trunk {
		if err := netlink.BridgeVlanAdd(l, uint16(v), false, false, false, true); err != nil {
			return fmt.Errorf("adding trunk VLAN %d to %s: %w", v, name, err)
		}
	}
	if s.Vlan == 0 && len(s.Trunk) > 0 {
		// As the reference: a trunk without an access VLAN keeps VLAN 1 native.
		if err := netlink.BridgeVlanAdd(l, 1, true, true, false, true); err != nil {
			return fmt.Errorf("setting native VLAN 1 on %s: %w", name, err)
		}
	}
	return nil
}

// ConfigurePod implements Backend.
func (b *Netlink) ConfigurePod(_ context.Context, s PodSpec) error {
	return in(s.Netns, func() error {
		for _, sc := range s.Sysctls {
			if err := ensureSysctl(sc.Key, sc.Value); err != nil && !sc.Optional {
				return fmt.Errorf("in %s: %w", s.Netns, err)
			}
		}
		l, err := netlinksafe.LinkByName(s.IfName)
		if err != nil {
			return fmt.Errorf("pod interface %s in %s: %w", s.IfName, s.Netns, err)
		}
		var v6 []netip.Addr
		for _, a := range s.Addrs {
			if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: prefixNet(a)}); err != nil {
				return fmt.Errorf("adding address %s to %s: %w", a, s.IfName, err)
			}
			if a.Addr().Is6() {
				v6 = append(v6, a.Addr())
			}
		}
		if s.Up {
			if err := netlink.LinkSetUp(l); err != nil {
				return fmt.Errorf("bringing %s up: %w", s.IfName, err)
			}
		}
		for _, r := range s.Routes {
			if err := netlink.RouteAdd(netlinkRoute(l.Attrs().Index, r)); err != nil && !errors.Is(err, unix.EEXIST) {
				return fmt.Errorf("adding route %s: %w", r, err)
			}
		}
		if s.WaitDAD > 0 && len(v6) > 0 {
			return waitDAD(l, v6, s.WaitDAD)
		}
		return nil
	})
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func netlinkRoute(index int, r Route) *netlink.Route {
	nr := &netlink.Route{LinkIndex: index, Dst: prefixNet(r.Dst), Priority: r.Priority, MTU: r.MTU, AdvMSS: r.AdvMSS, Table: r.Table}
	if r.GW.IsValid() {
		nr.Gw = r.GW.AsSlice()
	}
	if r.Scope != nil {
		nr.Scope = netlink.Scope(*r.Scope)
	}
	return nr
}

// waitDAD waits until none of addrs on l is tentative. A failed DAD (a duplicate on
// the bridge) is an error naming the address.
func waitDAD(l netlink.Link, addrs []netip.Addr, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		list, err := netlinksafe.AddrList(l, netlink.FAMILY_V6)
		if err != nil {
			return fmt.Errorf("listing IPv6 addresses of %s: %w", l.Attrs().Name, err)
		}
		pending := ""
		for _, a := range list {
			ip, _ := netip.AddrFromSlice(a.IP)
			for _, want := range addrs {
				if ip != want {
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

// ConfigureHost implements Backend.
func (b *Netlink) ConfigureHost(ctx context.Context, s HostSpec) (HostResult, error) {
	var res HostResult
	target, err := netlinksafe.LinkByName(s.Bridge)
	if err != nil {
		return res, fmt.Errorf("looking up bridge %s: %w", s.Bridge, err)
	}
	if v := s.VlanGateway; v != nil && len(s.Gateways) > 0 {
		if target, err = b.ensureVlanGateway(ctx, *v); err != nil {
			return res, err
		}
		res.GatewayIf = &Iface{Name: target.Attrs().Name, MAC: target.Attrs().HardwareAddr}
	}
	for _, gw := range s.Gateways {
		if err := ensureAddr(target, gw, s.ForceAddress); err != nil {
			return res, err
		}
	}
	for _, sc := range s.Sysctls {
		if filepath.Dir(sc.Key) == "net/bridge" {
			b.loadBrNetfilter.Do(func() {
				if err := ensureBrNetfilter(); err != nil {
					res.Warnings = append(res.Warnings, fmt.Errorf("net/bridge is absent and br_netfilter could not be loaded (%v); bridged pod traffic bypasses iptables (kube-proxy); load br_netfilter on the node", err))
				}
			})
		}
		if err := ensureSysctl(sc.Key, sc.Value); err != nil {
			if !sc.Optional {
				return res, err
			}
			res.Warnings = append(res.Warnings, err)
		}
	}
	return res, nil
}

// ensureVlanGateway returns the VLAN's gateway interface, creating the pair when
// missing. Concurrent ADDs race to create it; the loser finds it.
func (b *Netlink) ensureVlanGateway(ctx context.Context, v VethSpec) (netlink.Link, error) {
	l, err := netlinksafe.LinkByName(v.PodName)
	if isKernelNotFound(err) {
		if err := b.CreateVeth(ctx, v); err != nil && !IsExists(err) {
			return nil, fmt.Errorf("creating VLAN gateway interface %s: %w", v.PodName, err)
		}
		l, err = netlinksafe.LinkByName(v.PodName)
	}
	if err != nil {
		return nil, fmt.Errorf("looking up VLAN gateway interface %s: %w", v.PodName, err)
	}
	if l.Attrs().Flags&net.FlagUp == 0 {
		if err := netlink.LinkSetUp(l); err != nil {
			return nil, fmt.Errorf("bringing %s up: %w", v.PodName, err)
		}
	}
	return l, nil
}

// ensureAddr puts gw on l. Another IPv4 address on l, or an overlapping IPv6 one, is an
// error unless force, which replaces it (the reference's rules).
func ensureAddr(l netlink.Link, gw netip.Prefix, force bool) error {
	fam := netlink.FAMILY_V4
	if gw.Addr().Is6() {
		fam = netlink.FAMILY_V6
	}
	addrs, err := netlinksafe.AddrList(l, fam)
	if err != nil {
		return fmt.Errorf("listing addresses of %s: %w", l.Attrs().Name, err)
	}
	want := prefixNet(gw)
	for _, a := range addrs {
		if a.IPNet.String() == want.String() {
			return nil
		}
		if a.IP.IsLinkLocalUnicast() {
			continue
		}
		if fam == netlink.FAMILY_V4 || a.IPNet.Contains(want.IP) || want.Contains(a.IP) {
			if !force {
				return fmt.Errorf("%q already has address %s, not the gateway %s; set \"forceAddress\": true to replace it, or fix the subnet", l.Attrs().Name, a.IPNet, gw)
			}
			if err := netlink.AddrDel(l, &a); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
				return fmt.Errorf("removing %s from %s: %w", a.IPNet, l.Attrs().Name, err)
			}
		}
	}
	if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: want}); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("adding gateway %s to %s: %w", gw, l.Attrs().Name, err)
	}
	return nil
}

// Delete implements Backend. It returns when the kernel's RTM_DELLINK answer comes,
// which is after the kernel has waited for the link's memory to be freeable (an RCU
// barrier: most of a veth deletion's cost, ~5-15 ms on a small VM). That wait is paid
// here, in the plugin's own process: a runtime counts on nothing the plugin started
// outliving it. A missing link, or a missing namespace, is success (DEL may repeat).
func (b *Netlink) Delete(_ context.Context, r Ref) error {
	err := in(r.Netns, func() error { return deleteLink(r.Name) })
	if IsNotFound(err) {
		return nil
	}
	return err
}

// deleteLink deletes the named link of the calling thread's namespace, synchronously;
// a missing link is success (DEL, and the undo of a half-made veth).
func deleteLink(name string) error {
	l, err := netlinksafe.LinkByName(name)
	if isKernelNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("looking up %s: %w", name, err)
	}
	if err := netlink.LinkDel(l); err != nil && !isKernelNotFound(err) {
		return fmt.Errorf("deleting %s: %w", name, err)
	}
	return nil
}

// Inspect implements Backend.
func (b *Netlink) Inspect(_ context.Context, r Ref) (Info, error) {
	var info Info
	err := in(r.Netns, func() error {
		l, err := netlinksafe.LinkByName(r.Name)
		if isKernelNotFound(err) {
			return notFound("%s does not exist", r)
		}
		if err != nil {
			return fmt.Errorf("looking up %s: %w", r, err)
		}
		a := l.Attrs()
		info = Info{Kind: l.Type(), Index: a.Index, PeerIndex: a.ParentIndex, MasterIndex: a.MasterIndex,
			MAC: a.HardwareAddr, Promisc: a.Promisc != 0, Up: a.Flags&net.FlagUp != 0}
		addrs, err := netlinksafe.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return fmt.Errorf("listing addresses of %s: %w", r, err)
		}
		for _, ad := range addrs {
			ip, _ := netip.AddrFromSlice(ad.IP)
			ones, _ := ad.Mask.Size()
			info.Addrs = append(info.Addrs, netip.PrefixFrom(ip.Unmap(), ones))
		}
		if r.Netns == "" {
			return nil // routes matter only in the pod
		}
		routes, err := netlinksafe.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{LinkIndex: a.Index, Table: unix.RT_TABLE_UNSPEC},
			netlink.RT_FILTER_OIF|netlink.RT_FILTER_TABLE)
		if err != nil {
			return fmt.Errorf("listing routes of %s: %w", r, err)
		}
		for _, rt := range routes {
			if rt.Dst == nil {
				continue
			}
			dst, _ := netip.AddrFromSlice(rt.Dst.IP)
			ones, _ := rt.Dst.Mask.Size()
			gw, _ := netip.AddrFromSlice(rt.Gw)
			info.Routes = append(info.Routes, Route{Dst: netip.PrefixFrom(dst.Unmap(), ones), GW: gw.Unmap(), Priority: rt.Priority, Table: rt.Table})
		}
		return nil
	})
	return info, err
}

// ensureBrNetfilter loads the br_netfilter module without modprobe when
// /proc/sys/net/bridge is absent: finit_module on the module file of the running
// kernel, letting the kernel decompress it. Its dependency (bridge) is loaded
// already, since the bridge device exists.
func ensureBrNetfilter() error {
	if _, err := os.Stat("/proc/sys/net/bridge"); err == nil {
		return nil
	}
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return err
	}
	release := unix.ByteSliceToString(u.Release[:])
	base := filepath.Join("/lib/modules", release, "kernel/net/bridge/br_netfilter.ko")
	for _, ext := range []string{"", ".xz", ".zst", ".gz"} {
		f, err := os.Open(base + ext)
		if err != nil {
			continue
		}
		flags := 0
		if ext != "" {
			flags = unix.MODULE_INIT_COMPRESSED_FILE
		}
		err = unix.FinitModule(int(f.Fd()), "", flags)
		f.Close()
		if err != nil && err != unix.EEXIST {
			return fmt.Errorf("finit_module %s: %w", base+ext, err)
		}
		if _, err := os.Stat("/proc/sys/net/bridge"); err != nil {
			return fmt.Errorf("br_netfilter loaded but /proc/sys/net/bridge is still absent")
		}
		return nil
	}
	return fmt.Errorf("no br_netfilter module under /lib/modules/%s", release)
}
