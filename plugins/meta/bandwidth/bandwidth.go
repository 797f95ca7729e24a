// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/tc"
)

// shaper holds the plugin's seams: the tc backend, the host-veth lookup and the kernel
// probe. main wires the real ones; unit tests use tc.Fake and a table of veths.
type shaper struct {
	tc tc.Backend
	// hostVeth returns the host side of ifName in the pod netns, or errGone.
	hostVeth func(netns, ifName string) (name string, mtu int, err error)
	probe    func(context.Context) error
}

// add shapes the attachment and passes prevResult on, with the IFB appended to its
// interfaces as the reference does. Without a bandwidth request it touches nothing and
// passes prevResult on as received (in.Prev), as the reference does.
func (s *shaper) add(ctx context.Context, in *cniplumb.Input) (types.Result, error) {
	req, err := parseConf(in.Stdin)
	if err != nil {
		return nil, err
	}
	prev, err := in.RequirePrevResult()
	if err != nil {
		return nil, err
	}
	lg := cniplumb.Log(ctx)
	if req.Empty() {
		lg.Decision("no bandwidth request: nothing to do")
		return in.Prev, nil
	}
	done := lg.Step("plan")
	plan, err := s.plan(ctx, in, req)
	done()
	if err != nil {
		return nil, err
	}
	lg.Decision("shaping", "from", fromOrConf(req.From), "ingress", req.Ingress.String(), "egress", req.Egress.String(), "ifb", plan.IFB)
	done = lg.Step("apply tc")
	err = s.tc.Apply(ctx, plan)
	done()
	if err != nil {
		return nil, fmt.Errorf("shaping %s of container %s: %w", in.IfName, in.ContainerID, err)
	}
	res := *prev
	res.Interfaces = slices.Clone(prev.Interfaces)
	if plan.Egress != nil {
		st, err := s.tc.Observe(ctx, "", plan.IFB)
		if err != nil {
			return nil, fmt.Errorf("reading back IFB %s: %w", plan.IFB, err)
		}
		if st.IFB == nil {
			return nil, fmt.Errorf("IFB %s vanished right after it was created", plan.IFB)
		}
		res.Interfaces = append(res.Interfaces, &current.Interface{Name: plan.IFB, Mac: st.IFB.Mac})
	}
	return &res, nil
}

// plan finds the host veth, picks the IFB's name and sizes the TBFs.
func (s *shaper) plan(ctx context.Context, in *cniplumb.Input, req Request) (tc.Plan, error) {
	dev, mtu, err := s.hostVeth(in.Netns, in.IfName)
	if errors.Is(err, errGone) {
		return tc.Plan{}, fmt.Errorf("interface %s in %s does not exist: bandwidth must come after the plugin that creates it (bridge, ptp) in the conflist", in.IfName, in.Netns)
	}
	if err != nil {
		return tc.Plan{}, err
	}
	ifb, err := s.pickIFB(ctx, in.Owner())
	if err != nil {
		return tc.Plan{}, err
	}
	return planShaping(in.Owner(), req, dev, ifb, mtu)
}

// pickIFB names the attachment's IFB. An IFB the attachment already has keeps its
// name. A new one gets the reference's name for its container when that is free, so
// the reference's DEL, which deletes it by name, finds it after a node switches back;
// podwire's per-interface name when another attachment (a second interface of the pod,
// or a pod the reference shaped) holds it.
func (s *shaper) pickIFB(ctx context.Context, o cniplumb.Owner) (string, error) {
	ref := referenceIFBName(o.Network, o.ContainerID)
	st, err := s.tc.Observe(ctx, "", ref)
	if err != nil {
		return "", err
	}
	if st.IFB != nil && tc.OwnedBy(st.IFB.Alias, o) {
		return ref, nil
	}
	own, err := ifbName(o)
	if err != nil {
		return "", err
	}
	if st.IFB == nil {
		ost, err := s.tc.Observe(ctx, "", own)
		if err != nil {
			return "", err
		}
		if ost.IFB == nil {
			return ref, nil
		}
	}
	return own, nil
}

