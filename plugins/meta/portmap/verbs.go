// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/podwire/podwire/pkg/cleanup"
	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/netfilter"
	"github.com/podwire/podwire/pkg/portstate"
)

// portmap holds the plugin's seams: the backend opener, the marker directory and the
// host-side effects. main wires the real ones; unit tests wire fakes.
type portmap struct {
	open  func(netfilter.Kind) (netfilter.HostPortBackend, netfilter.Kind, error)
	probe func() netfilter.Probe
	state portstate.Dir
	// routeIface finds the host interface that routes to a pod address ("" for none).
	routeIface func(pod netip.Addr) (string, error)
	// localnet counts the users of route_localnet per interface.
	localnet localnetUsers
	flushUDP func(ipv6 bool, ports []uint16) error
	logf     func(format string, a ...any)
}

func stderrf(format string, a ...any) { fmt.Fprintf(os.Stderr, "portmap: "+format+"\n", a...) }

// localnetUsers keeps route_localnet on while an attachment needs it (host_linux.go).
type localnetUsers interface {
	hold(iface string, id netfilter.OwnerID) error
	release(iface string, id netfilter.OwnerID) error
}

// add installs the attachment's host ports and passes prevResult through as received
// (in.Prev), as the reference does. Without portMappings it touches neither the
// firewall nor the disk.
func (pm *portmap) add(ctx context.Context, in *cniplumb.Input) (_ types.Result, err error) {
	conf, err := parseConf(in.Stdin)
	if err != nil {
		return nil, err
	}
	res, err := in.RequirePrevResult()
	if err != nil {
		return nil, err
	}
	lg := cniplumb.Log(ctx)
	if len(conf.Mappings) == 0 {
		lg.Decision("no portMappings: nothing to do")
		return in.Prev, nil
	}
	owner := in.Owner()
	plan, err := planHostPorts(conf, owner, res, in.IfName)
	if err != nil {
		return nil, err
	}
	if plan.Empty() {
		return in.Prev, nil
	}
	fw, kind, err := pm.open(conf.Backend)
	if err != nil {
		return nil, err
	}
	lg.Decision("host ports", "backend", string(kind), "mappings", len(conf.Mappings), "snat", plan.SNAT)
	var undo cleanup.Stack
	defer undo.RunIfFailed(&err)
	// A repeated ADD of the attachment: rules the new plan does not replace (another
	// backend, or a family it no longer has) go first, so the marker below describes
	// everything the attachment owns.
	old, hadOld, err := pm.state.Read(owner)
	if err != nil {
		return nil, err
	}
	if hadOld && (old.Backend != kind || old.Families&^plan.Families() != 0) {
		if err := pm.removeWith(ctx, old.Kinds(), owner, old.Families); err != nil {
			return nil, fmt.Errorf("removing the host ports of the previous ADD of %s: %w", owner, err)
		}
	}
	// The marker goes first: a plugin killed between the two steps leaves a marker
	// without rules, which DEL handles, never rules without a marker.
	m := portstate.MarkerOf(plan, kind)
	if m.Localnet, err = pm.localnetIface(plan); err != nil {
		return nil, err
	}
	if hadOld && old.Localnet != "" && old.Localnet != m.Localnet {
		pm.releaseLocalnet(old.Localnet, netfilter.IDOf(owner))
	}
	if err := pm.state.Write(owner, m); err != nil {
		return nil, err
	}
	undo.Push("remove the marker of "+owner.String(), func() error { return pm.state.Remove(owner) })
	// route_localnet and the rules are independent (the marker already names both):
	// set the knob while the rules go in.
	var holdErr error
	held := make(chan struct{})
	go func() {
		defer close(held)
		if m.Localnet != "" {
			holdErr = pm.localnet.hold(m.Localnet, netfilter.IDOf(owner))
		}
	}()
	done := lg.Step("apply rules (" + string(kind) + ")")
	applyErr := fw.Apply(ctx, plan)
	done()
	<-held
	if m.Localnet != "" && holdErr == nil {
		undo.Push("release route_localnet on "+m.Localnet, func() error { return pm.localnet.release(m.Localnet, netfilter.IDOf(owner)) })
	}
	if applyErr != nil {
		return nil, fmt.Errorf("installing host ports of %s with %s: %w", owner, kind, applyErr)
	}
	undo.Push("remove the host-port rules of "+owner.String(), func() error { return fw.Remove(context.WithoutCancel(ctx), owner, plan.Families()) })
	if holdErr != nil {
		return nil, holdErr
	}
	// Flush only after the DNAT exists: flushing first lets a packet in between
	// re-create the very entry removed.
	done = lg.Step("conntrack flush")
	pm.flush(m)
	done()
	return in.Prev, nil
}

