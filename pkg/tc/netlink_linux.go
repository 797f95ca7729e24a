// SPDX-License-Identifier: Apache-2.0

package tc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podwire/podwire/pkg/cleanup"
)

// Netlink is the kernel Backend. It works in the network namespace of the handle it was
// given (the calling thread's for a zero handle).
type Netlink struct {
	h *netlink.Handle
}

var _ Backend = (*Netlink)(nil)

// NewNetlink returns the kernel backend using h; nil means one socket in the calling
// thread's network namespace, kept for all requests.
func NewNetlink(h *netlink.Handle) *Netlink {
	if h == nil {
		h = routeHandle()
	}
	return &Netlink{h: h}
}

// routeHandle opens one rtnetlink socket in the calling thread's namespace, for the
// ~20 requests of a verb (a socket per request cost a socket's creation each), with the
// library's usual 60 s timeouts. Where it cannot be made, requests get a socket each.
func routeHandle() *netlink.Handle {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return &netlink.Handle{}
	}
	if err := h.SetSocketTimeout(60 * time.Second); err != nil {
		h.Close()
		return &netlink.Handle{}
	}
	return h
}

// Close releases the backend's socket (and with it the hold on its namespace).
func (n *Netlink) Close() { n.h.Close() }

// ingressHook is the ffff: handle both the ingress and the clsact qdisc use.
const ingressHook = 0xffff0000

// Apply implements Backend.
func (n *Netlink) Apply(_ context.Context, p Plan) (err error) {
	var undo cleanup.Stack
	defer undo.RunIfFailed(&err)
	dev, err := n.h.LinkByName(p.Dev)
	if err != nil {
		return fmt.Errorf("host veth %s: %w", p.Dev, err)
	}

	// Build the IFB and its TBF before anything redirects into it: a redirect to an IFB
	// that is down or unshaped would drop or leak the pod's traffic.
	var ifb netlink.Link
	if p.Egress != nil {
		if ifb, err = n.ensureIFB(p, &undo); err != nil {
			return err
		}
		if err := n.h.QdiscReplace(tbfQdisc(ifb.Attrs().Index, *p.Egress)); err != nil {
			return fmt.Errorf("setting %s on IFB %s: %w", p.Egress, p.IFB, err)
		}
	}
	if err := n.ensureRoot(dev, p.Ingress, &undo); err != nil {
		return err
	}
	if p.Egress != nil {
		return n.ensureRedirect(dev, ifb, &undo)
	}
	// No egress shaping: drop a redirect and IFB an earlier plan left, redirect first.
	_, err = n.removeEgress(dev, []string{p.IFB}, true)
	return err
}

func (n *Netlink) ensureIFB(p Plan, undo *cleanup.Stack) (netlink.Link, error) {
	l, err := n.h.LinkByName(p.IFB)
	switch {
	case isNotFound(err):
		attrs := netlink.NewLinkAttrs()
		attrs.Name, attrs.MTU, attrs.Alias = p.IFB, p.MTU, p.Alias
		// txqueuelen 0, as the reference's IFB (the kernel's default is 32). The root
		// TBF, with its own byte limit, does the queueing.
		attrs.TxQLen = 0
		if err := n.h.LinkAdd(&netlink.Ifb{LinkAttrs: attrs}); err != nil {
			return nil, fmt.Errorf("creating IFB %s: %w", p.IFB, err)
		}
		if l, err = n.h.LinkByName(p.IFB); err != nil {
			return nil, fmt.Errorf("reading back IFB %s: %w", p.IFB, err)
		}
		created := l
		undo.Push("delete IFB "+p.IFB, func() error { return ignoreGone(n.h.LinkDel(created)) })
	case err != nil:
		return nil, fmt.Errorf("looking up IFB %s: %w", p.IFB, err)
	case l.Type() != "ifb":
		return nil, fmt.Errorf("device %s exists but is a %s, not podwire's IFB: delete it (ip link del %s) and retry", p.IFB, l.Type(), p.IFB)
	}
	if l.Attrs().MTU != p.MTU {
		if err := n.h.LinkSetMTU(l, p.MTU); err != nil {
			return nil, fmt.Errorf("setting MTU %d on IFB %s: %w", p.MTU, p.IFB, err)
		}
	}
	// Older kernels ignore IFLA_IFALIAS on creation; set it again if it did not stick.
	if l.Attrs().Alias != p.Alias {
		if err := n.h.LinkSetAlias(l, p.Alias); err != nil {
			return nil, fmt.Errorf("setting alias on IFB %s: %w", p.IFB, err)
		}
	}
	if l.Attrs().Flags&net.FlagUp == 0 {
		if err := n.h.LinkSetUp(l); err != nil {
			return nil, fmt.Errorf("bringing IFB %s up: %w", p.IFB, err)
		}
	}
	return l, nil
}

