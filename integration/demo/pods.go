// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"

	"github.com/podwire/podwire/integration/nodestate"
)

// containerdBurst is what containerd and CRI-O pass as burst for annotated pods.
const containerdBurst = 4294967295

// podBRate is pod B's bandwidth each way, in bit/s.
const podBRate = 10_000_000

func (d *demo) addPods(ctx context.Context) error {
	d.a.rt = &libcni.RuntimeConf{ContainerID: d.runID + "-pod-a", NetNS: d.a.ns.Path(), IfName: "eth0",
		CapabilityArgs: map[string]any{"portMappings": []map[string]any{{"hostPort": hostPort, "containerPort": 80, "protocol": "tcp"}}}}
	d.b.rt = &libcni.RuntimeConf{ContainerID: d.runID + "-pod-b", NetNS: d.b.ns.Path(), IfName: "eth0",
		CapabilityArgs: map[string]any{"bandwidth": map[string]any{
			"ingressRate": podBRate, "ingressBurst": containerdBurst, "egressRate": podBRate, "egressBurst": containerdBurst}}}
	for _, p := range []*pod{d.a, d.b} {
		lo := &libcni.RuntimeConf{ContainerID: p.rt.ContainerID, NetNS: p.rt.NetNS, IfName: "lo"}
		t0 := time.Now()
		err := d.inNode(func() error {
			if _, err := d.cni.AddNetworkList(ctx, d.lo, lo); err != nil {
				return fmt.Errorf("loopback: %w", err)
			}
			d.added = append(d.added, p)
			r, err := d.cni.AddNetworkList(ctx, d.net, p.rt)
			if err != nil {
				return err
			}
			p.res, err = current.NewResultFromResult(r)
			return err
		})
		if err != nil {
			return fmt.Errorf("ADD %s: %w", p.name, err)
		}
		for _, ip := range p.res.IPs {
			if ip.Address.IP.To4() != nil && p.ip == nil {
				p.ip = ip.Address.IP
			}
		}
		if p.ip == nil {
			return fmt.Errorf("ADD %s returned no IPv4 address: %v", p.name, p.res)
		}
		var ifs []string
		for _, i := range p.res.Interfaces {
			where := "node"
			if i.Sandbox != "" {
				where = "pod"
			}
			ifs = append(ifs, fmt.Sprintf("%s(%s)", i.Name, where))
		}
		say("%s: %s via %s; interfaces %s; ADD took %s", p.name, p.res.IPs[0].Address.String(),
			p.res.IPs[0].Gateway, strings.Join(ifs, " "), time.Since(t0).Round(time.Millisecond))
	}
	return nil
}

func (d *demo) ping(context.Context) error {
	for _, pr := range [][2]*pod{{d.a, d.b}, {d.b, d.a}} {
		rtts, err := pingFrom(pr[0].ns, pr[1].ip, 3)
		if err != nil {
			return fmt.Errorf("%s -> %s: %w", pr[0].name, pr[1].name, err)
		}
		var s []string
		for _, r := range rtts {
			s = append(s, fmt.Sprintf("%.2f ms", float64(r)/1e6))
		}
		say("%s -> %s (%s): %s", pr[0].name, pr[1].name, pr[1].ip, strings.Join(s, ", "))
	}
	return nil
}

// pingFrom sends n ICMP echo requests from netns n to dst and returns the RTTs.
func pingFrom(n ns.NetNS, dst net.IP, count int) ([]time.Duration, error) {
	var c *icmp.PacketConn
	err := n.Do(func(ns.NetNS) error {
		var err error
		c, err = icmp.ListenPacket("ip4:icmp", "0.0.0.0")
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("opening ICMP socket: %w", err)
	}
	defer c.Close()
	var rtts []time.Duration
	for seq := 1; seq <= count; seq++ {
		msg := icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: os.Getpid() & 0xffff, Seq: seq, Data: []byte("podwire")}}
		b, _ := msg.Marshal(nil)
		t0 := time.Now()
		if _, err := c.WriteTo(b, &net.IPAddr{IP: dst}); err != nil {
			return nil, err
		}
		buf := make([]byte, 1500)
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		for {
			nr, peer, err := c.ReadFrom(buf)
			if err != nil {
				return nil, fmt.Errorf("no echo reply from %s: %w", dst, err)
			}
			m, err := icmp.ParseMessage(1, buf[:nr])
			if err != nil || m.Type != ipv4.ICMPTypeEchoReply || peer.String() != dst.String() {
				continue
			}
			if e, ok := m.Body.(*icmp.Echo); ok && e.Seq == seq {
				break
			}
		}
		rtts = append(rtts, time.Since(t0))
		time.Sleep(100 * time.Millisecond)
	}
	return rtts, nil
}

// dialIn returns a dialer that creates its sockets in netns n.
func dialIn(n ns.NetNS) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (conn net.Conn, err error) {
		err = n.Do(func(ns.NetNS) error {
			var d net.Dialer
			conn, err = d.DialContext(ctx, network, addr)
			return err
		})
		return conn, err
	}
}

