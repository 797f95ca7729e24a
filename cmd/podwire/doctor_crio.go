// SPDX-License-Identifier: Apache-2.0

package main

import (
	"os"
	"strings"
)

// CRI-O differs from containerd in what it asks of the node (docs/crio.md): it does
// hostPorts itself (its own nftables or iptables rules; portmap never gets
// portMappings), its hostPorts on 127.0.0.1 need route_localnet and a masquerade of
// 127.0.0.0/8 that nothing sets up for it, and it GCs every cached attachment of its
// network name at startup, so a network name it shares with another runtime on the
// node loses that runtime's pods.

// crioConfigFiles are where a CRI-O node keeps its configuration.
var crioConfigFiles = []string{"/etc/crio/crio.conf", "/etc/crio/crio.conf.d"}

// crioNode is what the CRI-O checks read from the node.
type crioNode struct {
	// Via says how CRI-O was recognised ("CRI /run/crio/crio.sock", "config
	// /etc/crio/crio.conf"); "" means this is no CRI-O node.
	Via string
	// RouteLocalnet is net.ipv4.conf.all.route_localnet ("" when unreadable).
	RouteLocalnet string
	// BridgeNF is net.bridge.bridge-nf-call-iptables ("" when absent).
	BridgeNF string
	// Others are the other runtimes found on the node ("containerd 2.4.2").
	Others []string
}

// recogniseCRIO says how the node is a CRI-O node: a runtime found over CRI or as a
// binary named cri-o, else a CRI-O config file (exists reports whether a path exists).
func recogniseCRIO(found []foundRuntime, exists func(string) bool) (via string, others []string) {
	for _, r := range found {
		if isCRIO(r.Name) {
			if via == "" {
				via = r.String() + " via " + r.Via
			}
			continue
		}
		others = append(others, r.String())
	}
	if via != "" {
		return via, others
	}
	for _, f := range crioConfigFiles {
		if exists(f) {
			return "config " + f, others
		}
	}
	return "", others
}

func isCRIO(name string) bool {
	n := strings.ToLower(strings.TrimSpace(name))
	return n == "cri-o" || n == "crio"
}

// crioChecks judges a CRI-O node's prerequisites. Pure: the node is read by the caller.
func crioChecks(n crioNode) []Check {
	if n.Via == "" {
		return nil
	}
	out := []Check{{"crio", "info", "CRI-O node (" + n.Via + "): CRI-O maps hostPorts itself and never passes portMappings to CNI, so portmap in the conflist installs nothing; it brings lo up itself (no loopback plugin); it sends CHECK after every ADD and on restart, STATUS at cniVersion 1.1.0 until ready, and GC at startup"}}
	switch n.RouteLocalnet {
	case "1":
		out = append(out, Check{"crio-hostport-localhost", "ok", "net.ipv4.conf.all.route_localnet = 1: CRI-O's hostPorts answer on 127.0.0.1 (with a masquerade of 127.0.0.0/8, e.g. iptables -t nat -I POSTROUTING -s 127.0.0.0/8 ! -d 127.0.0.0/8 -j MASQUERADE)"})
	default:
		v := n.RouteLocalnet
		if v == "" {
			v = "unreadable"
		}
		out = append(out, Check{"crio-hostport-localhost", "warning", "net.ipv4.conf.all.route_localnet = " + v + ": the kernel drops CRI-O's DNAT of 127.0.0.1 to a pod, so hostPorts do not answer on 127.0.0.1 (they do on the node's other addresses); set sysctl -w net.ipv4.conf.all.route_localnet=1 and masquerade 127.0.0.0/8: iptables -t nat -I POSTROUTING -s 127.0.0.0/8 ! -d 127.0.0.0/8 -j MASQUERADE (CRI-O sets up neither; portmap's snat does not apply under CRI-O)"})
	}
	switch n.BridgeNF {
	case "1":
		out = append(out, Check{"crio-hostport-hairpin", "ok", "net.bridge.bridge-nf-call-iptables = 1: CRI-O's hostPort rules see traffic between pods on one bridge"})
	case "":
		out = append(out, Check{"crio-hostport-hairpin", "problem", "net.bridge.bridge-nf-call-iptables is absent (br_netfilter not loaded): a pod reaching another pod on the same bridge through a hostPort bypasses CRI-O's DNAT; run modprobe br_netfilter and persist it in /etc/modules-load.d"})
	default:
		out = append(out, Check{"crio-hostport-hairpin", "problem", "net.bridge.bridge-nf-call-iptables = " + n.BridgeNF + ": a pod reaching another pod on the same bridge through a hostPort bypasses CRI-O's DNAT; set it to 1 (sysctl -w net.bridge.bridge-nf-call-iptables=1, and in /etc/sysctl.d)"})
	}
	if len(n.Others) > 0 {
		out = append(out, Check{"crio-network-name", "warning", "CRI-O shares this node with " + strings.Join(n.Others, ", ") + ": at startup CRI-O DELs every attachment in libcni's cache (/var/lib/cni/results) of its network name that is not one of its pods; give each runtime's conflist its own \"name\""})
	}
	return out
}

// crio adds the CRI-O checks when this is a CRI-O node.
func (d *doctor) crio(found []foundRuntime) {
	via, others := recogniseCRIO(found, func(p string) bool { _, err := os.Stat(p); return err == nil })
	rl, _ := readSysctl("net/ipv4/conf/all/route_localnet")
	bnf, _ := readSysctl("net/bridge/bridge-nf-call-iptables")
	d.checks = append(d.checks, crioChecks(crioNode{Via: via, RouteLocalnet: rl, BridgeNF: bnf, Others: others})...)
}
