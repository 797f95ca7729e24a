// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/podwire/podwire/pkg/agent/kube"
)

// The agent's reconcilers. Each has a workqueue of its own holding one key (its name):
// the whole state it owns is recomputed from the Node cache and the host on every run,
// so a burst of events collapses into one run, and a reconciler that fails is retried
// with a backoff of its own while the others go on (the shape of kindnet's and
// flannel's controllers).
const (
	rConflist   = "conflist"   // install/conflist: the network's config for the own pod CIDRs
	rMasquerade = "masquerade" // the nftables masquerade for the own pod CIDRs
	rRoutes     = "routes"     // host-gw routes to every other Node's pod CIDRs
	rStatus     = "status"     // STATUS, the Node condition, the free-addresses annotation
	rGC         = "gc"         // CNI GC of the agent's and the runtime's networks
)

// Reconcilers lists every reconciler's name (the reconciler label of the metrics).
var Reconcilers = []string{rConflist, rMasquerade, rRoutes, rStatus, rGC}

// Retry backoff per reconciler: a failure is retried after retryBase, doubling up to
// retryMax; a reconciler with a period also runs once a period, whichever comes first.
const (
	retryBase = 500 * time.Millisecond
	retryMax  = 5 * time.Minute
)

// reconciler is one control loop.
type reconciler struct {
	name   string
	q      workqueue.TypedRateLimitingInterface[string]
	sync   func(ctx context.Context) error
	period time.Duration // a resync after every run; 0: only when kicked
}

func newReconciler(name string, period time.Duration, sync func(context.Context) error) *reconciler {
	rl := workqueue.NewTypedItemExponentialFailureRateLimiter[string](retryBase, retryMax)
	return &reconciler{name: name, sync: sync, period: period,
		q: workqueue.NewTypedRateLimitingQueueWithConfig(rl, workqueue.TypedRateLimitingQueueConfig[string]{Name: "podwire-agent-" + name})}
}

// kick asks for a run (many kicks before it starts are one run).
func (r *reconciler) kick() { r.q.Add(r.name) }

// run is the reconciler's worker, until the queue shuts down.
func (a *Agent) run(ctx context.Context, r *reconciler) {
	for {
		key, quit := r.q.Get()
		if quit {
			return
		}
		err := r.sync(ctx)
		switch {
		case ctx.Err() != nil:
		case err != nil:
			a.d.Metrics.ReconcileErrors.WithLabelValues(r.name).Inc()
			a.d.Log.Error("reconcile failed; retrying", "reconciler", r.name, "err", err, "retry", r.q.NumRequeues(key)+1)
			r.q.AddRateLimited(key)
		default:
			r.q.Forget(key)
		}
		if r.period > 0 && ctx.Err() == nil {
			r.q.AddAfter(key, r.period)
		}
		r.q.Done(key)
	}
}

// start runs every reconciler until ctx ends; wait returns once they have all stopped.
func (a *Agent) start(ctx context.Context, rs []*reconciler) (wait func()) {
	var wg sync.WaitGroup
	for _, r := range rs {
		wg.Add(1)
		go func() { defer wg.Done(); a.run(ctx, r) }()
	}
	go func() {
		<-ctx.Done()
		for _, r := range rs {
			r.q.ShutDown()
		}
	}()
	return wg.Wait
}

// nodeEvents maps Node events to reconcilers: a change of any Node's pod CIDRs,
// InternalIPs or deletion state kicks the routes; of the own Node's also the conflist,
// the masquerade and the status; a change of only the agent's own condition or
// annotation kicks the status (to put back what someone else changed). Every other
// update (heartbeats, labels, images) kicks nothing.
func (a *Agent) nodeEvents() cache.ResourceEventHandler {
	routing := func(name string) {
		if a.r[rRoutes] != nil {
			a.r[rRoutes].kick()
		}
		if name == a.cfg.NodeName {
			a.r[rConflist].kick()
			a.r[rMasquerade].kick()
			a.r[rStatus].kick()
		}
	}
	name := func(o any) string {
		if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
			o = t.Obj
		}
		if n, ok := o.(*corev1.Node); ok {
			return n.Name
		}
		return ""
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) { routing(name(o)) },
		UpdateFunc: func(o, n any) {
			old, ok1 := o.(*corev1.Node)
			cur, ok2 := n.(*corev1.Node)
			switch {
			case !ok1 || !ok2 || kube.RoutingChanged(old, cur):
				routing(name(n))
			case cur.Name == a.cfg.NodeName && kube.ReportChanged(old, cur):
				a.r[rStatus].kick()
			}
		},
		DeleteFunc: func(o any) { routing(name(o)) },
	}
}
