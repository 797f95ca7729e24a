// SPDX-License-Identifier: Apache-2.0

package metrics

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestScrape(t *testing.T) {
	m := New()
	m.AddressesFree.WithLabelValues("10.244.1.0/24").Set(251)
	m.GCReclaimed.WithLabelValues("lease").Add(2)
	m.InstallEvents.WithLabelValues("installed").Inc()
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`podwire_agent_addresses_free{range="10.244.1.0/24"} 251`,
		`podwire_agent_gc_reclaimed_total{kind="lease"} 2`,
		`podwire_agent_gc_reclaimed_total{kind="veth"} 0`,
		`podwire_agent_gc_runs_total{result="success"} 0`,
		`podwire_agent_install_events_total{result="installed"} 1`,
		`podwire_agent_route_sync_total{result="error"} 0`,
		`podwire_agent_attachments 0`,
		`podwire_agent_reconcile_errors_total{reconciler="conflist"} 0`,
		`podwire_agent_reconcile_errors_total{reconciler="gc"} 0`,
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("scrape lacks %q", want)
		}
	}
}
