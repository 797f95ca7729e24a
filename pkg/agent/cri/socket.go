// SPDX-License-Identifier: Apache-2.0

package cri

import (
	"fmt"
	"os"
	"strings"
)

// DefaultSockets is --cri-socket's default: containerd's and CRI-O's sockets at their
// packaged paths, so one DaemonSet serves nodes of either runtime (it mounts both
// directories). /var/run is /run on every distribution the runtimes support.
const DefaultSockets = "/run/containerd/containerd.sock,/run/crio/crio.sock"

// PickSocket returns the socket of list (comma-separated paths or unix:// URLs, in the
// order to try) that exists as a unix socket on this node, the first such one when
// several do. A list of one is returned as it is, present or not: the agent then dials
// it lazily, as before lists, and its errors name it. With several and none present it
// fails: on a node whose runtime listens elsewhere the operator must name the socket.
func PickSocket(list string) (string, error) {
	var socks []string
	for _, s := range strings.Split(list, ",") {
		if s = strings.TrimSpace(s); s != "" {
			socks = append(socks, s)
		}
	}
	switch len(socks) {
	case 0:
		return "", nil
	case 1:
		return socks[0], nil
	}
	for _, s := range socks {
		if fi, err := os.Stat(strings.TrimPrefix(s, "unix://")); err == nil && fi.Mode()&os.ModeSocket != 0 {
			return s, nil
		}
	}
	return "", fmt.Errorf("none of the CRI sockets %s is a socket on this node: mount the runtime's socket directory into the agent and name its socket first in --cri-socket", strings.Join(socks, ", "))
}
