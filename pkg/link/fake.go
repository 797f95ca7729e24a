// SPDX-License-Identifier: Apache-2.0

package link

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
)

// Fake is an in-memory kernel for unit tests of the link work: network namespaces
// holding bridges and veth pairs, their addresses, routes and sysctls. It keeps the
// kernel's rules that matter to the bridge plugin: a taken name fails a create, a
// veth pair lives and dies as one (deleting either end, or the namespace of either
// end, removes both), a bridge that was never given a MAC takes the lowest MAC of its
// ports (zero once its last port left) until one is set, the kernel refuses IPv6
// addresses where disable_ipv6 is 1 and routes via a gateway that is not on-link.
// Every method is all or nothing (stricter than the kernel backend needs to be).
// Dump prints the state, sorted.
type Fake struct {
	mu    sync.Mutex
	ns    map[string]*fakeNS // by path; "" is the node's namespace
	index int
	fail  map[string]error
}

var _ Backend = (*Fake)(nil)

type fakeNS struct {
	links   map[string]*fakeLink
	sysctls map[string]string
	// ipv6Off is the namespace's net.ipv6.conf.default.disable_ipv6=1.
	ipv6Off bool
}

type fakeLink struct {
	kind, name string
	index      int
	mac        net.HardwareAddr
	mtu        int
	up         bool
	promisc    bool
	master     string // bridge in the same namespace
	peerNS     string // veth: the peer's namespace key and name
	peer       string
	addrs      []netip.Prefix
	routes     []Route
	port       PortSpec
	// Bridges: pinned once a MAC was set (at creation or later), hadPorts once a
	// port joined.
	pinned, hadPorts bool
}

// NewFake returns a kernel whose node namespace is empty.
func NewFake() *Fake {
	return &Fake{ns: map[string]*fakeNS{"": newFakeNS(false)}, fail: map[string]error{}}
}

func newFakeNS(ipv6Off bool) *fakeNS {
	return &fakeNS{links: map[string]*fakeLink{}, sysctls: map[string]string{}, ipv6Off: ipv6Off}
}

// AddNetns creates a pod namespace at path; ipv6Off disables IPv6 on its interfaces
// unless their disable_ipv6 is set to 0.
func (f *Fake) AddNetns(path string, ipv6Off bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ns[path] = newFakeNS(ipv6Off)
}

// RemoveNetns deletes the namespace at path, as the kernel does when its last user
// is gone: its links go, and so do their veth peers elsewhere.
func (f *Fake) RemoveNetns(path string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.ns[path]
	if n == nil || path == "" {
		return // the node's namespace outlives every pod
	}
	for _, l := range n.links {
		f.unlink(path, l)
	}
	delete(f.ns, path)
}

// UnmountNetns makes path no longer a namespace while the namespace lives on (a
// process still holds it): its links stay, but nothing reaches them through path.
// The namespace goes with its last link (its process is the pod's).
func (f *Fake) UnmountNetns(path string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if n := f.ns[path]; n != nil && path != "" {
		delete(f.ns, path)
		f.ns["unmounted:"+path] = n
		for _, o := range f.ns {
			for _, l := range o.links {
				if l.peerNS == path {
					l.peerNS = "unmounted:" + path
				}
			}
		}
	}
}

// AddBridge makes a bridge the way another program would: no MAC given, so the
// kernel picks it from its ports.
func (f *Fake) AddBridge(name string, mac net.HardwareAddr) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.index++
	f.ns[""].links[name] = &fakeLink{kind: "bridge", name: name, index: f.index, mac: mac, up: true}
}

// AddPort puts a device of another program on bridge (in the node's namespace).
func (f *Fake) AddPort(bridge, name string, mac net.HardwareAddr) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.index++
	f.ns[""].links[name] = &fakeLink{kind: "dummy", name: name, index: f.index, mac: mac, master: bridge, up: true}
	if br := f.ns[""].links[bridge]; br != nil {
		br.hadPorts = true
	}
}

// DeleteLink deletes a link as another program would.
func (f *Fake) DeleteLink(netns, name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if n := f.ns[netns]; n != nil && n.links[name] != nil {
		f.unlink(netns, n.links[name])
	}
}

// FailNext makes the next call of method op (e.g. "ConfigurePod") fail with err,
// changing nothing.
func (f *Fake) FailNext(op string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail[op] = err
}

func (f *Fake) failing(op string) error {
	err := f.fail[op]
	delete(f.fail, op)
	return err
}