func tbfQdisc(index int, t TBF) *netlink.Tbf {
	return &netlink.Tbf{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: index, Handle: RootHandle, Parent: netlink.HANDLE_ROOT},
		Rate:       t.Rate,
		Limit:      t.Limit,
		Buffer:     BufferTicks(t.Rate, t.Burst),
		Peakrate:   t.PeakRate,
		Minburst:   t.MaxPacket,
	}
}

// ensureRoot puts want at dev's root (or removes podwire's TBF when want is nil). A
// root qdisc that is not podwire's is left alone and reported.
func (n *Netlink) ensureRoot(dev netlink.Link, want *TBF, undo *cleanup.Stack) error {
	name := dev.Attrs().Name
	qs, err := listQdiscs(n.h, dev)
	if err != nil {
		return fmt.Errorf("listing qdiscs on %s: %w", name, err)
	}
	ours, other := rootOf(qs)
	if want == nil {
		if ours == nil {
			return nil
		}
		if err := n.h.QdiscDel(ours); err != nil && !isGone(err) {
			return fmt.Errorf("removing podwire's TBF from %s: %w", name, err)
		}
		return nil
	}
	if other != "" {
		return fmt.Errorf("%s already has root qdisc %s, which podwire did not create: remove it (tc qdisc del dev %s root) or drop the ingress bandwidth request", name, other, name)
	}
	q := tbfQdisc(dev.Attrs().Index, *want)
	// Replace changes our TBF in place, or grafts a new one over the default qdisc.
	if err := n.h.QdiscReplace(q); err != nil {
		return fmt.Errorf("setting %s at the root of %s: %w", want, name, err)
	}
	if ours == nil {
		undo.Push("delete the root qdisc of "+dev.Attrs().Name, func() error { return ignoreGone(n.h.QdiscDel(q)) })
	}
	return nil
}

// rootOf returns podwire's root TBF, or a description of a root qdisc that is not
// podwire's ("" for the default one).
func rootOf(qs []netlink.Qdisc) (ours *netlink.Tbf, other string) {
	for _, q := range qs {
		a := q.Attrs()
		if a.Parent != netlink.HANDLE_ROOT || a.Handle == 0 {
			continue
		}
		if t, ok := q.(*netlink.Tbf); ok && a.Handle == RootHandle {
			return t, ""
		}
		return nil, fmt.Sprintf("%s %x:", q.Type(), a.Handle>>16)
	}
	return nil, ""
}

func hookOf(qs []netlink.Qdisc) netlink.Qdisc {
	for _, q := range qs {
		if q.Attrs().Parent == netlink.HANDLE_INGRESS && (q.Type() == "ingress" || q.Type() == "clsact") {
			return q
		}
	}
	return nil
}

// ensureRedirect makes exactly one podwire filter on dev's ingress hook redirect to
// ifb, next to whatever filters other tc users have there.
func (n *Netlink) ensureRedirect(dev, ifb netlink.Link, undo *cleanup.Stack) error {
	name := dev.Attrs().Name
	qs, err := listQdiscs(n.h, dev)
	if err != nil {
		return fmt.Errorf("listing qdiscs on %s: %w", name, err)
	}
	if hookOf(qs) == nil {
		hook := &netlink.Clsact{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: dev.Attrs().Index, Handle: ingressHook, Parent: netlink.HANDLE_CLSACT}}
		if err := n.h.QdiscAdd(hook); err != nil {
			return fmt.Errorf("adding a clsact qdisc to %s: %w", name, err)
		}
		undo.Push("delete the ingress hook of "+dev.Attrs().Name, func() error { return ignoreGone(n.h.QdiscDel(hook)) })
	}
	fs, err := listFilters(n.h, dev, netlink.HANDLE_MIN_INGRESS)
	if err != nil {
		return fmt.Errorf("listing ingress filters on %s: %w", name, err)
	}
	target := ifb.Attrs().Index
	mine := ownFilters(fs, map[int]bool{target: true}, true)
	if len(mine) == 1 && mine[0].Attrs().Priority == FilterPrio {
		if t, _ := mirredTarget(mine[0]); t == target {
			return nil
		}
	}
	if err := errors.Join(n.deleteOwn(dev, mine)...); err != nil {
		return fmt.Errorf("removing stale podwire filters: %w", err)
	}
	f := redirectFilter(dev.Attrs().Index, target)
	if err := n.h.FilterAdd(f); err != nil {
		return fmt.Errorf("adding the redirect from %s to IFB %s (pref %d): %w", name, ifb.Attrs().Name, FilterPrio, err)
	}
	undo.Push("delete the redirect filter of "+dev.Attrs().Name, func() error { return ignoreGone(n.h.FilterDel(redirectFilter(dev.Attrs().Index, 0))) })
	return nil
}

