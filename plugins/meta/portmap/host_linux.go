package main

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/vishvananda/netlink"

	"github.com/podwire/podwire/pkg/conntrack"
)

// enableLocalnet sets route_localnet on the host interface that routes to pod (the
// bridge), so connections from 127.0.0.1 to a host port may leave through it after
// the DNAT; the masquerade then gives them the node's address. Without a route to the
// pod there is nothing to set (the reference skips it too). It is left set on DEL:
// other pods on the same bridge may rely on it, and it goes away with the bridge.
func enableLocalnet(pod netip.Addr) error {
	routes, err := netlink.RouteGet(pod.AsSlice())
	if err != nil || len(routes) == 0 {
		return nil
	}
	l, err := netlink.LinkByIndex(routes[0].LinkIndex)
	if err != nil {
		return fmt.Errorf("finding the interface that routes to %s: %w", pod, err)
	}
	name := l.Attrs().Name
	path := filepath.Join("/proc/sys/net/ipv4/conf", name, "route_localnet")
	if b, err := os.ReadFile(path); err == nil && bytes.Equal(bytes.TrimSpace(b), []byte("1")) {
		return nil
	}
	if err := os.WriteFile(path, []byte("1"), 0o644); err != nil {
		return fmt.Errorf("setting route_localnet on %s, needed for host ports via 127.0.0.1: %w", name, err)
	}
	return nil
}

// flushUDP deletes stale UDP conntrack entries to the given host ports in one family.
func flushUDP(ipv6 bool, ports []uint16) error {
	_, err := conntrack.DeleteUDPDstPorts(ipv6, ports)
	return err
}