// unlink removes l from namespace key, with its veth peer; ports leave a deleted
// bridge.
func (f *Fake) unlink(key string, l *fakeLink) {
	f.ns[key].drop(l.name)
	if l.peer != "" {
		if pn := f.ns[l.peerNS]; pn != nil && pn.links[l.peer] != nil && pn.links[l.peer].peer == l.name {
			pn.drop(l.peer)
		}
	}
	for _, o := range f.ns[key].links {
		if o.master == l.name {
			o.master = ""
		}
	}
	for k, n := range f.ns {
		if strings.HasPrefix(k, "unmounted:") && len(n.links) == 0 {
			delete(f.ns, k)
		}
	}
}

// drop removes a link with its per-interface sysctls, which the kernel keeps only
// while the interface exists.
func (n *fakeNS) drop(name string) {
	delete(n.links, name)
	for k := range n.sysctls {
		if strings.HasPrefix(k, "net/ipv4/conf/"+name+"/") || strings.HasPrefix(k, "net/ipv6/conf/"+name+"/") {
			delete(n.sysctls, k)
		}
	}
}

// bridgeMAC is the MAC the kernel shows for bridge br.
func (f *Fake) bridgeMAC(br *fakeLink) net.HardwareAddr {
	if br.pinned {
		return br.mac
	}
	var low net.HardwareAddr
	for _, l := range f.ns[""].links {
		if l.master == br.name && (low == nil || bytes.Compare(l.mac, low) < 0) {
			low = l.mac
		}
	}
	switch {
	case low != nil:
		return low
	case br.hadPorts:
		return net.HardwareAddr{0, 0, 0, 0, 0, 0}
	}
	return br.mac
}

// netns returns the namespace at path, or a not-found error naming it.
func (f *Fake) netns(path string) (*fakeNS, error) {
	if n := f.ns[path]; n != nil {
		return n, nil
	}
	return nil, notFound("network namespace %s does not exist or is not a network namespace", path)
}

// EnsureBridge implements Backend.
func (f *Fake) EnsureBridge(_ context.Context, s BridgeSpec) (Bridge, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.failing("EnsureBridge"); err != nil {
		return Bridge{}, err
	}
	host := f.ns[""]
	l := host.links[s.Name]
	created := false
	if l == nil {
		f.index++
		l = &fakeLink{kind: "bridge", name: s.Name, index: f.index, mac: s.MAC, mtu: s.MTU, pinned: true}
		host.links[s.Name] = l
		created = true
	}
	if l.kind != "bridge" {
		return Bridge{}, fmt.Errorf("device %q exists but is a %s, not a bridge: pick another \"bridge\" name in the conflist or remove the device", s.Name, l.kind)
	}
	l.up = true
	l.promisc = l.promisc || s.Promisc
	host.sysctls["net/ipv6/conf/"+s.Name+"/accept_ra"] = "0"
	return Bridge{Name: s.Name, Index: l.index, MAC: f.bridgeMAC(l), Created: created, DefaultPVID: 1}, nil
}

// PinBridgeMAC implements Backend.
func (f *Fake) PinBridgeMAC(_ context.Context, bridge string, before net.HardwareAddr) (net.HardwareAddr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.failing("PinBridgeMAC"); err != nil {
		return nil, err
	}
	br := f.ns[""].links[bridge]
	if br == nil || br.kind != "bridge" {
		return nil, notFound("bridge %s does not exist", bridge)
	}
	if !br.pinned {
		mac := f.bridgeMAC(br)
		if !isZeroMAC(before) {
			mac = before
		}
		br.mac, br.pinned = slices.Clone(mac), true
	}
	return br.mac, nil
}

// CreateVeth implements Backend.
func (f *Fake) CreateVeth(_ context.Context, s VethSpec) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.failing("CreateVeth"); err != nil {
		return err
	}
	return f.createVeth(s)
}