// redirectFilter matches every packet and steals it to the IFB's egress. With target 0
// it names the whole preference, for deletion.
func redirectFilter(dev, target int) *netlink.U32 {
	f := &netlink.U32{FilterAttrs: netlink.FilterAttrs{
		LinkIndex: dev,
		Parent:    netlink.HANDLE_MIN_INGRESS,
		Priority:  FilterPrio,
		Protocol:  unix.ETH_P_ALL,
	}}
	if target != 0 {
		f.Actions = []netlink.Action{netlink.NewMirredAction(target)}
	}
	return f
}

// ownFilters picks podwire's filters: any filter redirecting to one of targets
// (podwire's IFBs, including the reference plugin's), and with byPrio any mirred
// redirect at FilterPrio.
func ownFilters(fs []netlink.Filter, targets map[int]bool, byPrio bool) []netlink.Filter {
	var out []netlink.Filter
	for _, f := range fs {
		t, ok := mirredTarget(f)
		if ok && (byPrio && f.Attrs().Priority == FilterPrio || targets[t]) {
			out = append(out, f)
		}
	}
	return out
}

// mirredTarget returns the device index f's mirred redirect sends to.
func mirredTarget(f netlink.Filter) (int, bool) {
	var acts []netlink.Action
	switch f := f.(type) {
	case *netlink.U32:
		acts = f.Actions
	case *netlink.MatchAll:
		acts = f.Actions
	case *netlink.Flower:
		acts = f.Actions
	}
	for _, a := range acts {
		if m, ok := a.(*netlink.MirredAction); ok && (m.MirredAction == netlink.TCA_EGRESS_REDIR || m.MirredAction == netlink.TCA_INGRESS_REDIR) {
			return m.Ifindex, true
		}
	}
	return 0, false
}

// Remove implements Backend.
func (n *Netlink) Remove(_ context.Context, r Removal) error {
	var dev netlink.Link
	if r.Dev != "" {
		l, err := n.h.LinkByName(r.Dev)
		switch {
		case isNotFound(err): // the veth is gone, and everything on it
		case err != nil:
			return fmt.Errorf("looking up host veth %s: %w", r.Dev, err)
		default:
			dev = l
		}
	}
	found, err := n.removeEgress(dev, r.IFBs, !r.OnlyIfRedirected)
	errs := []error{err}
	if dev != nil && (found || !r.OnlyIfRedirected) {
		errs = append(errs, n.ensureRoot(dev, nil, &cleanup.Stack{}))
	}
	return errors.Join(errs...)
}

// removeEgress removes podwire's redirects from dev (nil: gone), then the IFBs, once
// nothing redirects into them any more. It keeps going after errors. found reports a
// redirect into one of the IFBs on dev; byPrio also takes any redirect at FilterPrio
// as podwire's.
func (n *Netlink) removeEgress(dev netlink.Link, names []string, byPrio bool) (found bool, _ error) {
	var errs []error
	targets := map[int]bool{}
	var ifbs []netlink.Link
	for _, name := range names {
		l, err := n.h.LinkByName(name)
		switch {
		case isNotFound(err):
		case err != nil:
			errs = append(errs, fmt.Errorf("looking up IFB %s: %w", name, err))
		case l.Type() == "ifb":
			targets[l.Attrs().Index] = true
			ifbs = append(ifbs, l)
		}
	}
	if dev != nil {
		var rerrs []error
		found, rerrs = n.removeRedirects(dev, targets, byPrio)
		errs = append(errs, rerrs...)
	}
	// The redirects go first: a packet redirected into a deleted IFB is dropped. The
	// deletion returns after the kernel's wait for the IFB's memory to be freeable (an
	// RCU barrier, most of its cost), paid here: nothing outlives the plugin.
	for _, l := range ifbs {
		if err := n.h.LinkDel(l); err != nil && !isNotFound(err) {
			errs = append(errs, fmt.Errorf("deleting IFB %s: %w", l.Attrs().Name, err))
		}
	}
	return found, errors.Join(errs...)
}