// localnetIface is the interface whose route_localnet the plan needs: the one routing
// to the pod's IPv4 address, when connections from 127.0.0.1 are masqueraded.
func (pm *portmap) localnetIface(p netfilter.HostPortPlan) (string, error) {
	if !p.SNAT {
		return "", nil
	}
	for _, hp := range p.Ports {
		if hp.Family() == netfilter.IPv4 {
			return pm.routeIface(hp.Pod.Addr())
		}
	}
	return "", nil
}

// releaseLocalnet drops an attachment's use of route_localnet; failures are only
// logged (the knob is harmless left on, and DEL must not fail over it).
func (pm *portmap) releaseLocalnet(iface string, id netfilter.OwnerID) {
	if err := pm.localnet.release(iface, id); err != nil {
		pm.logf("releasing route_localnet on %s: %v", iface, err)
	}
}

// flush removes stale UDP conntrack entries for a marker's ports. Failures are only
// logged: the forward works, and the entries expire by themselves.
func (pm *portmap) flush(m portstate.Marker) {
	for _, f := range []struct {
		v6    bool
		ports []uint16
	}{{false, m.UDP4}, {true, m.UDP6}} {
		if len(f.ports) == 0 {
			continue
		}
		if err := pm.flushUDP(f.v6, f.ports); err != nil {
			pm.logf("flushing stale UDP conntrack entries of %s: %v", m.Owner, err)
		}
	}
}

// del removes exactly this attachment's host ports, found through its marker, so the
// runtime need not pass portMappings again. Without a marker but with portMappings
// in the configuration, the attachment was set up by the reference portmap (or the
// marker was lost): its rules are removed from both backends. Without either there
// is nothing to do, at no cost. Whatever is already gone is success.
func (pm *portmap) del(ctx context.Context, in *cniplumb.Input) error {
	owner := in.Owner()
	m, ok, err := pm.state.Read(owner)
	if err != nil {
		return err
	}
	if ok {
		// Release route_localnet (while the rules go) before the marker goes: a DEL
		// killed in between then leaves the marker, and the next DEL finishes the job;
		// the other order would leave route_localnet held by an attachment nobody can
		// find.
		released := make(chan struct{})
		go func() {
			defer close(released)
			if m.Localnet != "" {
				pm.releaseLocalnet(m.Localnet, netfilter.IDOf(owner))
			}
		}()
		done := cniplumb.Log(ctx).Step("remove rules")
		err := pm.removeWith(ctx, m.Kinds(), owner, m.Families)
		done()
		<-released
		if err != nil {
			return err
		}
		defer cniplumb.Log(ctx).Step("conntrack flush")()
		pm.flush(m)
		return pm.state.Remove(owner)
	}
	tc := parseTeardownConf(in.Stdin)
	if !tc.HasMappings {
		return nil
	}
	if err := pm.removeWith(ctx, []netfilter.Kind{netfilter.KindIPTables, netfilter.KindNFTables}, owner, netfilter.All); err != nil {
		return err
	}
	pm.flush(portstate.Marker{Owner: owner.Key(), UDP4: tc.UDPPorts, UDP6: tc.UDPPorts})
	return nil
}

