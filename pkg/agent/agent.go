// SPDX-License-Identifier: Apache-2.0

// Package agent is podwire-agent's node loop: install the plugins, write the conflist
// for the Node's pod CIDRs, keep host-gw routes and the masquerade in sync with the
// cluster's Nodes, drive the chain's GC, and report STATUS and free addresses on the
// Node. The pieces live in subpackages (install, conflist, routes, masq, gc, usage, kube,
// cri, metrics); this package wires them, behind small interfaces so a unit test runs
// the whole loop on fakes.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"reflect"
	"sync"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/podwire/podwire/pkg/agent/conflist"
	"github.com/podwire/podwire/pkg/agent/cri"
	"github.com/podwire/podwire/pkg/agent/gc"
	"github.com/podwire/podwire/pkg/agent/install"
	"github.com/podwire/podwire/pkg/agent/kube"
	"github.com/podwire/podwire/pkg/agent/masq"
	"github.com/podwire/podwire/pkg/agent/metrics"
	"github.com/podwire/podwire/pkg/agent/routes"
	"github.com/podwire/podwire/pkg/agent/usage"
	"github.com/podwire/podwire/pkg/runtimes"
)

// Config is the agent's flags, parsed.
type Config struct {
	NodeName       string
	SourceBinDir   string
	CNIBinDir      string
	CNIConfDir     string
	ConflistName   string
	NetworkName    string
	CNIVersion     string // "auto" or a version
	Bridge         string
	MTU            int
	IPAMDataDir    string // host-local's dataDir; "" is its default
	CNICacheDir    string
	ClusterCIDRs   []netip.Prefix
	GCPeriod       time.Duration
	GCGrace        time.Duration // attachments with a younger lease are kept (gc.Young)
	StatusPeriod   time.Duration
	StateDir       string
	ReplaceForeign bool
	Routes         bool
	Masquerade     bool
}

// Runtime is the CRI as the agent uses it (*cri.Client).
type Runtime interface {
	Version(ctx context.Context) (name, version string, err error)
	Sandboxes(ctx context.Context) ([]cri.Sandbox, error)
	Networks(ctx context.Context) ([]cri.Network, error)
}

var _ Runtime = (*cri.Client)(nil)

// Deps are the agent's backends.
type Deps struct {
	Kube    kubernetes.Interface
	Runtime Runtime // nil: no CRI (GC skipped; --cni-version must be set)
	Routes  routes.Backend
	Masq    masq.Backend
	CNI     gc.CNI
	Links   func() (map[string]map[string]bool, error)    // for GC's reclaimed counts; may be nil
	Rules   func(network string) (map[string]bool, error) // likewise, netfilter objects; may be nil
	Metrics *metrics.Metrics
	Log     *slog.Logger
}

// Agent is one node's agent.
type Agent struct {
	cfg   Config
	d     Deps
	inst  *install.Installer
	nodes corelisters.NodeLister

	mu            sync.Mutex
	list          *libcni.NetworkConfigList // the conflist written, nil before
	version       string                    // the resolved cniVersion
	caps          runtimes.Capabilities
	versionFailed bool
	ready         bool // last STATUS succeeded
	lastLoop      time.Time
	lastStatus    time.Time
	lastNote      string // annotation last written
	lastCond      kube.Condition
}

// New loads the install manifest.
func New(cfg Config, d Deps) (*Agent, error) {
	if d.Log == nil {
		d.Log = slog.Default()
	}
	if d.Metrics == nil {
		d.Metrics = metrics.New()
	}
	if cfg.StatusPeriod == 0 {
		cfg.StatusPeriod = 30 * time.Second
	}
	inst, err := install.New(cfg.StateDir, cfg.ReplaceForeign)
	if err != nil {
		return nil, err
	}
	inst.Skip = []string{"podwire-agent"}
	return &Agent{cfg: cfg, d: d, inst: inst}, nil
}

// ConflistPath is where the conflist goes.
func (a *Agent) ConflistPath() string { return filepath.Join(a.cfg.CNIConfDir, a.cfg.ConflistName) }

// InstallBinaries copies the plugins (the first thing the agent does).
func (a *Agent) InstallBinaries() error {
	rs, err := a.inst.Binaries(a.cfg.SourceBinDir, a.cfg.CNIBinDir)
	for _, r := range rs {
		a.d.Metrics.InstallEvents.WithLabelValues(string(r.Action)).Inc()
		if r.Action == install.Foreign {
			a.d.Log.Warn("left a plugin binary the agent did not install; pass --replace-foreign to take it over", "path", r.Path)
		} else if r.Action != install.Unchanged {
			a.d.Log.Info("plugin binary", "path", r.Path, "action", r.Action)
		}
	}
	if err != nil {
		a.d.Metrics.InstallEvents.WithLabelValues("error").Inc()
	}
	return err
}