func (d *demo) http(ctx context.Context) error {
	var l net.Listener
	err := d.a.ns.Do(func(ns.NetNS) error {
		var err error
		l, err = net.Listen("tcp", ":80")
		return err
	})
	if err != nil {
		return fmt.Errorf("listening on :80 in pod A: %w", err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from pod-a (%s), you are %s", d.a.ip, r.RemoteAddr)
	})}
	go srv.Serve(l)
	defer srv.Close()
	say("pod-a serves HTTP on %s:80; hostPort %d maps to it", d.a.ip, hostPort)
	for _, c := range []struct {
		from string
		n    ns.NetNS
		url  string
	}{
		{"node, via its uplink address", d.node, fmt.Sprintf("http://%s:%d/", nodeUplinkIP, hostPort)},
		{"node, via 127.0.0.1", d.node, fmt.Sprintf("http://127.0.0.1:%d/", hostPort)},
		{"outside client", d.client, fmt.Sprintf("http://%s:%d/", nodeUplinkIP, hostPort)},
	} {
		cl := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: dialIn(c.n), DisableKeepAlives: true}}
		t0 := time.Now()
		resp, err := cl.Get(c.url)
		if err != nil {
			return fmt.Errorf("GET %s from %s: %w", c.url, c.from, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.HasPrefix(string(body), "hello from pod-a") {
			return fmt.Errorf("GET %s from %s: %s %q", c.url, c.from, resp.Status, body)
		}
		say("GET %-26s from %-29s -> %q (%s)", c.url, c.from, body, time.Since(t0).Round(100*time.Microsecond))
	}
	return nil
}

func (d *demo) throughput(ctx context.Context) error {
	veth, ifb, err := d.shapers()
	if err != nil {
		return err
	}
	say("pod-b's TBFs: on IFB %q (traffic from the pod) and on host veth %q (traffic to it)", ifb, veth)
	if err := d.shapeDirection(ctx, "egress  (pod-b -> outside client)", d.b.ns, d.client, clientUplinkIP, ifb, podBRate); err != nil {
		return fmt.Errorf("pod-b -> outside client: %w", err)
	}
	if err := d.shapeDirection(ctx, "ingress (node -> pod-b)          ", d.node, d.b.ns, d.b.ip.String(), veth, podBRate); err != nil {
		return fmt.Errorf("node -> pod-b: %w", err)
	}
	say("shaped both ways: each TBF sent within 10 Mbit/s ±%.0f%% over the %s window, by its own counters", tolerance*100, window)
	return nil
}

func (d *demo) delPods(ctx context.Context) error {
	for _, p := range []*pod{d.a, d.b} {
		lo := &libcni.RuntimeConf{ContainerID: p.rt.ContainerID, NetNS: p.rt.NetNS, IfName: "lo"}
		t0 := time.Now()
		err := d.inNode(func() error {
			if err := d.cni.DelNetworkList(ctx, d.net, p.rt); err != nil {
				return err
			}
			return d.cni.DelNetworkList(ctx, d.lo, lo)
		})
		if err != nil {
			return fmt.Errorf("DEL %s: %w", p.name, err)
		}
		say("%s deleted in %s", p.name, time.Since(t0).Round(time.Millisecond))
	}
	d.added = nil
	// The bridge's carrier follows its last port asynchronously (linkwatch).
	if err := d.settleBridge(); err != nil {
		return err
	}
	after, err := nodestate.Take(d.node.Path(), d.dataDir)
	if err != nil {
		return fmt.Errorf("snapshot after: %w", err)
	}
	if diff := nodestate.Diff(d.before, after); diff != "" {
		return fmt.Errorf("the node differs from before the pods (- before, + after):\n%s", diff)
	}
	say("node state after DEL equals the snapshot before the pods: all %d sections identical", len(after))
	say("no veth, no iptables/nft rule, no qdisc, no filter, no IFB, no lease of either pod is left")
	// What the network itself keeps, compared with the node before it existed.
	var kept, other []string
	section := ""
	for _, l := range strings.Split(strings.TrimSpace(nodestate.Diff(d.pristine, after)), "\n") {
		switch {
		case l == "":
		case strings.HasPrefix(l, "== "):
			section = strings.TrimPrefix(l, "== ")
		case keptByDesign(section, l, d.bridge):
			kept = append(kept, section+": "+l)
		default:
			other = append(other, section+": "+l)
		}
	}
	if len(other) > 0 {
		return fmt.Errorf("the network left more than its bridge and sysctls on the node:\n        %s", strings.Join(other, "\n        "))
	}
	say("compared with the node before its network existed, only the network's own setup remains (kept for the next pod, as with the reference plugins):")
	for _, k := range kept {
		if len(k) > 110 {
			k = k[:110] + "…"
		}
		say("  %s", k)
	}
	return nil
}

// keptByDesign reports whether a diff line is node-level setup the network keeps for
// its next pod: the bridge (with its gateway address and subnet route) and the
// forwarding/bridge-netfilter/route_localnet sysctls.
func keptByDesign(section, line, br string) bool {
	switch section {
	case "links", "addrs", "routes4", "routes6", "qdiscs":
		// Only additions: the bridge (with its gateway address, subnet route and noqueue
		// qdisc) did not exist before.
		return strings.HasPrefix(line, "+ ") && (strings.Contains(line, " "+br) || strings.Contains(line, br+":") || strings.HasPrefix(line, "+ "+br))
	case "sysctls":
		// A change from 0 to 1 shows as a removed and an added line.
		return strings.Contains(line, "ip_forward") || strings.Contains(line, "forwarding") ||
			strings.Contains(line, "bridge-nf-call") || strings.Contains(line, "/"+br+"/route_localnet")
	}
	return false
}
