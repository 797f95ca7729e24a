// SPDX-License-Identifier: Apache-2.0

// Package tc shapes a pod's traffic on the host side of its veth with token bucket
// filters, through netlink (never the tc binary).
//
// Traffic into the pod leaves the host through the host-side veth, so it is shaped by a
// TBF at that veth's root. Traffic out of the pod arrives as the host veth's *ingress*,
// where no qdisc queues; a u32 filter on the veth's ingress hook (an ingress or clsact
// qdisc) redirects it with mirred to an IFB device, whose root TBF shapes it before the
// IFB hands it back to the veth's receive path.
//
// Everything podwire owns is recognisable without stored state: the IFB by its derived
// name (and its alias, for GC), the root TBF by its handle 1:, the redirect by its
// preference FilterPrio and its mirred target. A Plan is pure data; a Backend applies,
// observes and removes it. NewNetlink is the kernel backend, NewFake the in-memory one
// for unit tests.
package tc

import (
	"context"
	"fmt"
	"strings"
)

// FilterPrio is the preference of podwire's redirect filter on the host veth's ingress
// hook. It is high so that filters of other tc users (eBPF agents usually take 1) run
// first and see the pod's packets before they are redirected.
const FilterPrio = 65000

// RootHandle is the handle of podwire's TBF at the root of the host veth and the IFB
// (1:, as the reference plugin uses).
const RootHandle = 0x10000

// Plan is every kernel object shaping one attachment: a TBF on the host veth for
// traffic into the pod, and an IFB with a TBF plus a redirect for traffic out of it.
type Plan struct {
	Dev string // host-side veth, in the backend's network namespace
	MTU int    // Dev's MTU; the IFB gets the same
	// IFB and Alias name the IFB device whether or not Egress is set, so that applying a
	// plan without Egress removes one left from an earlier plan.
	IFB   string
	Alias string
	// Ingress shapes traffic into the pod (Dev's transmit side); nil: unshaped.
	Ingress *TBF
	// Egress shapes traffic out of the pod (Dev's receive side, via the IFB); nil:
	// unshaped.
	Egress *TBF
}

// String renders the plan one object per line, for logs and golden tests.
func (p Plan) String() string {
	var b strings.Builder
	if p.Ingress != nil {
		fmt.Fprintf(&b, "dev %s root 1: %s\n", p.Dev, p.Ingress)
	}
	if p.Egress != nil {
		fmt.Fprintf(&b, "ifb %s mtu %d alias %q\n", p.IFB, p.MTU, p.Alias)
		fmt.Fprintf(&b, "dev %s root 1: %s\n", p.IFB, p.Egress)
		fmt.Fprintf(&b, "dev %s ingress pref %d u32 match all action mirred egress redirect dev %s\n", p.Dev, FilterPrio, p.IFB)
	}
	return b.String()
}

// Removal names what Remove deletes: podwire's objects on Dev (which may be "" or gone)
// and the IFB devices (absent ones are skipped).
type Removal struct {
	Dev  string
	IFBs []string
	// OnlyIfRedirected makes Dev a hint to verify (GC reads it from an IFB's alias, and
	// the name may since belong to another pod): only redirects into IFBs are removed
	// from it, and its root TBF only when such a redirect was there.
	OnlyIfRedirected bool
}

// IFB is an IFB device as GC sees it.
type IFB struct {
	Name  string
	Alias string
}

// Backend applies and removes shaping. Every method works in one network namespace
// (the host's) and is safe to repeat.
type Backend interface {
	// Apply makes Dev and the IFB match p: objects p asks for are created or updated,
	// podwire objects p does not ask for are removed. Objects it created are removed
	// again when it fails. Dev must exist. A root qdisc on Dev that is not podwire's
	// makes ingress shaping fail rather than be replaced.
	Apply(ctx context.Context, p Plan) error
	// Observe reports the podwire-relevant state of dev and ifb; dev "" skips the veth.
	Observe(ctx context.Context, dev, ifb string) (State, error)
	// Remove deletes podwire's redirect (and an ingress/clsact qdisc left without
	// filters), root TBF on r.Dev, then the IFBs. Absent objects are success; it keeps
	// going after an error and returns them all.
	Remove(ctx context.Context, r Removal) error
	// IFBs lists every IFB device in the namespace.
	IFBs(ctx context.Context) ([]IFB, error)
}

// State is what Observe found. A nil pointer means absent.
type State struct {
	Dev *DevState
	IFB *IFBState
}