// del removes the redirect, the root TBF and the IFB: podwire's per-interface name,
// and the reference's name for the container unless its alias gives it to another
// attachment (an IFB without podwire's alias is the reference's, from before an
// upgrade). It succeeds when they, the veth or the netns are gone, and it does not
// depend on the request being valid, so a DEL after a rejected ADD still succeeds.
func (s *shaper) del(ctx context.Context, in *cniplumb.Input) error {
	o := in.Owner()
	own, err := ifbName(o)
	if err != nil {
		return err
	}
	ref := referenceIFBName(o.Network, o.ContainerID)
	st, err := s.tc.Observe(ctx, "", ref)
	if err != nil {
		return err
	}
	var ifbs []string
	if st.IFB != nil && (!tc.PodwireAlias(st.IFB.Alias) || tc.OwnedBy(st.IFB.Alias, o)) {
		ifbs = append(ifbs, ref)
	}
	req, perr := parseConf(in.Stdin)
	if perr == nil && req.Empty() && len(ifbs) == 0 {
		// No request: the only thing worth more work is an IFB left by an ADD that had
		// one (a runtime that passes different runtimeConfig to DEL).
		st, err := s.tc.Observe(ctx, "", own)
		if err != nil {
			return err
		}
		if st.IFB == nil {
			return nil
		}
	}
	ifbs = append(ifbs, own)
	dev, _, err := s.hostVeth(in.Netns, in.IfName)
	if err != nil {
		// Gone, or not a veth (then nothing of ours is on it): the IFBs still go.
		dev = ""
	}
	defer cniplumb.Log(ctx).Step("remove tc")()
	if err := s.tc.Remove(ctx, tc.Removal{Dev: dev, IFBs: ifbs}); err != nil {
		return fmt.Errorf("removing shaping of %s of container %s: %w", in.IfName, in.ContainerID, err)
	}
	return nil
}

// check compares every qdisc, filter and IFB podwire owns for the attachment with what
// the request implies, including that unrequested ones are absent.
func (s *shaper) check(ctx context.Context, in *cniplumb.Input) error {
	req, err := parseConf(in.Stdin)
	if err != nil {
		return err
	}
	if _, err := in.RequirePrevResult(); err != nil {
		return err
	}
	if req.Empty() {
		return nil
	}
	plan, err := s.plan(ctx, in, req)
	if err != nil {
		return err
	}
	st, err := s.tc.Observe(ctx, plan.Dev, plan.IFB)
	if err != nil {
		return err
	}
	if d := tc.Diff(plan, st); d != nil {
		return fmt.Errorf("bandwidth shaping of %s in container %s does not match the request: %s; recreate the pod (DEL and ADD) to restore it", in.IfName, in.ContainerID, strings.Join(d, "; "))
	}
	return nil
}

// gc deletes this network's IFBs whose attachment is not in cni.dev/valid-attachments.
func (s *shaper) gc(ctx context.Context, in *cniplumb.Input) error {
	ifbs, err := s.tc.IFBs(ctx)
	if err != nil {
		return err
	}
	stale := tc.PlanGC(ifbs, in.Conf.Name, in.ValidAttachments)
	var errs []error
	for _, r := range stale {
		if err := s.tc.Remove(ctx, r); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("garbage-collecting IFBs of network %s: %w", in.Conf.Name, err)
	}
	return nil
}

// status is code 50 when the kernel cannot create an IFB, a TBF or the redirect.
func (s *shaper) status(ctx context.Context, _ *cniplumb.Input) error {
	if err := s.probe(ctx); err != nil {
		return cniplumb.NotAvailable("bandwidth cannot shape traffic on this node: %v; build or load the missing kernel support", err)
	}
	return nil
}

// fromOrConf names where a request came from, for the log.
func fromOrConf(from string) string {
	if from == "" {
		return "plugin configuration"
	}
	return from
}
