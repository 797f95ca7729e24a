// SPDX-License-Identifier: Apache-2.0

package main

import (
	"testing"
	"time"
)

func TestFlagsEnvAndDefaults(t *testing.T) {
	t.Setenv("NODE_NAME", "n1")
	t.Setenv("PODWIRE_GC_PERIOD", "1m")
	t.Setenv("PODWIRE_CLUSTER_CIDR", "10.244.0.0/16, fd00:244::/56")
	t.Setenv("PODWIRE_ROUTES", "false")
	t.Setenv("PODWIRE_CNI_BIN_DIR", "/from/env")
	o, err := parseFlags([]string{"--cni-bin-dir=/from/flag"})
	if err != nil {
		t.Fatal(err)
	}
	if o.NodeName != "n1" || o.GCPeriod != time.Minute || o.Routes || len(o.ClusterCIDRs) != 2 || o.CNIBinDir != "/from/flag" {
		t.Errorf("%+v", o.Config)
	}
	if o.ConflistName != "10-podwire.conflist" || o.CNIVersion != "auto" || o.healthAddr != ":9309" || o.metricsAddr != ":9310" ||
		o.StateDir != "/var/lib/podwire-agent" || o.SourceBinDir != "/podwire/bin" || !o.Masquerade {
		t.Errorf("defaults: %+v", o)
	}
	for _, bad := range [][]string{{"--cni-version=0.4.0"}, {"--cluster-cidr=nope"}} {
		if _, err := parseFlags(bad); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
	t.Setenv("NODE_NAME", "")
	if _, err := parseFlags(nil); err == nil {
		t.Error("no node name accepted")
	}
	if _, err := parseFlags([]string{"--uninstall"}); err != nil {
		t.Errorf("--uninstall needs no node name: %v", err)
	}
}
