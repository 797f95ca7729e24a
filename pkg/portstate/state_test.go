// SPDX-License-Identifier: Apache-2.0

package portstate

import (
	"slices"
	"testing"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/netfilter"
)

func TestPlanGCAndKinds(t *testing.T) {
	live := cniplumb.Owner{Network: "n", ContainerID: "live", IfName: "eth0"}
	dead := cniplumb.Owner{Network: "n", ContainerID: "dead", IfName: "eth0"}
	ms := []Stored{
		{Marker: Marker{Owner: live.Key(), Backend: netfilter.KindNFTables}, ID: netfilter.IDOf(live)},
		{Marker: Marker{Owner: dead.Key(), Backend: netfilter.KindIPTables}, ID: netfilter.IDOf(dead)},
		{Marker: Marker{Backend: netfilter.Auto}, ID: "torn"},
	}
	got := PlanGC(ms, "n", cniplumb.Owners{live: true, {Network: "other", ContainerID: "dead", IfName: "eth0"}: true})
	if len(got) != 2 || got[0].ID != netfilter.IDOf(dead) || got[1].ID != "torn" {
		t.Errorf("PlanGC = %+v, want dead and the torn marker", got)
	}
	if k := GCKinds(netfilter.KindNFTables, ms); !slices.Equal(k, []netfilter.Kind{netfilter.KindNFTables, netfilter.KindIPTables}) {
		t.Errorf("GCKinds = %v", k)
	}
	if k := GCKinds("", ms[2:]); len(k) != 0 {
		t.Errorf("GCKinds of an unopenable backend and a torn marker = %v", k)
	}
	if o, ok := OwnerOfKey(dead.Key()); !ok || o != dead {
		t.Errorf("OwnerOfKey(%q) = %v %v", dead.Key(), o, ok)
	}
}