// removeWith removes owner's rules with each backend kind; a backend this node does
// not have (no iptables installed, no nf_tables in the kernel) holds no rules.
func (pm *portmap) removeWith(ctx context.Context, kinds []netfilter.Kind, owner cniplumb.Owner, fams netfilter.Families) error {
	var errs []error
	for _, k := range kinds {
		if k == netfilter.KindNFTables && len(kinds) > 1 && !pm.probe().NFTables {
			continue
		}
		fw, _, err := pm.open(k)
		if cniplumb.Code(err) == cniplumb.CodeNotAvailable {
			continue
		}
		if err == nil {
			err = fw.Remove(ctx, owner, fams)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("removing host ports of %s (%s): %w", owner, k, err))
		}
	}
	return errors.Join(errs...)
}

// check verifies the attachment's rules are installed as configured. Without
// portMappings it only looks for a leftover marker (no firewall access).
func (pm *portmap) check(ctx context.Context, in *cniplumb.Input) error {
	conf, err := parseConf(in.Stdin)
	if err != nil {
		return err
	}
	res, err := in.RequirePrevResult()
	if err != nil {
		return err
	}
	owner := in.Owner()
	m, ok, err := pm.state.Read(owner)
	if err != nil {
		return err
	}
	plan, err := planHostPorts(conf, owner, res, in.IfName)
	if err != nil {
		return err
	}
	if plan.Empty() {
		if ok {
			return fmt.Errorf("%s has host ports installed (%s) but its configuration has no portMappings; run DEL and ADD again", owner, m)
		}
		return nil
	}
	if !ok {
		return fmt.Errorf("%s has no host ports installed although its configuration has portMappings; run DEL and ADD again", owner)
	}
	fw, _, err := pm.open(m.Backend)
	if err != nil {
		return err
	}
	if err := fw.Check(ctx, plan); err != nil {
		return fmt.Errorf("checking host ports of %s (%s): %w", owner, m.Backend, err)
	}
	return nil
}

// gc removes the host ports of every attachment of this network that the runtime
// does not list, with the configured backend and every backend a marker names, and
// their markers.
func (pm *portmap) gc(ctx context.Context, in *cniplumb.Input) error {
	tc := parseTeardownConf(in.Stdin)
	network := in.Conf.Name
	markers, err := pm.state.List(network)
	if err != nil {
		return err
	}
	configured := netfilter.Kind("")
	if _, k, err := pm.open(tc.Backend); err == nil {
		configured = k
	}
	kinds := portstate.GCKinds(configured, markers)
	var errs []error
	for _, k := range kinds {
		fw, _, err := pm.open(k)
		if cniplumb.Code(err) == cniplumb.CodeNotAvailable {
			continue
		}
		if err == nil {
			err = fw.GC(ctx, network, in.ValidAttachments)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("collecting host ports of network %s (%s): %w", network, k, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err // keep the markers, so the next GC or DEL tries again
	}
	for _, m := range portstate.PlanGC(markers, network, in.ValidAttachments) {
		// The backends' GC finds attachments through the jumps into their chains;
		// where someone flushed those away, the marker still names the owner, whose
		// chain Remove finds by its derived name.
		if o, ok := portstate.OwnerOfKey(m.Owner); ok && netfilter.IDOf(o) == m.ID {
			if err := pm.removeWith(ctx, m.Marker.Kinds(), o, m.Families); err != nil {
				errs = append(errs, err)
				continue // keep the marker for the next GC
			}
		}
		pm.flush(m.Marker)
		// route_localnet first, as in DEL: a GC killed in between leaves the marker
		// for the next GC.
		if m.Localnet != "" {
			pm.releaseLocalnet(m.Localnet, m.ID)
		}
		if err := os.Remove(m.File); err != nil && !os.IsNotExist(err) {
			errs = append(errs, cniplumb.IOError("removing portmap state "+m.File, err))
		}
	}
	return errors.Join(errs...)
}

// status reports the configured backend unusable (code 50) when it is.
func (pm *portmap) status(_ context.Context, in *cniplumb.Input) error {
	conf, err := parseConf(in.Stdin)
	if err != nil {
		return err
	}
	_, err = netfilter.Pick(conf.Backend, pm.probe())
	return err
}