func (f *Fake) createVeth(s VethSpec) error {
	host := f.ns[""]
	pod, err := f.netns(s.PodNetns)
	if err != nil {
		return err
	}
	switch {
	case host.links[s.HostName] != nil:
		return exists("creating veth %s: a device of that name already exists", s.HostName)
	case pod.links[s.PodName] != nil:
		return exists("creating veth for %q: an interface of that name already exists in %s", s.PodName, nsName(s.PodNetns))
	case s.PodNetns == "" && s.PodName == s.HostName:
		return exists("creating veth %s: both ends have one name", s.HostName)
	}
	br := host.links[s.Bridge]
	if br == nil || br.kind != "bridge" {
		return notFound("bridge %s does not exist", s.Bridge)
	}
	for _, m := range []net.HardwareAddr{s.HostMAC, s.PodMAC} {
		if len(m) != 6 || m[0]&1 != 0 || isZeroMAC(m) {
			return fmt.Errorf("creating veth pair %s/%s: the kernel rejects MAC %s (multicast or all-zero); pass a unicast MAC", s.HostName, s.PodName, m)
		}
	}
	f.index += 2
	host.links[s.HostName] = &fakeLink{kind: "veth", name: s.HostName, index: f.index - 1, mac: s.HostMAC, mtu: s.MTU,
		up: true, master: s.Bridge, peerNS: s.PodNetns, peer: s.PodName, port: s.Port}
	pod.links[s.PodName] = &fakeLink{kind: "veth", name: s.PodName, index: f.index, mac: s.PodMAC, mtu: s.MTU,
		peerNS: "", peer: s.HostName}
	br.hadPorts = true
	for _, sc := range s.HostSysctls {
		host.sysctls[sc.Key] = sc.Value
	}
	return nil
}

// ConfigurePod implements Backend.
func (f *Fake) ConfigurePod(_ context.Context, s PodSpec) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.failing("ConfigurePod"); err != nil {
		return err
	}
	n, err := f.netns(s.Netns)
	if err != nil {
		return err
	}
	l := n.links[s.IfName]
	if l == nil {
		return notFound("pod interface %s does not exist in %s", s.IfName, s.Netns)
	}
	sysctls := maps.Clone(n.sysctls)
	for _, sc := range s.Sysctls {
		sysctls[sc.Key] = sc.Value
	}
	v6off := n.ipv6Off
	if v, ok := sysctls["net/ipv6/conf/"+s.IfName+"/disable_ipv6"]; ok {
		v6off = v == "1"
	}
	addrs := slices.Clone(l.addrs)
	for _, a := range s.Addrs {
		if a.Addr().Is6() && v6off {
			return fmt.Errorf("adding address %s to %s: permission denied (IPv6 is disabled on it)", a, s.IfName)
		}
		if slices.Contains(addrs, a) {
			return fmt.Errorf("adding address %s to %s: file exists", a, s.IfName)
		}
		addrs = append(addrs, a)
	}
	routes := slices.Clone(l.routes)
	for _, r := range s.Routes {
		if r.GW.IsValid() && !onLink(r.GW, addrs, routes) {
			return fmt.Errorf("adding route to %s via %s: network is unreachable", r.Dst, r.GW)
		}
		routes = append(routes, r)
	}
	n.sysctls, l.addrs, l.routes = sysctls, addrs, routes
	l.up = l.up || s.Up
	return nil
}

// onLink reports whether gw is in a subnet of addrs or of an on-link route.
func onLink(gw netip.Addr, addrs []netip.Prefix, routes []Route) bool {
	for _, a := range addrs {
		if a.Masked().Contains(gw) {
			return true
		}
	}
	for _, r := range routes {
		if !r.GW.IsValid() && r.Dst.Contains(gw) {
			return true
		}
	}
	return false
}

// ConfigureHost implements Backend.
func (f *Fake) ConfigureHost(_ context.Context, s HostSpec) (HostResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.failing("ConfigureHost"); err != nil {
		return HostResult{}, err
	}
	host := f.ns[""]
	var res HostResult
	target := host.links[s.Bridge]
	if target == nil {
		return res, notFound("bridge %s does not exist", s.Bridge)
	}
	v := s.VlanGateway
	if len(s.Gateways) == 0 {
		v = nil // as the kernel backend: no gateway, no gateway interface
	}
	if v != nil {
		target = host.links[v.PodName]
	}
	var addrs []netip.Prefix
	if target != nil {
		addrs = slices.Clone(target.addrs)
	}
	for _, gw := range s.Gateways {
		if slices.Contains(addrs, gw) {
			continue
		}
		for _, a := range slices.Clone(addrs) {
			if a.Addr().Is4() == gw.Addr().Is4() && (gw.Addr().Is4() || a.Masked().Contains(gw.Addr()) || gw.Masked().Contains(a.Addr())) {
				if !s.ForceAddress {
					return res, fmt.Errorf("%q already has address %s, not the gateway %s; set \"forceAddress\": true to replace it, or fix the subnet", target.name, a, gw)
				}
				addrs = slices.DeleteFunc(addrs, func(x netip.Prefix) bool { return x == a })
			}
		}
		addrs = append(addrs, gw)
	}
	if v != nil && target == nil {
		if err := f.createVeth(*v); err != nil {
			return res, fmt.Errorf("creating VLAN gateway interface %s: %w", v.PodName, err)
		}
		target = host.links[v.PodName]
	}
	if v != nil {
		target.up = true
		res.GatewayIf = &Iface{Name: target.name, MAC: target.mac}
	}
	target.addrs = addrs
	for _, sc := range s.Sysctls {
		host.sysctls[sc.Key] = sc.Value
	}
	return res, nil
}

