// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/vishvananda/netlink"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/conntrack"
	"github.com/podwire/podwire/pkg/netfilter"
)

// routeIface returns the host interface that routes to pod (the bridge), or "" when
// there is no route (then there is nothing to set, as in the reference).
func routeIface(pod netip.Addr) (string, error) {
	routes, err := netlink.RouteGet(pod.AsSlice())
	if err != nil || len(routes) == 0 {
		return "", nil
	}
	l, err := netlink.LinkByIndex(routes[0].LinkIndex)
	if err != nil {
		return "", fmt.Errorf("finding the interface that routes to %s: %w", pod, err)
	}
	return l.Attrs().Name, nil
}

// localnet keeps route_localnet on the interfaces that route to pods with host ports:
// a connection from 127.0.0.1 may only leave through an interface with route_localnet,
// and the masquerade then gives it the node's address. It counts its users per
// interface in the state directory (localnet/<ifname>/<owner>), and turns the knob
// back off when the last user goes, but only if podwire turned it on
// (localnet/<ifname>/.set): a value set by the operator or kube-proxy is left alone.
// One flock serializes the counting, so a DEL turning it off and an ADD needing it
// cannot interleave badly.
type localnet struct {
	dir  string
	proc string // /proc/sys/net/ipv4/conf
}

func (l localnet) sysctl(iface string) string {
	return filepath.Join(l.proc, iface, "route_localnet")
}

func (l localnet) lock() (func(), error) {
	if err := os.MkdirAll(l.dir, 0o700); err != nil {
		return nil, cniplumb.IOError("creating "+l.dir, err)
	}
	unlock, err := netfilter.LockFile(filepath.Join(l.dir, "localnet.lock"))
	if err != nil {
		return nil, cniplumb.IOError("taking the route_localnet lock", err)
	}
	return unlock, nil
}

func (l localnet) users(iface string) string { return filepath.Join(l.dir, "localnet", iface) }

// hold records attachment id as a user of route_localnet on iface and turns it on.
func (l localnet) hold(iface string, id netfilter.OwnerID) error {
	unlock, err := l.lock()
	if err != nil {
		return err
	}
	defer unlock()
	dir := l.users(iface)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return cniplumb.IOError("recording route_localnet users", err)
	}
	if err := os.WriteFile(filepath.Join(dir, string(id)), nil, 0o600); err != nil {
		return cniplumb.IOError("recording route_localnet users", err)
	}
	path := l.sysctl(iface)
	if b, err := os.ReadFile(path); err == nil && bytes.Equal(bytes.TrimSpace(b), []byte("1")) {
		return nil
	}
	if err := os.WriteFile(filepath.Join(dir, ".set"), nil, 0o600); err != nil {
		return cniplumb.IOError("recording route_localnet users", err)
	}
	if err := os.WriteFile(path, []byte("1"), 0o644); err != nil {
		return fmt.Errorf("setting route_localnet on %s, needed for host ports via 127.0.0.1: %w", iface, err)
	}
	return nil
}

// release drops attachment id as a user of route_localnet on iface; the last user turns it off
// again if podwire turned it on. A vanished interface is nothing to turn off.
func (l localnet) release(iface string, id netfilter.OwnerID) error {
	unlock, err := l.lock()
	if err != nil {
		return err
	}
	defer unlock()
	dir := l.users(iface)
	if err := os.Remove(filepath.Join(dir, string(id))); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return cniplumb.IOError("updating route_localnet users", err)
	}
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return cniplumb.IOError("reading route_localnet users", err)
	}
	set := false
	for _, e := range ents {
		if e.Name() != ".set" {
			return nil // still in use
		}
		set = true
	}
	if set {
		if err := os.WriteFile(l.sysctl(iface), []byte("0"), 0o644); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("turning route_localnet on %s back off: %w", iface, err)
		}
	}
	return os.RemoveAll(dir)
}

// flushUDP deletes stale UDP conntrack entries to the given host ports in one family.
func flushUDP(ipv6 bool, ports []uint16) error {
	_, err := conntrack.DeleteUDPDstPorts(ipv6, ports)
	return err
}
