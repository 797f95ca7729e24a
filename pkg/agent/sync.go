// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/containernetworking/cni/libcni"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/podwire/podwire/pkg/agent/conflist"
	"github.com/podwire/podwire/pkg/agent/install"
	"github.com/podwire/podwire/pkg/agent/kube"
	"github.com/podwire/podwire/pkg/agent/masq"
	"github.com/podwire/podwire/pkg/agent/routes"
	"github.com/podwire/podwire/pkg/runtimes"
)

// errNoPodCIDR: the own Node has no pod CIDR yet; the Node update that assigns one
// kicks the reconcilers again, so it is a state to report, not a failure to retry.
var errNoPodCIDR = errors.New("the Node has no spec.podCIDRs yet (kube-controller-manager --allocate-node-cidrs assigns them)")

// self is the own Node from the cache and its pod CIDRs.
func (a *Agent) self() (*corev1.Node, []netip.Prefix, error) {
	self, err := a.nodes.Get(a.cfg.NodeName)
	if err != nil {
		return nil, nil, fmt.Errorf("own Node %s not found; is --node-name (NODE_NAME) the Node's name? %w", a.cfg.NodeName, err)
	}
	cidrs, err := kube.PodCIDRs(self)
	if err == nil && len(cidrs) == 0 {
		err = errNoPodCIDR
	}
	return self, cidrs, err
}

// syncConflist is the install/conflist reconciler: the conflist for the own pod CIDRs.
// Its verdict is the Node condition's when it fails (no conflist: the network is not
// ready); it kicks the status reconciler whenever that verdict changes, and GC once
// there is a conflist.
func (a *Agent) syncConflist(ctx context.Context) error {
	_, cidrs, err := a.self()
	var cond *kube.Condition
	switch {
	case errors.Is(err, errNoPodCIDR):
		cond = &kube.Condition{Reason: "NoPodCIDR", Message: err.Error()}
		err = nil
	case err != nil:
		cond = &kube.Condition{Reason: "NodeNotFound", Message: err.Error()}
	default:
		if err = a.writeConflist(ctx, cidrs); err != nil {
			a.d.Metrics.InstallEvents.WithLabelValues("error").Inc()
			err = fmt.Errorf("writing the conflist: %w", err)
			cond = &kube.Condition{Reason: "ConflistFailed", Message: err.Error()}
		}
	}
	a.mu.Lock()
	changed := !a.confDone || (a.conf == nil) != (cond == nil) || (cond != nil && *cond != *a.conf)
	kickGC := cond == nil && !a.gcKicked
	a.confDone, a.conf, a.gcKicked = true, cond, a.gcKicked || kickGC
	a.mu.Unlock()
	if changed {
		a.r[rStatus].kick()
	}
	if kickGC && a.r[rGC] != nil {
		a.r[rGC].kick()
	}
	return err
}

// resolveVersion picks the conflist's cniVersion: the flag, or the runtime's.
func (a *Agent) resolveVersion(ctx context.Context) string {
	if a.cfg.CNIVersion != "" && a.cfg.CNIVersion != "auto" {
		return a.cfg.CNIVersion
	}
	if a.d.Runtime == nil {
		return runtimes.Conservative.MaxCNIVersion
	}
	name, ver, err := a.d.Runtime.Version(ctx)
	if err != nil {
		a.mu.Lock()
		first := !a.versionFailed
		a.versionFailed = true
		a.mu.Unlock()
		if first { // once, not on every sync
			a.d.Log.Warn("cannot ask the runtime its version; writing the conservative cniVersion until it answers", "err", err, "cniVersion", runtimes.Conservative.MaxCNIVersion)
		}
		return runtimes.Conservative.MaxCNIVersion
	}
	a.mu.Lock()
	a.versionFailed = false
	a.mu.Unlock()
	caps := runtimes.Lookup(name, ver)
	a.mu.Lock()
	changed := caps != a.caps
	a.caps = caps
	a.mu.Unlock()
	if changed {
		a.d.Log.Info("container runtime", "name", name, "version", ver, "row", caps.Source, "cniVersion", caps.MaxCNIVersion, "callsStatus", caps.CallsStatus, "gc", caps.GC.String())
	}
	return caps.MaxCNIVersion
}

