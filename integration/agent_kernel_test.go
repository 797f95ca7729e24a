// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"

	"github.com/podwire/podwire/integration/nstest"
	agentconf "github.com/podwire/podwire/pkg/agent/conflist"
	"github.com/podwire/podwire/pkg/agent/gc"
	"github.com/podwire/podwire/pkg/agent/masq"
	"github.com/podwire/podwire/pkg/agent/routes"
	"github.com/podwire/podwire/pkg/netfilter"
)

// TestAgentKernel runs the agent's kernel backends in a private node netns: host-gw
// routes through netlink (only its own protocol's routes are touched), the masquerade
// table through pkg/netfilter, and the GC driver against the real plugins: a pod whose
// sandbox vanished without DEL loses its lease and veth, a live pod keeps them.
func TestAgentKernel(t *testing.T) {
	h := nstest.New(t)
	link := h.Name("up")
	h.Run(h.HostNS, "ip", "link", "add", link, "type", "veth", "peer", "name", h.Name("pe"))
	h.Run(h.HostNS, "ip", "link", "set", h.Name("pe"), "up")
	h.Run(h.HostNS, "ip", "addr", "add", "192.168.77.1/24", "dev", link)
	h.Run(h.HostNS, "ip", "link", "set", link, "up")
	h.Run(h.HostNS, "ip", "route", "add", "10.99.0.0/16", "via", "192.168.77.254", "proto", "static")

	nodes := []routes.Node{
		{Name: "self", InternalIPs: []netip.Addr{netip.MustParseAddr("192.168.77.1")}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.250.0.0/24")}},
		{Name: "b", InternalIPs: []netip.Addr{netip.MustParseAddr("192.168.77.2")}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.250.1.0/24")}},
		{Name: "far", InternalIPs: []netip.Addr{netip.MustParseAddr("172.31.0.2")}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.250.2.0/24")}},
	}
	err := h.InHost(func() error {
		b := routes.Netlink{}
		conn, err := b.Connected()
		if err != nil {
			return err
		}
		want, _ := routes.Plan("self", conn, nodes)
		if len(want) != 1 {
			t.Errorf("plan %v", want)
		}
		if _, err := routes.Sync(b, want); err != nil {
			return err
		}
		if ch, err := routes.Sync(b, want); err != nil || len(ch.Added)+len(ch.Removed) != 0 {
			t.Errorf("second sync changed %+v (%v)", ch, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	out := h.Run(h.HostNS, "ip", "route", "show", "proto", "165")
	if strings.TrimSpace(out) != "10.250.1.0/24 via 192.168.77.2 dev "+link {
		t.Errorf("agent routes:\n%s", out)
	}

	// Masquerade in podwire's own table.
	var plan netfilter.Plan
	err = h.InHost(func() error {
		nft := netfilter.NewNFTables()
		defer nft.Close()
		plan, _ = masq.Plan(nodes[0].PodCIDRs, []netip.Prefix{netip.MustParsePrefix("10.250.0.0/16")})
		return masq.Sync(context.Background(), nft, plan)
	})
	if err != nil {
		t.Fatal(err)
	}
	if out := h.Run(h.HostNS, "nft", "list", "table", "inet", "podwire_agent"); !strings.Contains(out, "masquerade") || !strings.Contains(out, "10.250.0.0/16") {
		t.Errorf("table inet podwire_agent:\n%s", out)
	}

	// GC driver against the real plugins (the conflist the agent writes, at 1.0.0 as for
	// containerd 1.6; the driver runs GC at 1.1.0).
	b, err := agentconf.Render(agentconf.Params{Network: h.Name("net"), CNIVersion: "1.0.0", Bridge: h.Name("br"),
		PodCIDRs: nodes[0].PodCIDRs, DataDir: h.DataDir})
	if err != nil {
		t.Fatal(err)
	}
	list, err := libcni.ConfListFromBytes(b)
	if err != nil {
		t.Fatal(err)
	}
	live, dead := h.NewPod(), h.NewPod()
	h.MustAdd(list, h.RT(live, "eth0", nstest.WithContainerID("live")))
	h.MustAdd(list, h.RT(dead, "eth0", nstest.WithContainerID("dead")))
	// The sandbox vanished from the runtime without DEL; its netns mount is left over.
	var res gc.Result
	err = h.InHost(func() error {
		d := &gc.Driver{CNI: h.CNI,
			Counter:   gc.HostCounter{DataDir: h.DataDir, CNI: h.CNI, Links: gc.BridgeLinks(h.Name("br"))},
			Sandboxes: func(context.Context) ([]string, error) { return []string{"live"}, nil }}
		var err error
		res, err = d.Run(context.Background(), list)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Stale != 1 || res.Reclaimed["lease"] != 1 || res.Reclaimed["veth"] != 1 || res.Reclaimed["attachment"] != 1 {
		t.Errorf("GC result %+v", res)
	}
	leases, _ := gc.Leases(h.DataDir, list.Name)
	if len(leases) != 1 {
		t.Errorf("leases after GC: %v", leases)
	}
	if out := h.Run(h.HostNS, "ip", "-o", "link", "show", "type", "veth", "master", h.Name("br")); strings.Count(out, "\n") != 1 {
		t.Errorf("bridge ports after GC (one live pod expected):\n%s", out)
	}

	// Uninstall of routes and masquerade leaves the foreign route and no table.
	err = h.InHost(func() error {
		nft := netfilter.NewNFTables()
		defer nft.Close()
		if err := masq.Remove(context.Background(), nft); err != nil {
			return err
		}
		_, err := routes.RemoveAll(routes.Netlink{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if out := h.Run(h.HostNS, "ip", "route", "show", "proto", "165"); strings.TrimSpace(out) != "" {
		t.Errorf("agent routes after removal:\n%s", out)
	}
	if out := h.Run(h.HostNS, "ip", "route", "show", "10.99.0.0/16"); !strings.Contains(out, "192.168.77.254") {
		t.Errorf("the foreign route went: %q", out)
	}
	if out, _ := nstest.RunIn(h.HostNS, "nft", "list", "tables"); strings.Contains(out, "podwire_agent") {
		t.Errorf("tables after removal:\n%s", out)
	}
	h.MustDel(list, h.RT(live, "eth0", nstest.WithContainerID("live")))
}
