// SPDX-License-Identifier: Apache-2.0

package link

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strings"
	"time"
)

// Backend is the link work of a bridge attachment, in the bridge plugin's words: the
// node bridge, one veth pair per pod, the pod interface's and the node's layer-3
// configuration. Netlink is the real one (netlink_linux.go); Fake models the kernel
// for unit tests. CreateVeth is all or nothing, so the caller's undo stack holds
// whole steps: the veth's deletion undoes it and everything ConfigurePod did to the
// pod interface. What EnsureBridge and ConfigureHost set (the bridge, gateway
// addresses, node sysctls) is shared by the bridge's pods and never undone.
type Backend interface {
	// EnsureBridge returns the bridge s names, creating it (with s.MAC, so the kernel
	// never picks its MAC from the ports) when missing. Many ADDs may race to create
	// it: losing the race is success once the device is found to be a bridge. The
	// bridge is brought up, gets accept_ra=0 and, if s asks, promiscuous mode.
	EnsureBridge(ctx context.Context, s BridgeSpec) (Bridge, error)
	// PinBridgeMAC keeps the MAC of a bridge this call did not create from following
	// its ports (the kernel gives such a bridge the lowest MAC of its ports, so it
	// changes as pods come and go): when the bridge still takes its MAC from its
	// ports, it is set to before (its MAC before this call's port joined) or, when
	// before is zero, to its current one. It returns the bridge's MAC.
	PinBridgeMAC(ctx context.Context, bridge string, before net.HardwareAddr) (net.HardwareAddr, error)
	// CreateVeth creates the pair with one request, the pod end directly in the pod's
	// namespace, the host end on the bridge, then configures the port and the host
	// end's sysctls. A taken name fails with an error IsExists reports, before
	// anything changed; that is what makes a repeated ADD fail without side effects.
	CreateVeth(ctx context.Context, s VethSpec) error
	// ConfigurePod configures the pod interface: sysctls first (in order), then
	// addresses, up, routes, and the wait for DAD.
	ConfigurePod(ctx context.Context, s PodSpec) error
	// ConfigureHost puts the gateway addresses on the bridge (or on the VLAN gateway
	// interface, made if missing when there are gateways) and sets the node's
	// sysctls; an optional node sysctl that cannot be set is a warning in the result,
	// not an error.
	ConfigureHost(ctx context.Context, s HostSpec) (HostResult, error)
	// Delete deletes the link r names (a veth takes its peer along). A missing link,
	// a namespace that is gone or a path that is not a network namespace is success:
	// there is nothing there to delete.
	Delete(ctx context.Context, r Ref) error
	// Inspect reads what CHECK, DEL and GC compare. A missing link or namespace is
	// an error IsNotFound reports.
	Inspect(ctx context.Context, r Ref) (Info, error)
}

// Ref names a link: Name in the network namespace at path Netns ("" for the node's,
// the namespace the plugin runs in).
type Ref struct {
	Netns string
	Name  string
}

func (r Ref) String() string {
	if r.Netns == "" {
		return r.Name
	}
	return r.Name + " in " + r.Netns
}

// Sysctl is one setting: Key is the path under /proc/sys with slashes (interface
// names may contain dots), Value what to write. Optional settings may be absent (an
// IPv6 knob in a namespace without IPv6) and their failure is ignored (pod) or
// reported as a warning (node).
type Sysctl struct {
	Key, Value string
	Optional   bool
}

func (s Sysctl) String() string {
	o := ""
	if s.Optional {
		o = " (optional)"
	}
	return s.Key + "=" + s.Value + o
}

// BridgeSpec is the node bridge as the configuration wants it.
type BridgeSpec struct {
	Name          string
	MTU           int // 0: kernel default
	Promisc       bool
	VlanFiltering bool
	MAC           net.HardwareAddr // for a bridge this call creates
}

// Bridge is the bridge as EnsureBridge found or made it.
type Bridge struct {
	Name        string
	Index       int
	MAC         net.HardwareAddr
	Created     bool   // by this call
	DefaultPVID uint16 // the bridge's default VLAN (1 unless configured otherwise)
}

// VethSpec is one veth pair: the pod end in a pod's namespace (or, for the VLAN
// gateway interface, the node's), the host end on the bridge.
type VethSpec struct {
	HostName    string
	HostMAC     net.HardwareAddr
	PodNetns    string // "" for the node's namespace
	PodName     string
	PodMAC      net.HardwareAddr
	MTU         int
	Bridge      string
	Port        PortSpec
	HostSysctls []Sysctl
}