// removeRedirects deletes podwire's filters from dev's ingress hook, then the hook
// qdisc itself when no filter is left on it. podwire cannot tell an empty hook someone
// else added from the one it added, so an empty one is removed either way.
func (n *Netlink) removeRedirects(dev netlink.Link, targets map[int]bool, byPrio bool) (found bool, _ []error) {
	name := dev.Attrs().Name
	qs, err := listQdiscs(n.h, dev)
	if err != nil {
		return false, []error{fmt.Errorf("listing qdiscs on %s: %w", name, err)}
	}
	hook := hookOf(qs)
	if hook == nil {
		return false, nil
	}
	fs, err := listFilters(n.h, dev, netlink.HANDLE_MIN_INGRESS)
	if err != nil {
		return false, []error{fmt.Errorf("listing ingress filters on %s: %w", name, err)}
	}
	own := ownFilters(fs, targets, byPrio)
	for _, f := range own {
		t, _ := mirredTarget(f)
		found = found || targets[t]
	}
	errs := n.deleteOwn(dev, own)
	left, err := n.countFilters(dev, hook)
	if err != nil {
		return found, append(errs, err)
	}
	if left == 0 {
		if err := n.h.QdiscDel(hook); err != nil && !isGone(err) {
			errs = append(errs, fmt.Errorf("removing the empty %s qdisc from %s: %w", hook.Type(), name, err))
		}
	}
	return found, errs
}

// deleteOwn deletes podwire's filters from dev's ingress hook. FilterPrio is podwire's,
// so it goes whole. Elsewhere (the reference plugin's redirect at pref 1) only the
// redirect's own u32 node is deleted, and then the preference when nothing but u32's
// empty hash table is left in it, as that table outlives its last node.
func (n *Netlink) deleteOwn(dev netlink.Link, own []netlink.Filter) []error {
	name := dev.Attrs().Name
	var errs []error
	whole := map[uint16]uint16{} // preference -> protocol
	touched := map[uint16]bool{}
	for _, f := range own {
		a := f.Attrs()
		if a.Priority == FilterPrio {
			whole[a.Priority] = a.Protocol
			continue
		}
		if err := n.h.FilterDel(f); err != nil && !isGone(err) {
			errs = append(errs, fmt.Errorf("removing podwire's filter pref %d from %s: %w", a.Priority, name, err))
		}
		touched[a.Priority] = true
	}
	if len(touched) > 0 {
		fs, err := listFilters(n.h, dev, netlink.HANDLE_MIN_INGRESS)
		if err != nil {
			return append(errs, fmt.Errorf("listing ingress filters on %s: %w", name, err))
		}
		for prio := range touched {
			empty, proto := true, uint16(0)
			for _, f := range fs {
				if a := f.Attrs(); a.Priority == prio {
					proto = a.Protocol
					if _, isU32 := f.(*netlink.U32); !isU32 || a.Handle&0xfff != 0 {
						empty = false
					}
				}
			}
			if empty && proto != 0 {
				whole[prio] = proto
			}
		}
	}
	for prio, proto := range whole {
		f := &netlink.U32{FilterAttrs: netlink.FilterAttrs{LinkIndex: dev.Attrs().Index, Parent: netlink.HANDLE_MIN_INGRESS, Priority: prio, Protocol: proto}}
		if err := n.h.FilterDel(f); err != nil && !isGone(err) {
			errs = append(errs, fmt.Errorf("removing filter preference %d from %s: %w", prio, name, err))
		}
	}
	return errs
}

func (n *Netlink) countFilters(dev netlink.Link, hook netlink.Qdisc) (int, error) {
	parents := []uint32{netlink.HANDLE_MIN_INGRESS}
	if hook.Type() == "clsact" {
		parents = append(parents, netlink.HANDLE_MIN_EGRESS)
	}
	total := 0
	for _, p := range parents {
		fs, err := listFilters(n.h, dev, p)
		if err != nil {
			return 0, fmt.Errorf("listing filters on %s: %w", dev.Attrs().Name, err)
		}
		total += len(fs)
	}
	return total, nil
}

