// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/podwire/podwire/pkg/agent/gc"
)

// syncGC is the GC reconciler: one GC run of the written conflist (the conflist
// reconciler kicks the first, then it runs every GCPeriod; a failed run is retried
// with backoff). Without a conflist or a runtime it is skipped.
func (a *Agent) syncGC(ctx context.Context) error {
	list := a.current()
	if list == nil || a.d.Runtime == nil {
		a.d.Metrics.GCRuns.WithLabelValues("skipped").Inc()
		return nil
	}
	dataDir := a.cfg.IPAMDataDir
	if dataDir == "" {
		dataDir = defaultDataDir
	}
	d := &gc.Driver{CNI: a.d.CNI,
		Counter: gc.HostCounter{DataDir: dataDir, CNI: a.d.CNI, Links: a.d.Links, Rules: a.d.Rules},
		// Young: an attachment whose lease or libcni cache entry is younger than the grace
		// (a lease is written within the ADD, the cache entry at its end).
		Young: func(ctx context.Context, network string) ([]types.GCAttachment, error) {
			now := time.Now()
			young, err := gc.Young(ctx, dataDir, network, a.cfg.GCGrace, now)
			if err != nil {
				return nil, err
			}
			cached, err := a.d.CNI.GetCachedAttachments("")
			if err != nil {
				return nil, err
			}
			yc, err := gc.YoungCached(a.cacheDir(), network, cached, a.cfg.GCGrace, now)
			return append(young, yc...), err
		},
		Networks: a.runtimeNetworks,
		Sandboxes: func(ctx context.Context) ([]string, error) {
			sbs, err := a.d.Runtime.Sandboxes(ctx)
			ids := make([]string, 0, len(sbs))
			for _, s := range sbs {
				ids = append(ids, s.ID)
			}
			return ids, err
		}}
	res, err := d.Run(ctx, list)
	a.logRuntimeGC(res.Runtime)
	for kind, n := range res.Reclaimed {
		if n > 0 {
			a.d.Metrics.GCReclaimed.WithLabelValues(kind).Add(float64(n))
		}
	}
	if err != nil {
		a.d.Metrics.GCRuns.WithLabelValues("error").Inc()
		return fmt.Errorf("GC (valid %d, stale %d, reclaimed %v): %w", res.Valid, res.Stale, res.Reclaimed, err)
	}
	a.d.Metrics.GCRuns.WithLabelValues("success").Inc()
	a.d.Log.Info("GC", "valid", res.Valid, "stale", res.Stale, "reclaimed", res.Reclaimed)
	return nil
}

// logRuntimeGC logs GC of the runtime's other networks: at info when it found
// something, at debug otherwise (every period).
func (a *Agent) logRuntimeGC(rs []gc.NetworkResult) {
	for _, r := range rs {
		lvl := slog.LevelDebug
		if r.Stale > 0 || r.Reclaimed > 0 {
			lvl = slog.LevelInfo
		}
		a.d.Log.Log(context.Background(), lvl, "GC of the runtime's network", "network", r.Network,
			"valid", r.Valid, "stale", r.Stale, "reclaimed", r.Reclaimed)
	}
}

// runtimeNetworks are the networks the runtime attaches pods to besides the agent's
// (containerd's cni-loopback; the conf dir's first conflist is normally the agent's
// own), as the runtime loaded them. A runtime that does not report them (CRI-O) has
// none: the agent GCs only networks it knows the runtime's sandboxes are attached to,
// never every conflist it finds (another runtime's, such as podman's, may be there,
// with containers the CRI does not list).
func (a *Agent) runtimeNetworks(ctx context.Context) ([]*libcni.NetworkConfigList, error) {
	ns, err := a.d.Runtime.Networks(ctx)
	if err != nil {
		return nil, err
	}
	var out []*libcni.NetworkConfigList
	var errs []error
	for _, n := range ns {
		l, err := libcni.ConfListFromBytes(n.Conflist)
		if err != nil {
			errs = append(errs, fmt.Errorf("the runtime's network %s: %w", n.Name, err))
			continue
		}
		out = append(out, l)
	}
	return out, errors.Join(errs...)
}

// cacheDir is libcni's cache dir, as libcni defaults it.
func (a *Agent) cacheDir() string {
	if a.cfg.CNICacheDir == "" {
		return libcni.CacheDir
	}
	return a.cfg.CNICacheDir
}
