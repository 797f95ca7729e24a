// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/podwire/podwire/pkg/cniplumb"
)

const loName = "lo"

// add brings lo up and reports its first IPv4 and first IPv6 address, refusing a
// non-loopback address on lo, as the reference does. As a chained plugin (with
// prevResult) it passes prevResult through unchanged, as the reference does.
//
// The result is what the reference prints: a 1.x result labelled with the
// configuration's cniVersion, which printing at that version leaves as it is. So at
// 0.2.0 to 0.4.0 it keeps the 1.x shape (IP configs without "version", no "dns"),
// where converting to those versions would add them; without cniVersion (a 1.1.0
// label then) it is converted to 0.1.0.
func add(ctx context.Context, in *cniplumb.Input) (types.Result, error) {
	var first []net.IPNet // the first address of each family, as the reference reports
	done := cniplumb.Log(ctx).Step("bring lo up")
	defer done()
	err := ns.WithNetNSPath(in.Netns, func(ns.NetNS) error {
		lo, err := netlinksafe.LinkByName(loName)
		if err != nil {
			return fmt.Errorf("finding %s: %w", loName, err)
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return fmt.Errorf("bringing %s up: %w", loName, err)
		}
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			addrs, err := netlinksafe.AddrList(lo, fam)
			if err != nil {
				return fmt.Errorf("listing %s addresses: %w", loName, err)
			}
			for _, a := range addrs {
				if !a.IP.IsLoopback() {
					return fmt.Errorf("%s has the non-loopback address %s, which the reference loopback refuses too: remove it from %s (or do not run loopback in this namespace)", loName, a.IPNet, loName)
				}
			}
			if len(addrs) > 0 {
				first = append(first, *addrs[0].IPNet)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("in network namespace %s: %w", in.Netns, err)
	}
	if in.Prev != nil {
		return in.Prev, nil
	}
	res := &current.Result{
		CNIVersion: in.Conf.CNIVersion,
		Interfaces: []*current.Interface{{Name: loName, Mac: "00:00:00:00:00:00", Sandbox: in.Netns}},
	}
	for _, a := range first {
		res.IPs = append(res.IPs, &current.IPConfig{Interface: current.Int(0), Address: a})
	}
	return res, nil
}

// del brings lo down. A namespace that is already gone is success: the spec requires DEL
// to tolerate repeated calls and missing resources. So is a path that is no longer a
// namespace (the reference fails there): containerd 2.x unmounts a sandbox's netns and
// leaves the file when it shuts a sandbox down without CNI DEL, and the GC that DELs
// such a leaked attachment (podwire-agent's, libcni's DEL pass) could otherwise never
// drop its cache entry. bridge treats it as gone too (pkg/link).
func del(_ context.Context, in *cniplumb.Input) error {
	if in.Netns == "" {
		return nil
	}
	err := ns.WithNetNSPath(in.Netns, func(ns.NetNS) error {
		lo, err := netlinksafe.LinkByName(loName)
		if err != nil {
			return fmt.Errorf("finding %s: %w", loName, err)
		}
		if err := netlink.LinkSetDown(lo); err != nil {
			return fmt.Errorf("bringing %s down: %w", loName, err)
		}
		return nil
	})
	var gone ns.NSPathNotExistErr
	var notNS ns.NSPathNotNSErr
	if errors.As(err, &gone) || errors.As(err, &notNS) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("in network namespace %s: %w", in.Netns, err)
	}
	return nil
}

// check verifies lo is administratively up in the container.
func check(_ context.Context, in *cniplumb.Input) error {
	return ns.WithNetNSPath(in.Netns, func(ns.NetNS) error {
		lo, err := netlinksafe.LinkByName(loName)
		if err != nil {
			return fmt.Errorf("finding %s in %s: %w", loName, in.Netns, err)
		}
		if lo.Attrs().Flags&net.FlagUp == 0 {
			return fmt.Errorf("%s in %s is down; run ADD again or bring it up", loName, in.Netns)
		}
		return nil
	})
}

// status: loopback needs nothing on the node, so it is always ready.
func status(context.Context, *cniplumb.Input) error { return nil }

// gc: loopback keeps no node state, so there is nothing to collect.
func gc(context.Context, *cniplumb.Input) error { return nil }
