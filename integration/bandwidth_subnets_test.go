// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"errors"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/podwire/podwire/integration/nstest"
)

// TestBandwidthUnshapedSubnetsConsistent: a plugin-level unshapedSubnets (or
// shapedSubnets) is refused with code 7 for a pod with bandwidth annotations exactly as
// for one without (it used to be ignored for the former), DEL of such a pod succeeds,
// and the node is left as it was.
func TestBandwidthUnshapedSubnetsConsistent(t *testing.T) {
	h := nstest.New(t)
	plain := bandwidthConf(h)
	warm := h.NewPod()
	h.MustAdd(plain, h.RT(warm, "eth0"))
	h.MustDel(plain, h.RT(warm, "eth0"))
	settleBridge(t, h, h.Name("br"))
	before := h.Snapshot()
	for _, key := range []string{"unshapedSubnets", "shapedSubnets"} {
		list := h.Conflist(`{"cniVersion":"1.1.0","name":"@PREFIX@net","plugins":[
		 {"type":"bridge","bridge":"@PREFIX@br","isGateway":true,
		  "ipam":{"type":"host-local","ranges":[[{"subnet":"10.23.0.0/24"}]],"dataDir":"@DATADIR@"}},
		 {"type":"bandwidth","capabilities":{"bandwidth":true},"egressRate":1000000,"egressBurst":100000,"` + key + `":["10.0.0.0/8"]}]}`)
		for _, annotated := range []bool{true, false} {
			name := map[bool]string{true: "annotated pod", false: "pod without annotations"}[annotated]
			t.Run(key+"/"+name, func(t *testing.T) {
				pod := h.NewPod()
				rt := h.RT(pod, "eth0")
				if annotated {
					rt = h.RT(pod, "eth0", withBandwidth(10_000_000, 10_000_000, containerdBurst))
				}
				_, err := h.Add(list, rt)
				var e *types.Error
				if !errors.As(err, &e) || e.Code != 7 || e.Msg != "invalid "+key {
					t.Fatalf("ADD: %v, want code 7 naming %s", err, key)
				}
				t.Logf("ADD refused: %v", err)
				h.MustDel(list, rt) // as the runtime does after a failed ADD
			})
		}
	}
	settleBridge(t, h, h.Name("br"))
	h.RequireUnchanged(before)
}