// Run installs, then runs the node loop until ctx ends.
func (a *Agent) Run(ctx context.Context) error {
	if err := a.InstallBinaries(); err != nil {
		return fmt.Errorf("installing the plugins: %w", err)
	}
	var opts []informers.SharedInformerOption
	if !a.cfg.Routes {
		opts = append(opts, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", a.cfg.NodeName).String()
		}))
	}
	f := informers.NewSharedInformerFactoryWithOptions(a.d.Kube, 0, opts...)
	inf := f.Core().V1().Nodes()
	a.nodes = inf.Lister()
	kick := make(chan struct{}, 1)
	poke := func() {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { poke() },
		UpdateFunc: func(o, n any) { poke() },
		DeleteFunc: func(any) { poke() },
	}); err != nil {
		return err
	}
	f.Start(ctx.Done())
	defer f.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced) {
		return fmt.Errorf("the Node informer never synced: %w", ctx.Err())
	}
	go a.gcLoop(ctx)
	status := time.NewTicker(a.cfg.StatusPeriod)
	defer status.Stop()
	poke()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-kick:
			a.Sync(ctx)
		case <-status.C:
			a.Sync(ctx)
		}
		a.mu.Lock()
		a.lastLoop = time.Now()
		a.mu.Unlock()
	}
}

// Sync is one pass: conflist, masquerade, routes, STATUS and usage. Failures are logged
// and counted; the next event or tick tries again.
func (a *Agent) Sync(ctx context.Context) {
	self, err := a.nodes.Get(a.cfg.NodeName)
	if err != nil {
		a.d.Log.Error("own Node not found; is --node-name (NODE_NAME) the Node's name?", "node", a.cfg.NodeName, "err", err)
		return
	}
	cidrs, err := kube.PodCIDRs(self)
	if err == nil && len(cidrs) == 0 {
		err = errors.New("the Node has no spec.podCIDRs yet (kube-controller-manager --allocate-node-cidrs assigns them)")
	}
	if err != nil {
		a.report(ctx, self, kube.Condition{Reason: "NoPodCIDR", Message: err.Error()})
		return
	}
	if err := a.writeConflist(ctx, cidrs); err != nil {
		a.d.Log.Error("conflist", "err", err)
		a.d.Metrics.InstallEvents.WithLabelValues("error").Inc()
		a.report(ctx, self, kube.Condition{Reason: "ConflistFailed", Message: err.Error()})
		return
	}
	a.syncMasquerade(ctx, cidrs)
	if a.cfg.Routes {
		a.syncRoutes()
	}
	// Other Nodes' heartbeats wake the loop often; STATUS execs every plugin, so it runs
	// at most every few seconds (and on every status tick).
	a.mu.Lock()
	due := time.Since(a.lastStatus) >= statusMinInterval
	if due {
		a.lastStatus = time.Now()
	}
	a.mu.Unlock()
	if due {
		a.status(ctx, self, cidrs)
	}
}

// statusMinInterval spaces STATUS runs triggered by Node events.
const statusMinInterval = 5 * time.Second

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

func (a *Agent) syncMasquerade(ctx context.Context, cidrs []netip.Prefix) {
	if !a.cfg.Masquerade || a.d.Masq == nil {
		return
	}
	plan, uncovered := masq.Plan(cidrs, a.cfg.ClusterCIDRs)
	if len(uncovered) > 0 {
		a.d.Log.Warn("no --cluster-cidr of these pod CIDRs' family: traffic to other nodes' pods is masqueraded; set --cluster-cidr", "podCIDRs", uncovered)
	}
	if err := masq.Sync(ctx, a.d.Masq, plan); err != nil {
		a.d.Metrics.MasqueradeSync.WithLabelValues("error").Inc()
		a.d.Log.Error("masquerade rules", "err", err)
		return
	}
	a.d.Metrics.MasqueradeSync.WithLabelValues("success").Inc()
}

func (a *Agent) syncRoutes() {
	all, err := a.nodes.List(labels.Everything())
	if err != nil {
		a.d.Metrics.RouteSync.WithLabelValues("error").Inc()
		return
	}
	var nodes []routes.Node
	for _, n := range all {
		nodes = append(nodes, kube.RouteNode(n))
	}
	conn, err := a.d.Routes.Connected()
	if err != nil {
		a.d.Metrics.RouteSync.WithLabelValues("error").Inc()
		a.d.Log.Error("listing connected subnets", "err", err)
		return
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
		a.d.Log.Error("route sync", "err", err)
		return
	}
	a.d.Metrics.RouteSync.WithLabelValues("success").Inc()
	a.d.Metrics.Routes.Set(float64(len(want)))
}