// DevState is the host veth as podwire sees it.
type DevState struct {
	MTU int
	// Root is podwire's TBF at the root (tbf with handle 1:), nil when the root is the
	// default qdisc or someone else's (then RootOther names it, e.g. "htb 1:").
	Root      *KernelTBF
	RootOther string
	// Hook is "ingress", "clsact" or "" (no ingress hook qdisc).
	Hook string
	// Redirects are the filters on the ingress hook that podwire owns: at FilterPrio with
	// a mirred redirect, or redirecting to the observed IFB.
	Redirects []Redirect
	// OtherFilters counts filters on the hook that are not podwire's.
	OtherFilters int
}

// Redirect is one podwire filter on the host veth's ingress hook.
type Redirect struct {
	Prio   uint16
	Target string // name of the device it redirects to, or "ifindex N" when unknown
}

// IFBState is the IFB device.
type IFBState struct {
	Kind  string // "ifb", or what a name collision made it
	Mac   string
	MTU   int
	Up    bool
	Alias string
	Root  *KernelTBF
}

// Diff lists how s differs from what p implies, one sentence per difference; nil
// when it matches. It checks every object podwire owns, including ones that must be
// absent.
func Diff(p Plan, s State) []string {
	var d []string
	if s.Dev == nil {
		return []string{fmt.Sprintf("host veth %s does not exist", p.Dev)}
	}
	dev := s.Dev
	switch {
	case p.Ingress != nil && dev.Root == nil && dev.RootOther != "":
		d = append(d, fmt.Sprintf("%s: root qdisc is %s, want podwire's %s", p.Dev, dev.RootOther, p.Ingress.Kernel()))
	case p.Ingress != nil && dev.Root == nil:
		d = append(d, fmt.Sprintf("%s: no TBF at the root, want %s", p.Dev, p.Ingress.Kernel()))
	case p.Ingress != nil && *dev.Root != p.Ingress.Kernel():
		d = append(d, fmt.Sprintf("%s: root is %s, want %s", p.Dev, *dev.Root, p.Ingress.Kernel()))
	case p.Ingress == nil && dev.Root != nil:
		d = append(d, fmt.Sprintf("%s: podwire's %s is at the root, but no ingress shaping is requested", p.Dev, *dev.Root))
	}

	want := p.Egress != nil
	switch {
	case want && s.IFB == nil:
		d = append(d, fmt.Sprintf("IFB %s does not exist", p.IFB))
	case want:
		ifb := s.IFB
		if ifb.Kind != "ifb" {
			d = append(d, fmt.Sprintf("%s is a %s, not an IFB", p.IFB, ifb.Kind))
		}
		if ifb.MTU != p.MTU {
			d = append(d, fmt.Sprintf("IFB %s has MTU %d, want %d (the veth's)", p.IFB, ifb.MTU, p.MTU))
		}
		if !ifb.Up {
			d = append(d, fmt.Sprintf("IFB %s is down", p.IFB))
		}
		if ifb.Alias != p.Alias {
			d = append(d, fmt.Sprintf("IFB %s has alias %q, want %q", p.IFB, ifb.Alias, p.Alias))
		}
		switch {
		case ifb.Root == nil:
			d = append(d, fmt.Sprintf("IFB %s: no TBF at the root, want %s", p.IFB, p.Egress.Kernel()))
		case *ifb.Root != p.Egress.Kernel():
			d = append(d, fmt.Sprintf("IFB %s: root is %s, want %s", p.IFB, *ifb.Root, p.Egress.Kernel()))
		}
	case s.IFB != nil && s.IFB.Kind == "ifb":
		d = append(d, fmt.Sprintf("IFB %s exists, but no egress shaping is requested", p.IFB))
	}

	ok := 0
	for _, r := range dev.Redirects {
		if want && r.Prio == FilterPrio && r.Target == p.IFB {
			ok++
			continue
		}
		d = append(d, fmt.Sprintf("%s: podwire filter pref %d redirects to %s, want %s", p.Dev, r.Prio, r.Target, wantRedirect(p)))
	}
	if want {
		switch {
		case dev.Hook == "":
			d = append(d, fmt.Sprintf("%s: no ingress or clsact qdisc, want one with a redirect to %s", p.Dev, p.IFB))
		case ok == 0:
			d = append(d, fmt.Sprintf("%s: no filter redirecting its ingress to %s", p.Dev, p.IFB))
		case ok > 1:
			d = append(d, fmt.Sprintf("%s: %d filters redirect to %s, want 1", p.Dev, ok, p.IFB))
		}
	}
	return d
}

func wantRedirect(p Plan) string {
	if p.Egress == nil {
		return "none (no egress shaping is requested)"
	}
	return fmt.Sprintf("pref %d to %s", FilterPrio, p.IFB)
}
