// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"strings"
	"testing"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/podwire/podwire/integration/nstest"
)

// spoofLayout is `nft list table bridge nat` (the reference's macspoofchk table) with
// r's host veth and pod MAC replaced by placeholders, handles and counters dropped.
func (c *compat) spoofLayout(t *testing.T, r *current.Result) string {
	t.Helper()
	out := c.h.Run(c.h.HostNS, "sh", "-c", "nft list table bridge nat 2>/dev/null; true")
	out = nftCounterRe.ReplaceAllString(nftHandleRe.ReplaceAllString(out, ""), "")
	out = strings.ReplaceAll(out, r.Interfaces[1].Name, "<hostveth>")
	return strings.ReplaceAll(out, r.Interfaces[2].Mac, "<mac>")
}

// TestBridgeCompatMacSpoofChk: macspoofchk uses the reference's nftables layout (table
// bridge nat: base chain PREROUTING, per attachment the chains cni-br-iface-<id> and
// cni-br-iface-<id>-mac), so either binary's DEL removes the other's, and podwire's
// CHECK accepts the reference's.
func TestBridgeCompatMacSpoofChk(t *testing.T) {
	c := newCompat(t)
	h := c.h
	list := bridgeConf(h, `"isGateway":true,"macspoofchk":true`, `[[{"subnet":"10.37.0.0/24"}]]`)
	warmUp(t, h, list)
	before := h.Snapshot()

	// The reference's ADD; podwire's CHECK and DEL leave nothing of it.
	p := h.NewPod()
	rt := h.RT(p, "eth0", nstest.WithContainerID(h.Prefix+"-spoof"))
	r := c.add(t, c.ref, list, rt)
	refLayout := c.spoofLayout(t, r)
	if !strings.Contains(refLayout, "cni-br-iface-") {
		t.Fatalf("the reference's ADD wrote no macspoofchk chains:\n%s", refLayout)
	}
	c.check(t, list, rt)
	c.del(t, c.ours, list, rt)
	c.del(t, c.ours, list, rt)
	settleBridge(t, h, h.Name("br"))
	h.RequireUnchanged(before)

	// podwire's ADD of the same attachment writes exactly the reference's rules, and
	// its CHECK passes; the reference's DEL removes them.
	p = h.NewPod()
	rt = h.RT(p, "eth0", nstest.WithContainerID(h.Prefix+"-spoof"))
	r = c.add(t, c.ours, list, rt)
	if got := c.spoofLayout(t, r); got != refLayout {
		t.Errorf("podwire's macspoofchk rules differ from the reference's for the same attachment:\nreference:\n%s\npodwire:\n%s", refLayout, got)
	}
	c.check(t, list, rt)
	// The spoof check works: a changed MAC is dropped at the bridge port.
	p2 := h.NewPod()
	rt2 := h.RT(p2, "eth0")
	a2 := addrOf(t, c.add(t, c.ours, list, rt2), false)
	h.MustPing(p, a2)
	h.Run(p, "ip", "link", "set", "eth0", "address", "02:de:ad:be:ef:02")
	h.Run(p, "ip", "neigh", "flush", "dev", "eth0")
	if err := nstest.Ping(p, a2); err == nil {
		t.Errorf("a pod with a spoofed MAC still reaches %s", a2)
	}
	c.del(t, c.ours, list, rt2)
	c.del(t, c.ref, list, rt)
	settleBridge(t, h, h.Name("br"))
	// The reference never deletes its table and base chain: after deleting podwire's
	// pod it must leave exactly what it leaves after its own.
	afterRefDel := h.Snapshot()
	p = h.NewPod()
	rt = h.RT(p, "eth0")
	c.add(t, c.ref, list, rt)
	c.del(t, c.ref, list, rt)
	settleBridge(t, h, h.Name("br"))
	h.RequireUnchanged(afterRefDel)
	// podwire's DEL of its last pod takes the empty table away too.
	p = h.NewPod()
	rt = h.RT(p, "eth0")
	c.add(t, c.ours, list, rt)
	c.del(t, c.ours, list, rt)
	settleBridge(t, h, h.Name("br"))
	h.RequireUnchanged(before)
}
