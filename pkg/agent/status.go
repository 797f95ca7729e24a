// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	corev1 "k8s.io/api/core/v1"

	"github.com/podwire/podwire/pkg/agent/gc"
	"github.com/podwire/podwire/pkg/agent/kube"
	"github.com/podwire/podwire/pkg/agent/usage"
)

// syncStatus is the status reconciler: the chain's STATUS (or the conflist
// reconciler's failure) becomes the PodwireNetworkReady condition, host-local's leases
// the free-addresses annotation and the address metrics. It compares with the own Node
// in the cache (kube.Slim keeps the agent's condition and annotation there) and patches
// only what changed: with nothing changing it sends no request at all.
func (a *Agent) syncStatus(ctx context.Context) error {
	a.mu.Lock()
	a.lastStatus = time.Now()
	done, conf := a.confDone, a.conf
	a.mu.Unlock()
	if !done {
		return nil // the conflist reconciler kicks this one after its first run
	}
	self, cidrs, err := a.self()
	if self == nil {
		return err
	}
	var cond kube.Condition
	switch list := a.current(); {
	case conf != nil:
		cond = *conf
	case list == nil:
		return nil
	default:
		cond = kube.Condition{Ready: true, Reason: "StatusOK", Message: "every plugin of the chain answered STATUS"}
		if err := gc.Status(ctx, a.d.CNI, list); err != nil {
			cond = kube.Condition{Reason: "StatusFailed", Message: err.Error()}
			var te *types.Error
			if errors.As(err, &te) {
				cond.Reason = fmt.Sprintf("StatusCode%d", te.Code)
			}
		}
	}
	errs := []error{a.report(ctx, self, cond)}
	if conf == nil {
		errs = append(errs, a.usage(ctx, self, cidrs))
	}
	return errors.Join(errs...)
}

// usage publishes the free addresses (annotation and metrics) and the attachments metric.
func (a *Agent) usage(ctx context.Context, self *corev1.Node, cidrs []netip.Prefix) error {
	dataDir := a.cfg.IPAMDataDir
	if dataDir == "" {
		dataDir = defaultDataDir
	}
	leases, err := gc.Leases(dataDir, a.cfg.NetworkName)
	if err != nil {
		return fmt.Errorf("reading host-local's leases in %s: %w", dataDir, err)
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
	if self.Annotations[kube.FreeAddressesAnnotation] == note || a.inFlight(&a.noteSent, note) {
		return nil
	}
	if err := kube.PatchAnnotation(ctx, a.d.Kube, a.cfg.NodeName, kube.FreeAddressesAnnotation, note); err != nil {
		return err
	}
	a.sent(&a.noteSent, note)
	return nil
}

// written is a value the agent patched and when.
type written struct {
	value any
	at    time.Time
}

// inFlight reports whether v was patched less than a period ago: the cache has not
// caught up with the agent's own write yet (a run kicked by the condition's update
// event can come before the annotation's), so patching it again would be a
// duplicate. If the write is lost, the next run after a period patches again.
func (a *Agent) inFlight(w *written, v any) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return reflect.DeepEqual(w.value, v) && time.Since(w.at) < a.cfg.StatusPeriod
}

func (a *Agent) sent(w *written, v any) {
	a.mu.Lock()
	defer a.mu.Unlock()
	*w = written{value: v, at: time.Now()}
}

// defaultDataDir is host-local's default dataDir.
const defaultDataDir = "/var/lib/cni/networks"

// report sets the Node condition when it differs from the cached Node's.
func (a *Agent) report(ctx context.Context, self *corev1.Node, cond kube.Condition) error {
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
	if !kube.NeedsPatch(self, cond) || a.inFlight(&a.condSent, cond) {
		return nil
	}
	if err := kube.PatchCondition(ctx, a.d.Kube, self, cond, time.Now()); err != nil {
		return err
	}
	a.sent(&a.condSent, cond)
	return nil
}