func (a *Agent) writeConflist(ctx context.Context, cidrs []netip.Prefix) error {
	v := a.resolveVersion(ctx)
	b, err := conflist.Render(conflist.Params{Network: a.cfg.NetworkName, CNIVersion: v, Bridge: a.cfg.Bridge,
		MTU: a.cfg.MTU, PodCIDRs: cidrs, DataDir: a.cfg.IPAMDataDir})
	if err != nil {
		return err
	}
	r, err := a.inst.Conflist(a.ConflistPath(), b)
	if err != nil {
		return err
	}
	if r.Action == install.Foreign {
		return fmt.Errorf("%s exists and the agent did not write it; move it away or pass --replace-foreign", r.Path)
	}
	if r.Action != install.Unchanged {
		a.d.Metrics.InstallEvents.WithLabelValues(string(r.Action)).Inc()
		a.d.Log.Info("conflist", "path", r.Path, "action", r.Action, "cniVersion", v, "podCIDRs", cidrs)
	}
	l, err := libcni.ConfListFromBytes(b)
	if err != nil {
		return fmt.Errorf("libcni refuses the conflist the agent rendered: %w", err)
	}
	a.mu.Lock()
	a.list, a.version = l, v
	a.mu.Unlock()
	return nil
}

// syncMasquerade is the masquerade reconciler: the rules for the own pod CIDRs (none
// until the Node has one).
func (a *Agent) syncMasquerade(ctx context.Context) error {
	if !a.cfg.Masquerade || a.d.Masq == nil {
		return nil
	}
	_, cidrs, err := a.self()
	if errors.Is(err, errNoPodCIDR) {
		return nil
	}
	if err != nil {
		return err
	}
	plan, uncovered := masq.Plan(cidrs, a.cfg.ClusterCIDRs)
	if len(uncovered) > 0 {
		a.d.Log.Warn("no --cluster-cidr of these pod CIDRs' family: traffic to other nodes' pods is masqueraded; set --cluster-cidr", "podCIDRs", uncovered)
	}
	if err := masq.Sync(ctx, a.d.Masq, plan); err != nil {
		a.d.Metrics.MasqueradeSync.WithLabelValues("error").Inc()
		return fmt.Errorf("masquerade rules: %w", err)
	}
	a.d.Metrics.MasqueradeSync.WithLabelValues("success").Inc()
	return nil
}

// syncRoutes is the routes reconciler: the agent's routes (its route protocol) are
// made exactly the plan for the cached Nodes, so routes to CIDRs no Node has any more,
// also of Nodes deleted while the agent was down, go; other routes are never listed.
func (a *Agent) syncRoutes(context.Context) error {
	all, err := a.nodes.List(labels.Everything())
	if err != nil {
		a.d.Metrics.RouteSync.WithLabelValues("error").Inc()
		return err
	}
	nodes := make([]routes.Node, 0, len(all))
	for _, n := range all {
		nodes = append(nodes, kube.RouteNode(n))
	}
	conn, err := a.d.Routes.Connected()
	if err != nil {
		a.d.Metrics.RouteSync.WithLabelValues("error").Inc()
		return fmt.Errorf("listing connected subnets: %w", err)
	}
	want, skipped := routes.Plan(a.cfg.NodeName, conn, nodes)
	for _, s := range skipped {
		a.d.Log.Debug("no route", "why", s)
	}
	ch, err := routes.Sync(a.d.Routes, want)
	for _, r := range ch.Added {
		a.d.Log.Info("route added", "route", r.String())
	}
	for _, r := range ch.Removed {
		a.d.Log.Info("route removed", "route", r.String())
	}
	if err != nil {
		a.d.Metrics.RouteSync.WithLabelValues("error").Inc()
		return fmt.Errorf("route sync: %w", err)
	}
	a.d.Metrics.RouteSync.WithLabelValues("success").Inc()
	a.d.Metrics.Routes.Set(float64(len(want)))
	return nil
}

func (a *Agent) current() *libcni.NetworkConfigList {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.list
}
