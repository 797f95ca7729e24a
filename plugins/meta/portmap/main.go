// SPDX-License-Identifier: Apache-2.0

// Command portmap is podwire's drop-in replacement for the reference portmap plugin: a
// chained plugin that forwards host ports to a pod (Kubernetes hostPort,
// "capabilities": {"portMappings": true}) with nftables or iptables rules owned per
// attachment. See README.md for keys, the rule layout of each backend and figures.
package main

import (
	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/netfilter"
	"github.com/podwire/podwire/pkg/portstate"
)

func main() {
	pm := &portmap{
		open:       netfilter.OpenHostPorts,
		probe:      netfilter.ProbeHost,
		state:      portstate.DefaultDir,
		routeIface: routeIface,
		localnet:   localnet{dir: portstate.DefaultDir, proc: "/proc/sys/net/ipv4/conf"},
		flushUDP:   flushUDP,
		logf:       stderrf,
	}
	cniplumb.Main("portmap", cniplumb.Verbs{Add: pm.add, Del: pm.del, Check: pm.check, GC: pm.gc, Status: pm.status})
}