// Observe implements Backend.
func (n *Netlink) Observe(_ context.Context, devName, ifbName string) (State, error) {
	var s State
	ifbIndex := 0
	if l, err := n.h.LinkByName(ifbName); err == nil {
		ifbIndex = l.Attrs().Index
		st := &IFBState{Kind: l.Type(), Mac: l.Attrs().HardwareAddr.String(), MTU: l.Attrs().MTU, Up: l.Attrs().Flags&net.FlagUp != 0, Alias: l.Attrs().Alias}
		qs, err := listQdiscs(n.h, l)
		if err != nil {
			return s, fmt.Errorf("listing qdiscs on IFB %s: %w", ifbName, err)
		}
		if t, _ := rootOf(qs); t != nil {
			k := kernelOf(t)
			st.Root = &k
		}
		s.IFB = st
	} else if !isNotFound(err) {
		return s, fmt.Errorf("looking up IFB %s: %w", ifbName, err)
	}

	if devName == "" {
		return s, nil
	}
	dev, err := n.h.LinkByName(devName)
	if isNotFound(err) {
		return s, nil
	}
	if err != nil {
		return s, fmt.Errorf("looking up host veth %s: %w", devName, err)
	}
	ds := &DevState{MTU: dev.Attrs().MTU}
	qs, err := listQdiscs(n.h, dev)
	if err != nil {
		return s, fmt.Errorf("listing qdiscs on %s: %w", devName, err)
	}
	if t, other := rootOf(qs); t != nil {
		k := kernelOf(t)
		ds.Root = &k
	} else {
		ds.RootOther = other
	}
	if hook := hookOf(qs); hook != nil {
		ds.Hook = hook.Type()
		fs, err := listFilters(n.h, dev, netlink.HANDLE_MIN_INGRESS)
		if err != nil {
			return s, fmt.Errorf("listing ingress filters on %s: %w", devName, err)
		}
		mine := ownFilters(fs, map[int]bool{ifbIndex: ifbIndex != 0}, true)
		for _, f := range mine {
			t, _ := mirredTarget(f)
			ds.Redirects = append(ds.Redirects, Redirect{Prio: f.Attrs().Priority, Target: n.nameOf(t)})
		}
		for _, f := range fs {
			if _, ok := mirredTarget(f); f.Attrs().Priority != FilterPrio && !(ok && slices.Contains(mine, f)) {
				ds.OtherFilters++
			}
		}
	}
	s.Dev = ds
	return s, nil
}

func (n *Netlink) nameOf(index int) string {
	if l, err := n.h.LinkByIndex(index); err == nil {
		return l.Attrs().Name
	}
	return fmt.Sprintf("ifindex %d", index)
}

func kernelOf(t *netlink.Tbf) KernelTBF {
	return KernelTBF{Rate: t.Rate, Buffer: t.Buffer, Limit: t.Limit, PeakRate: t.Peakrate}
}

// IFBs implements Backend.
func (n *Netlink) IFBs(context.Context) ([]IFB, error) {
	links, err := retryDump(n.h.LinkList)
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	var out []IFB
	for _, l := range links {
		if l.Type() == "ifb" {
			out = append(out, IFB{Name: l.Attrs().Name, Alias: l.Attrs().Alias})
		}
	}
	return out, nil
}

func listQdiscs(h *netlink.Handle, l netlink.Link) ([]netlink.Qdisc, error) {
	return retryDump(func() ([]netlink.Qdisc, error) { return h.QdiscList(l) })
}

func listFilters(h *netlink.Handle, l netlink.Link, parent uint32) ([]netlink.Filter, error) {
	return retryDump(func() ([]netlink.Filter, error) { return h.FilterList(l, parent) })
}

// retryDump repeats a netlink dump that the kernel interrupted because the table
// changed under it, as netlinksafe does; a few tries always suffice in practice.
func retryDump[T any](f func() ([]T, error)) ([]T, error) {
	var err error
	for range 10 {
		var out []T
		out, err = f()
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			return out, err
		}
	}
	return nil, fmt.Errorf("dump interrupted 10 times: %w", err)
}

func isNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, unix.ENODEV)
}

// isGone reports the errors deleting an already-absent qdisc, filter or link gives.
func isGone(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENODEV)
}

// ignoreGone makes deleting something already absent a success, for undo steps.
func ignoreGone(err error) error {
	if isGone(err) {
		return nil
	}
	return err
}