// Delete implements Backend.
func (f *Fake) Delete(_ context.Context, r Ref) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.failing("Delete"); err != nil {
		return err
	}
	n := f.ns[r.Netns]
	if n == nil || n.links[r.Name] == nil {
		return nil
	}
	f.unlink(r.Netns, n.links[r.Name])
	return nil
}

// Inspect implements Backend.
func (f *Fake) Inspect(_ context.Context, r Ref) (Info, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.failing("Inspect"); err != nil {
		return Info{}, err
	}
	n, err := f.netns(r.Netns)
	if err != nil {
		return Info{}, err
	}
	l := n.links[r.Name]
	if l == nil {
		return Info{}, notFound("%s does not exist", r)
	}
	info := Info{Kind: l.kind, Index: l.index, MAC: l.mac, Promisc: l.promisc, Up: l.up,
		Addrs: slices.Clone(l.addrs)}
	if r.Netns != "" {
		info.Routes = slices.Clone(l.routes)
	}
	if l.kind == "bridge" {
		info.MAC = f.bridgeMAC(l)
	}
	if m := n.links[l.master]; m != nil {
		info.MasterIndex = m.index
	}
	if pn := f.ns[l.peerNS]; l.peer != "" && pn != nil && pn.links[l.peer] != nil {
		info.PeerIndex = pn.links[l.peer].index
	}
	return info, nil
}

// Sysctl reads a sysctl the fake holds in namespace netns ("" when never set).
func (f *Fake) Sysctl(netns, key string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if n := f.ns[netns]; n != nil {
		return n.sysctls[key]
	}
	return ""
}

// Dump prints every namespace's links and sysctls, sorted: one line per link with
// its kind, MAC, state, master, peer, addresses, routes and port settings, then one
// per sysctl. Pod namespaces show as their path.
func (f *Fake) Dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for key, n := range f.ns {
		for _, l := range n.links {
			s := fmt.Sprintf("%s %s %s", nsName(key), l.kind, l.name)
			mac := l.mac
			if l.kind == "bridge" {
				mac = f.bridgeMAC(l)
			}
			s += " mac=" + mac.String()
			for _, kv := range []struct {
				on   bool
				what string
			}{{l.up, "up"}, {l.promisc, "promisc"}, {l.kind == "bridge" && l.pinned, "pinned"},
				{l.port.Hairpin, "hairpin"}, {l.port.Isolated, "isolated"}} {
				if kv.on {
					s += " " + kv.what
				}
			}
			if l.mtu != 0 {
				s += fmt.Sprintf(" mtu=%d", l.mtu)
			}
			if l.master != "" {
				s += " master=" + l.master
			}
			if l.peer != "" {
				s += " peer=" + nsName(l.peerNS) + ":" + l.peer
			}
			if l.port.Vlan != 0 || len(l.port.Trunk) > 0 {
				s += fmt.Sprintf(" vlan=%d trunk=%v", l.port.Vlan, l.port.Trunk)
			}
			if len(l.addrs) > 0 {
				s += " addrs=" + joinSorted(l.addrs)
			}
			for _, r := range l.routes {
				s += " route=" + strings.ReplaceAll(r.String(), " ", "_")
			}
			out = append(out, s)
		}
		for k, v := range n.sysctls {
			out = append(out, fmt.Sprintf("%s sysctl %s=%s", nsName(key), k, v))
		}
	}
	sort.Strings(out)
	if len(out) == 0 {
		return ""
	}
	return strings.Join(out, "\n") + "\n"
}

func nsName(key string) string {
	if key == "" {
		return "node"
	}
	return key
}

// isZeroMAC reports a missing or all-zero MAC (the kernel shows a bridge whose last
// port left as 00:00:00:00:00:00; vishvananda/netlink may hand it over as nil).
func isZeroMAC(m net.HardwareAddr) bool {
	for _, b := range m {
		if b != 0 {
			return false
		}
	}
	return true
}
