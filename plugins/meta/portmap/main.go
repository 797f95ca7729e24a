// Command portmap is podwire's drop-in replacement for the reference portmap plugin: a
// chained plugin that forwards host ports to a pod (Kubernetes hostPort,
// "capabilities": {"portMappings": true}) with nftables or iptables rules owned per
// attachment. See README.md for keys, the rule layout of each backend and figures.
package main

import (
	"io"
	"os"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/netfilter"
)

func main() {
	if os.Getenv(releaseEnv) == "1" {
		// The socket-holding child of detachNetfilterSockets: wait for the parent to exit.
		_, _ = io.Copy(io.Discard, os.Stdin)
		return
	}
	pm := &portmap{
		open:       netfilter.OpenHostPorts,
		probe:      netfilter.ProbeHost,
		state:      defaultStateDir,
		routeIface: routeIface,
		localnet:   localnet{dir: defaultStateDir, proc: "/proc/sys/net/ipv4/conf"},
		flushUDP:   flushUDP,
		logf:       stderrf,
		detach:     detachNetfilterSockets,
	}
	cniplumb.Main("portmap", cniplumb.Verbs{Add: pm.add, Del: pm.del, Check: pm.check, GC: pm.gc, Status: pm.status})
}
