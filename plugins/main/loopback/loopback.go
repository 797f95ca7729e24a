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

// add brings lo up and reports its loopback addresses. As a chained plugin (with
// prevResult) it passes prevResult through unchanged, as the reference does.
func add(_ context.Context, in *cniplumb.Input) (types.Result, error) {
	var addrs []netlink.Addr
	err := ns.WithNetNSPath(in.Netns, func(ns.NetNS) error {
		lo, err := netlinksafe.LinkByName(loName)
		if err != nil {
			return fmt.Errorf("finding %s: %w", loName, err)
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return fmt.Errorf("bringing %s up: %w", loName, err)
		}
		addrs, err = netlinksafe.AddrList(lo, netlink.FAMILY_ALL)
		if err != nil {
			return fmt.Errorf("listing %s addresses: %w", loName, err)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("in network namespace %s: %w", in.Netns, err)
	}
	if in.PrevResult != nil {
		return in.PrevResult, nil
	}
	res := &current.Result{
		CNIVersion: current.ImplementedSpecVersion,
		Interfaces: []*current.Interface{{Name: loName, Mac: "00:00:00:00:00:00", Sandbox: in.Netns}},
	}
	for _, a := range addrs {
		if a.IPNet == nil || !a.IP.IsLoopback() {
			continue
		}
		res.IPs = append(res.IPs, &current.IPConfig{
			Interface: current.Int(0),
			Address:   net.IPNet{IP: a.IP, Mask: a.Mask},
		})
	}
	return res, nil
}

// del brings lo down. A namespace that is already gone is success: the spec requires DEL
// to tolerate repeated calls and missing resources.
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
	if errors.As(err, &gone) {
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
