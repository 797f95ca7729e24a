// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"

	"github.com/podwire/podwire/integration/nstest"
)

// TestKindnetStyleWithReferencePtp runs kindnet's conflist layout (the reference ptp,
// which podwire does not ship, with host-local and portmap at cniVersion 0.3.1) from a
// bin dir where host-local and portmap are podwire's, as on a kind node after podwire
// was installed beside the reference: ADD gives the pod an address podwire's host-local
// leased (its index is there) and a working route, portmap installs the host port, and
// DEL leaves the node as it was.
func TestKindnetStyleWithReferencePtp(t *testing.T) {
	refDir := referenceDir(t, "ptp")
	h := nstest.New(t)
	mixed := t.TempDir()
	for name, dir := range map[string]string{"ptp": refDir, "host-local": h.BinDir, "portmap": h.BinDir} {
		if err := os.Symlink(filepath.Join(dir, name), filepath.Join(mixed, name)); err != nil {
			t.Fatal(err)
		}
	}
	c := libcni.NewCNIConfigWithCacheDir([]string{mixed}, filepath.Join(t.TempDir(), "cache"), nil)
	list := h.Conflist(`{"cniVersion":"0.3.1","name":"@PREFIX@kind","plugins":[
	 {"type":"ptp","ipMasq":false,"mtu":1500,
	  "ipam":{"type":"host-local","dataDir":"@DATADIR@","routes":[{"dst":"0.0.0.0/0"}],
	   "ranges":[[{"subnet":"10.31.0.0/24"}]]}},
	 {"type":"portmap","capabilities":{"portMappings":true}}]}`)
	caps := nstest.WithCaps(map[string]any{"portMappings": []map[string]any{{"hostPort": 18282, "containerPort": 80, "protocol": "tcp"}}})

	// ptp sets the node's forwarding sysctls on its first ADD; compare from there.
	warm := h.RT(h.NewPod(), "eth0", caps)
	if _, err := h.AddWith(c, list, warm); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	if err := h.DelWith(c, list, warm); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	before := h.Snapshot()

	pod := h.NewPod()
	rt := h.RT(pod, "eth0", caps)
	res, err := h.AddWith(c, list, rt)
	if err != nil {
		t.Fatalf("ADD through reference ptp + podwire host-local and portmap: %v", err)
	}
	if len(res.IPs) != 1 || res.IPs[0].Gateway == nil {
		t.Fatalf("result %+v, want one address with a gateway", res)
	}
	t.Logf("ADD: %s via %s", res.IPs[0].Address.String(), res.IPs[0].Gateway)
	h.MustPing(pod, res.IPs[0].Gateway.String())
	if _, err := os.Stat(filepath.Join(h.DataDir, list.Name, ".podwire")); err != nil {
		t.Errorf("no podwire index in the lease dir (%v): the lease was not podwire's host-local's", err)
	}
	if _, err := os.Stat(filepath.Join(h.DataDir, list.Name, res.IPs[0].Address.IP.String())); err != nil {
		t.Errorf("lease file of %s: %v", res.IPs[0].Address.IP, err)
	}
	ipt, _ := nstest.RunIn(h.HostNS, "iptables-save", "-t", "nat")
	nft, _ := nstest.RunIn(h.HostNS, "nft", "list", "ruleset")
	if !strings.Contains(ipt+nft, "18282") {
		t.Errorf("no rule for hostPort 18282 in the node's iptables nat table or nftables ruleset:\n%s\n%s", ipt, nft)
	}
	if err := h.DelWith(c, list, rt); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	h.RequireUnchanged(before)
}
