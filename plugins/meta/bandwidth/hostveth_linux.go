// SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"
	"fmt"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/podwire/podwire/pkg/cniplumb"
)

// errGone means the pod's interface (or its whole netns) no longer exists: nothing is
// left on the host side of it either, since a veth pair dies with either end.
var errGone = errors.New("gone")

// findHostVeth returns the name and MTU of the host-side peer of ifName in the pod
// netns at netnsPath.
//
// It asks the kernel rather than trusting names: the pod interface must be a veth whose
// peer's netns (IFLA_LINK_NETNSID, as seen from the pod) is the plugin's own netns, and
// the link at the peer index here must be a veth pointing back at the pod interface.
// The reference plugin only looks the peer index up in the host netns, which finds an
// unrelated link when the peer lives elsewhere (a veth between two pods).
func findHostVeth(netnsPath, ifName string) (string, int, error) {
	if netnsPath == "" {
		return "", 0, errGone
	}
	host, err := ns.GetCurrentNS()
	if err != nil {
		return "", 0, fmt.Errorf("opening the plugin's network namespace: %w", err)
	}
	defer host.Close()
	pod, err := ns.GetNS(netnsPath)
	var notExist ns.NSPathNotExistErr
	if errors.As(err, &notExist) {
		return "", 0, errGone
	}
	if err != nil {
		return "", 0, fmt.Errorf("opening network namespace %s: %w", netnsPath, err)
	}
	defer pod.Close()

	var podIndex, peerIndex int
	err = pod.Do(func(ns.NetNS) error {
		l, err := netlinksafe.LinkByName(ifName)
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return errGone
		}
		if err != nil {
			return fmt.Errorf("looking up %s: %w", ifName, err)
		}
		if l.Type() != "veth" {
			return cniplumb.ConfigError("type", "bandwidth shapes the host side of a veth, but %s in %s is a %s: chain it after a veth-based plugin such as bridge or ptp", ifName, netnsPath, l.Type())
		}
		podIndex, peerIndex = l.Attrs().Index, l.Attrs().ParentIndex
		hostID, err := netlink.GetNetNsIdByFd(int(host.Fd()))
		if err != nil {
			return fmt.Errorf("reading the id of the plugin's netns as seen from %s: %w", netnsPath, err)
		}
		if peerID := l.Attrs().NetNsID; peerID < 0 || peerID != hostID {
			return fmt.Errorf("the veth peer of %s in %s is not in the plugin's network namespace (peer netns id %d, ours %d): bandwidth must run in the netns that holds the host side", ifName, netnsPath, peerID, hostID)
		}
		return nil
	})
	if err != nil {
		return "", 0, err
	}
	l, err := netlink.LinkByIndex(peerIndex)
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) {
		return "", 0, errGone
	}
	if err != nil {
		return "", 0, fmt.Errorf("looking up the host side of %s (ifindex %d): %w", ifName, peerIndex, err)
	}
	if l.Type() != "veth" || l.Attrs().ParentIndex != podIndex {
		return "", 0, fmt.Errorf("ifindex %d here is %s (a %s), not the veth peer of %s in %s", peerIndex, l.Attrs().Name, l.Type(), ifName, netnsPath)
	}
	return l.Attrs().Name, l.Attrs().MTU, nil
}
