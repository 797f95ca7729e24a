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
	"sync"
	"time"

	"github.com/containernetworking/cni/libcni"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/podwire/podwire/pkg/agent/cri"
	"github.com/podwire/podwire/pkg/agent/gc"
	"github.com/podwire/podwire/pkg/agent/install"
	"github.com/podwire/podwire/pkg/agent/kube"
	"github.com/podwire/podwire/pkg/agent/masq"
	"github.com/podwire/podwire/pkg/agent/metrics"
	"github.com/podwire/podwire/pkg/agent/routes"
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
	r     map[string]*reconciler // by name, set by Run

	mu            sync.Mutex
	list          *libcni.NetworkConfigList // the conflist written, nil before
	version       string                    // the resolved cniVersion
	caps          runtimes.Capabilities
	versionFailed bool
	confDone      bool            // the conflist reconciler has run
	conf          *kube.Condition // its failure (not ready), nil when written
	gcKicked      bool            // GC's first run is asked for
	ready         bool            // the condition last reported is Ready
	lastStatus    time.Time       // the status reconciler's last run (for /healthz)
	lastCond      kube.Condition
	condSent      written // the condition and annotation last patched (status.go)
	noteSent      written
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

// Run installs, then runs the reconcilers until ctx ends.
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
	// No informer resync (0): a resync re-delivers every cached Node to the handlers,
	// work that grows with the cluster; each reconciler resyncs its own state instead.
	f := informers.NewSharedInformerFactoryWithOptions(a.d.Kube, 0, opts...)
	inf := f.Core().V1().Nodes()
	if err := inf.Informer().SetTransform(kube.Slim(a.cfg.NodeName)); err != nil {
		return err
	}
	a.nodes = inf.Lister()

	period := a.cfg.StatusPeriod
	rs := []*reconciler{
		newReconciler(rConflist, period, a.syncConflist),
		newReconciler(rMasquerade, period, a.syncMasquerade),
		newReconciler(rStatus, period, a.syncStatus),
	}
	if a.cfg.Routes {
		rs = append(rs, newReconciler(rRoutes, period, a.syncRoutes))
	}
	if a.cfg.GCPeriod > 0 {
		// Kicked by the conflist reconciler once there is a conflist, then every period.
		rs = append(rs, newReconciler(rGC, a.cfg.GCPeriod, a.syncGC))
	}
	a.r = map[string]*reconciler{}
	for _, r := range rs {
		a.r[r.name] = r
	}
	if _, err := inf.Informer().AddEventHandler(a.nodeEvents()); err != nil {
		return err
	}
	f.Start(ctx.Done())
	defer f.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced) {
		return fmt.Errorf("the Node informer never synced: %w", ctx.Err())
	}
	wait := a.start(ctx, rs)
	// The first run of each, on the synced cache: the routes reconciler's removes the
	// routes of Nodes deleted while the agent was down.
	for _, r := range rs {
		if r.name != rGC {
			r.kick()
		}
	}
	<-ctx.Done()
	wait()
	return nil
}

// Healthy reports whether the status reconciler, which runs every StatusPeriod, ran
// recently (a stuck STATUS or a dead worker fails the probe).
func (a *Agent) Healthy() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.lastStatus.IsZero() || time.Since(a.lastStatus) < 3*a.cfg.StatusPeriod+time.Minute
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