// PortSpec is the bridge-port configuration of a host veth.
type PortSpec struct {
	Hairpin             bool
	Isolated            bool
	Vlan                int   // access VLAN (PVID, untagged); 0: none
	Trunk               []int // tagged VLANs
	PreserveDefaultVlan bool  // keep the bridge's default VLAN on the port
}

// Route is a route through the pod interface.
type Route struct {
	Dst      netip.Prefix
	GW       netip.Addr // invalid: on-link
	Priority int
	MTU      int
	AdvMSS   int
	Table    int  // 0: main
	Scope    *int // nil: the kernel's default for the route
}

func (r Route) String() string {
	s := r.Dst.String()
	if r.GW.IsValid() {
		s += " via " + r.GW.String()
	}
	for _, kv := range []struct {
		k string
		v int
	}{{"metric", r.Priority}, {"mtu", r.MTU}, {"advmss", r.AdvMSS}, {"table", r.Table}} {
		if kv.v != 0 {
			s += fmt.Sprintf(" %s %d", kv.k, kv.v)
		}
	}
	if r.Scope != nil {
		s += fmt.Sprintf(" scope %d", *r.Scope)
	}
	return s
}

// PodSpec is the pod interface's configuration.
type PodSpec struct {
	Netns   string
	IfName  string
	Sysctls []Sysctl
	Addrs   []netip.Prefix
	Up      bool
	Routes  []Route
	// WaitDAD, when not zero, waits that long at most for the IPv6 addresses to
	// leave the tentative state; a failed DAD is an error naming the address.
	WaitDAD time.Duration
}

// HostSpec is the node's side of an attachment's layer 3.
type HostSpec struct {
	Bridge string
	// VlanGateway, when set, is the veth pair whose node-side end carries the
	// gateway addresses of a VLAN (the reference's "<bridge>.<vlan>").
	VlanGateway  *VethSpec
	Gateways     []netip.Prefix // gateway address with its subnet's length
	ForceAddress bool           // replace another address instead of failing
	Sysctls      []Sysctl       // node-wide: forwarding, bridge-nf-call-*
}

// HostResult is what ConfigureHost did.
type HostResult struct {
	GatewayIf *Iface  // the VLAN gateway interface, nil when the bridge has the gateways
	Warnings  []error // node sysctls that could not be set
}

// Iface is an interface for the result.
type Iface struct {
	Name string
	MAC  net.HardwareAddr
}

// Info is what Inspect reads of a link.
type Info struct {
	Kind        string // "bridge", "veth", ...
	Index       int
	PeerIndex   int // a veth's peer, in the peer's namespace
	MasterIndex int // the bridge a port is on, 0 for none
	MAC         net.HardwareAddr
	Promisc     bool
	Up          bool
	Addrs       []netip.Prefix // global and link-local
	Routes      []Route        // through this link, every table; read in pod namespaces only
}

// Error kinds, tested with the predicates below (through %w wrapping).
var (
	errExists   = errors.New("already exists")
	errNotFound = errors.New("not found")
)

// IsExists reports that CreateVeth found a name taken.
func IsExists(err error) bool { return errors.Is(err, errExists) }

// IsNotFound reports that a link or namespace does not exist.
func IsNotFound(err error) bool { return errors.Is(err, errNotFound) || isKernelNotFound(err) }

// kindError carries an error kind without changing the message.
type kindError struct{ kind, err error }

func (e *kindError) Error() string   { return e.err.Error() }
func (e *kindError) Unwrap() []error { return []error{e.kind, e.err} }

func exists(format string, a ...any) error {
	return &kindError{kind: errExists, err: fmt.Errorf(format, a...)}
}

func notFound(format string, a ...any) error {
	return &kindError{kind: errNotFound, err: fmt.Errorf(format, a...)}
}

// sortedPrefixes returns ps sorted, for comparisons and dumps.
func sortedPrefixes(ps []netip.Prefix) []string {
	out := make([]string, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.String())
	}
	sort.Strings(out)
	return out
}

func joinSorted(ps []netip.Prefix) string { return strings.Join(sortedPrefixes(ps), ",") }