func (a *Agent) current() *libcni.NetworkConfigList {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.list
}

// status runs STATUS, publishes the condition, the free addresses and the metrics.
func (a *Agent) status(ctx context.Context, self *corev1.Node, cidrs []netip.Prefix) {
	cond := kube.Condition{Ready: true, Reason: "StatusOK", Message: "every plugin of the chain answered STATUS"}
	if err := gc.Status(ctx, a.d.CNI, a.current()); err != nil {
		cond = kube.Condition{Reason: "StatusFailed", Message: err.Error()}
		var te *types.Error
		if errors.As(err, &te) {
			cond.Reason = fmt.Sprintf("StatusCode%d", te.Code)
		}
	}
	a.report(ctx, self, cond)
	dataDir := a.cfg.IPAMDataDir
	if dataDir == "" {
		dataDir = defaultDataDir
	}
	leases, err := gc.Leases(dataDir, a.cfg.NetworkName)
	if err != nil {
		a.d.Log.Error("reading host-local's leases", "dir", dataDir, "err", err)
		return
	}
	rs := usage.Count(cidrs, leases)
	a.d.Metrics.AddressesFree.Reset()
	a.d.Metrics.AddressesUsed.Reset()
	for _, r := range rs {
		a.d.Metrics.AddressesFree.WithLabelValues(r.Range).Set(float64(r.Free))
		a.d.Metrics.AddressesUsed.WithLabelValues(r.Range).Set(float64(r.Used))
	}
	if cached, err := a.d.CNI.GetCachedAttachments(""); err == nil {
		n := 0
		for _, c := range cached {
			if c.Network == a.cfg.NetworkName {
				n++
			}
		}
		a.d.Metrics.Attachments.Set(float64(n))
	}
	note := usage.Annotation(rs)
	if self.Annotations[kube.FreeAddressesAnnotation] != note {
		if err := kube.PatchAnnotation(ctx, a.d.Kube, a.cfg.NodeName, kube.FreeAddressesAnnotation, note); err != nil {
			a.d.Log.Error("free-addresses annotation", "err", err)
		}
	}
}

// defaultDataDir is host-local's default dataDir.
const defaultDataDir = "/var/lib/cni/networks"

// report sets the Node condition (every call refreshes its heartbeat).
func (a *Agent) report(ctx context.Context, self *corev1.Node, cond kube.Condition) {
	a.mu.Lock()
	a.ready = cond.Ready
	changed := !reflect.DeepEqual(cond, a.lastCond)
	a.lastCond = cond
	a.mu.Unlock()
	if cond.Ready {
		a.d.Metrics.NetworkReady.Set(1)
	} else {
		a.d.Metrics.NetworkReady.Set(0)
	}
	if changed {
		a.d.Log.Info("network condition", "ready", cond.Ready, "reason", cond.Reason, "message", cond.Message)
	}
	if !kube.NeedsPatch(self, cond, time.Now(), a.cfg.StatusPeriod) {
		return
	}
	if err := kube.PatchCondition(ctx, a.d.Kube, self, cond, time.Now()); err != nil {
		a.d.Log.Error("node condition", "err", err)
	}
}

// Healthy reports whether the loop ran recently.
func (a *Agent) Healthy() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.lastLoop.IsZero() || time.Since(a.lastLoop) < 3*a.cfg.StatusPeriod+time.Minute
}

// Ready reports whether the conflist is written and the last STATUS succeeded.
func (a *Agent) Ready() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.list != nil && a.ready
}

// Uninstall removes what the agent installed: conflist, binaries (when unchanged),
// masquerade rules and routes. It keeps going after failures and returns them all.
func Uninstall(ctx context.Context, cfg Config, d Deps) error {
	if d.Log == nil {
		d.Log = slog.Default()
	}
	var errs []error
	inst, err := install.New(cfg.StateDir, false)
	if err == nil {
		rs, err := inst.Uninstall()
		for _, r := range rs {
			d.Log.Info("uninstall", "path", r.Path, "action", r.Action)
		}
		errs = append(errs, err)
	} else {
		errs = append(errs, err)
	}
	if d.Masq != nil {
		errs = append(errs, masq.Remove(ctx, d.Masq))
	}
	if d.Routes != nil {
		ch, err := routes.RemoveAll(d.Routes)
		for _, r := range ch.Removed {
			d.Log.Info("uninstall: route removed", "route", r.String())
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
