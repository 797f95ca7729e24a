// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/google/go-cmp/cmp"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/link"
	"github.com/podwire/podwire/pkg/netfilter"
	"github.com/podwire/podwire/pkg/netfilter/fake"
	"github.com/podwire/podwire/pkg/tc"
)

// fakeNode is a node whose netfilter holds, for a live and a leaked attachment of
// network "net", podwire's masquerade (nftables), host ports (iptables) and
// macspoofchk, and the leaked one's rules in the reference portmap's cni_hostport;
// libcni's cache holds both.
func fakeNode(t *testing.T) (*node, *libcni.NetworkConfigList, *netState, []netfilter.Object) {
	t.Helper()
	ctx := context.Background()
	k := fake.New()
	for i, cid := range []string{"live", "leaked"} {
		o := cniplumb.Owner{Network: "net", ContainerID: cid, IfName: "eth0"}
		pod := netip.MustParsePrefix(fmt.Sprintf("10.1.0.%d/24", i+2))
		mac := net.HardwareAddr{2, 0, 0, 0, 0, byte(i + 2)}
		for _, err := range []error{
			netfilter.NewMasqOn(netfilter.KindNFTables, k, k).Apply(ctx, netfilter.MasqPlan{Owner: o, Addrs: []netip.Prefix{pod}}),
			netfilter.NewHostPortsOn(netfilter.KindIPTables, k, k).Apply(ctx, netfilter.HostPortPlan{Owner: o, SNAT: true, Mark: 0x2000,
				Ports: []netfilter.HostPort{{Proto: netfilter.TCP, HostPort: uint16(8080 + i), Pod: pod, ContainerPort: 80}}}),
			netfilter.NewMacSpoofOn(k).Apply(ctx, netfilter.MacSpoofPlan{Owner: o, HostIf: "veth" + cid, MAC: mac}),
		} {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	// The reference portmap's nftables layout: rules commented with the container ID.
	tb := k.AddTable(&nftables.Table{Name: "cni_hostport", Family: nftables.TableFamilyIPv4})
	ch := k.AddChain(&nftables.Chain{Name: "hostports", Table: tb})
	k.AddRule(&nftables.Rule{Table: tb, Chain: ch, Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}},
		UserData: userdata.AppendString(nil, userdata.TypeComment, "leaked")})
	if err := k.Flush(); err != nil {
		t.Fatal(err)
	}
	// The live pod's host veth is a port of the bridge; the leaked one's is gone.
	links := link.NewFake()
	links.AddBridge("br0", net.HardwareAddr{2, 0, 0, 0, 0, 1})
	veth, err := link.HostVethName(cniplumb.Owner{Network: "net", ContainerID: "live", IfName: "eth0"})
	if err != nil {
		t.Fatal(err)
	}
	links.AddPort("br0", veth, net.HardwareAddr{2, 0, 0, 0, 1, 2})
	nd := &node{h: &host{links: links, tc: tc.NewFake(), nf: netfilter.NewListerOn(k, k),
		hostPorts: func(k netfilter.Kind) (netfilter.Kind, error) {
			if k == netfilter.Auto {
				return netfilter.KindIPTables, nil
			}
			return k, nil
		}}}
	l, err := libcni.ConfListFromBytes([]byte(`{"cniVersion":"1.1.0","name":"net","plugins":[
		{"type":"bridge","bridge":"br0","macspoofchk":true,"ipMasq":true},{"type":"portmap","capabilities":{"portMappings":true}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := nd.h.nf.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s := &netState{Name: "net", Bridge: "br0"}
	for _, cid := range []string{"live", "leaked"} {
		s.Cached = append(s.Cached, &libcni.NetworkAttachment{Network: "net", ContainerID: cid, IfName: "eth0"})
	}
	s.addObjects(objs)
	return nd, l, s, objs
}

// TestInspectOnFakes: inspect gives each attachment its objects in every layout, the
// reference portmap's cni_hostport included (by container ID, the only name it has).
func TestInspectOnFakes(t *testing.T) {
	nd, _, s, _ := fakeNode(t)
	rows, orphans := s.inventory(context.Background(), nd.h)
	var b strings.Builder
	for _, a := range rows {
		fmt.Fprintf(&b, "%s/%s hostVeth=%q problems=%v\n", a.ContainerID, a.IfName, a.HostVeth, a.Problems)
		for _, r := range slicesConcat(a.HostPorts, a.Masquerade, a.MacSpoof) {
			fmt.Fprintf(&b, "  %s %s: %d rules\n", r.Backend, r.Key, len(r.Rules))
		}
	}
	for _, o := range orphans {
		fmt.Fprintf(&b, "orphan %s %s %s\n", o.Kind, o.Name, o.Detail)
	}
	if d := cmp.Diff(wantInspect, b.String()); d != "" {
		t.Errorf("inspect (-want +got):\n%s", d)
	}
}

// TestGCDryRunOnFakes: with "live" the only sandbox, the dry run lists every object
// of "leaked" and nothing of "live": libcni's DEL of the cached attachment (which
// removes the reference's cni_hostport rules), then each plugin's GC.
func TestGCDryRunOnFakes(t *testing.T) {
	nd, l, s, objs := fakeNode(t)
	p, err := nd.planGC(context.Background(), l, s, objs, withSandboxes(nil, s, map[string]bool{"live": true}))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, r := range p.Removals {
		fmt.Fprintf(&b, "%s %s %s %s %s\n", r.Network, r.Plugin, r.Kind, r.Name, r.Owner)
	}
	if d := cmp.Diff(wantDryRun, b.String()); d != "" {
		t.Errorf("dry run (-want +got):\n%s", d)
	}
}

const wantInspect = `leaked/eth0 hostVeth="" problems=[host veth veth7e0ad7b5c02 is gone]
  iptables ipv4 7e0ad7b5c0254d5b: 1 rules
  nftables ip cni_hostport leaked: 1 rules
  nftables a4861f4ae9f7d238-fd375d8ef4768730: 1 rules
  nftables leaked-eth0: 1 rules
live/eth0 hostVeth="vethfdb1326906f" problems=[]
  iptables ipv4 fdb1326906f149af: 1 rules
  nftables a4861f4ae9f7d238-5950868d46fc0745: 1 rules
  nftables live-eth0: 1 rules
`

const wantDryRun = `net libcni del leaked/eth0 net/leaked/eth0
net portmap hostports nftables ip cni_hostport leaked net/leaked/eth0
net bridge masquerade nftables a4861f4ae9f7d238-fd375d8ef4768730 net/leaked/eth0
net bridge macspoof nftables leaked-eth0 net/leaked/eth0
net portmap hostports iptables ipv4 7e0ad7b5c0254d5b net/leaked/eth0
`

func slicesConcat(a ...[]Rules) []Rules {
	var out []Rules
	for _, x := range a {
		out = append(out, x...)
	}
	return out
}
