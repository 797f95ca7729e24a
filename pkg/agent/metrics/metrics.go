// SPDX-License-Identifier: Apache-2.0

// Package metrics holds the agent's Prometheus metrics, all prefixed podwire_agent_, on
// a registry of their own (plus the Go and process collectors).
package metrics

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics is the agent's set.
type Metrics struct {
	Registry       *prometheus.Registry
	AddressesFree  *prometheus.GaugeVec   // {range}
	AddressesUsed  *prometheus.GaugeVec   // {range}
	Attachments    prometheus.Gauge       // cached attachments of the network
	GCRuns         *prometheus.CounterVec // {result}
	GCReclaimed    *prometheus.CounterVec // {kind}
	InstallEvents  *prometheus.CounterVec // {result}
	RouteSync      *prometheus.CounterVec // {result}
	Routes         prometheus.Gauge       // agent routes installed
	MasqueradeSync *prometheus.CounterVec // {result}
	NetworkReady   prometheus.Gauge       // 1 when the last STATUS succeeded
	// ReconcileErrors counts failed runs per reconciler (conflist, masquerade, routes,
	// status, gc); each is retried with its own backoff.
	ReconcileErrors *prometheus.CounterVec // {reconciler}
}

// New registers every metric on a fresh registry.
func New() *Metrics {
	m := &Metrics{Registry: prometheus.NewRegistry()}
	const ns = "podwire_agent"
	m.AddressesFree = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "addresses_free",
		Help: "Addresses host-local can still hand out, per pod CIDR range."}, []string{"range"})
	m.AddressesUsed = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "addresses_used",
		Help: "Addresses leased by host-local, per pod CIDR range."}, []string{"range"})
	m.Attachments = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "attachments",
		Help: "Attachments of the network in libcni's result cache."})
	m.GCRuns = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "gc_runs_total",
		Help: "GC runs by result (success, error, skipped)."}, []string{"result"})
	m.GCReclaimed = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "gc_reclaimed_total",
		Help: "Objects GC reclaimed, by kind (lease, attachment, veth, ifb, rule: one attachment's netfilter rules in one layout, runtime-attachment: a libcni cache entry in one of the runtime's other networks, such as containerd's cni-loopback)."}, []string{"kind"})
	m.InstallEvents = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "install_events_total",
		Help: "Files the installer handled, by result (installed, unchanged, foreign, replaced, swept: a temporary file a killed install left, error)."}, []string{"result"})
	m.RouteSync = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "route_sync_total",
		Help: "Route syncs by result (success, error)."}, []string{"result"})
	m.Routes = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "routes",
		Help: "host-gw routes the agent keeps."})
	m.MasqueradeSync = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "masquerade_sync_total",
		Help: "Masquerade rule syncs by result (success, error)."}, []string{"result"})
	m.NetworkReady = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "network_ready",
		Help: "1 when the chain's last STATUS succeeded, else 0."})
	m.ReconcileErrors = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "reconcile_errors_total",
		Help: "Failed reconciler runs, by reconciler (conflist, masquerade, routes, status, gc); each is retried with backoff while the others go on."}, []string{"reconciler"})
	m.Registry.MustRegister(m.AddressesFree, m.AddressesUsed, m.Attachments, m.GCRuns, m.GCReclaimed,
		m.InstallEvents, m.RouteSync, m.Routes, m.MasqueradeSync, m.NetworkReady, m.ReconcileErrors,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Counters with known labels start at 0, so a scrape shows them before the first event.
	for _, r := range []string{"success", "error", "skipped"} {
		m.GCRuns.WithLabelValues(r)
	}
	for _, r := range []string{"success", "error"} {
		m.RouteSync.WithLabelValues(r)
		m.MasqueradeSync.WithLabelValues(r)
	}
	for _, r := range []string{"conflist", "masquerade", "routes", "status", "gc"} {
		m.ReconcileErrors.WithLabelValues(r)
	}
	for _, k := range []string{"lease", "attachment", "veth", "ifb", "rule", "runtime-attachment"} {
		m.GCReclaimed.WithLabelValues(k)
	}
	return m
}

// Handler serves the registry.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry})
}
