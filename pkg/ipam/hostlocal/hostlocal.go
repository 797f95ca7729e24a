// SPDX-License-Identifier: Apache-2.0

// Package hostlocal is the host-local IPAM plugin's verbs: node-local address leases
// in the reference host-local's on-disk format. The host-local command wires them to
// cniplumb.Main; bridge runs them in its own process when the host-local it would
// execute is this same build (see pkg/delegate).
package hostlocal

import (
	"context"
	"fmt"
	"net"
	"os"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/ipam"
	"github.com/podwire/podwire/pkg/ipam/disk"
)

func owner(in *cniplumb.Input) ipam.Owner {
	return ipam.Owner{ContainerID: in.ContainerID, IfName: in.IfName}
}

// Verbs are host-local's CNI operations.
var Verbs = cniplumb.Verbs{Add: add, Del: del, Check: check, GC: gc, Status: status}

// add leases one address from each range set and returns them with the configured
// routes and DNS.
func add(ctx context.Context, in *cniplumb.Input) (types.Result, error) {
	conf, err := ipam.ParseConf(in.Stdin, in.Args)
	if err != nil {
		return nil, err
	}
	res := &current.Result{CNIVersion: current.ImplementedSpecVersion, Routes: conf.Routes}
	if conf.ResolvConf != "" {
		if res.DNS, err = readResolvConf(conf.ResolvConf); err != nil {
			return nil, err
		}
	}
	lg := cniplumb.Log(ctx)
	st, err := disk.Open(conf.DataDir, conf.Network, disk.Options{})
	if err != nil {
		return nil, err
	}
	done := lg.Step("host-local allocate")
	allocs, err := ipam.Allocate(ctx, st, conf, owner(in))
	done()
	if err != nil {
		return nil, fmt.Errorf("leasing addresses for %s in network %s: %w", owner(in), conf.Network, err)
	}
	for _, a := range allocs {
		res.IPs = append(res.IPs, &current.IPConfig{Address: a.Address, Gateway: a.Gateway})
		lg.Decision("leased", "address", a.Address.String(), "dataDir", conf.DataDir)
	}
	return res, nil
}

// del releases the attachment's leases. It needs only the data dir, so it works even
// when the ranges were changed or broken after ADD; no lease is success.
func del(ctx context.Context, in *cniplumb.Input) error {
	sc, st, err := existingStore(in)
	if st == nil || err != nil {
		return err
	}
	defer cniplumb.Log(ctx).Step("host-local release")()
	if err := ipam.Release(ctx, st, owner(in)); err != nil {
		return fmt.Errorf("releasing the leases of %s in network %s: %w", owner(in), sc.Network, err)
	}
	return nil
}

// existingStore opens the lease store DEL and GC work on, which needs only the data dir
// (so it works even when the ranges were changed or broken after ADD); nil when the
// network never had a lease, which is nothing to do. A relative dataDir, which ADD
// refuses, is taken relative to the working directory as the reference takes it, with
// a warning on stderr, and so do CNI_ARGS that ADD would refuse (the reference's DEL
// refuses them).
func existingStore(in *cniplumb.Input) (*ipam.StoreConf, *disk.Store, error) {
	wd, _ := os.Getwd()
	sc, err := ipam.ParseStoreConf(in.Stdin, wd)
	if err != nil {
		return nil, nil, err
	}
	if _, err := ipam.LoadEnvArgs(in.Args); err != nil {
		// The reference's DEL refuses here; a DEL that refuses to release a lease
		// loses the address, so it goes on and says why.
		fmt.Fprintf(os.Stderr, "host-local: warning: %s goes on despite CNI_ARGS ADD would refuse: %v\n", in.Command, err)
	}
	if sc.Relative != "" {
		fmt.Fprintf(os.Stderr, "host-local: warning: ipam.dataDir %q is not an absolute path; %s uses %s, where the reference host-local keeps leases for it, but ADD refuses it: make it absolute\n", sc.Relative, in.Command, sc.DataDir)
	}
	st, err := disk.Open(sc.DataDir, sc.Network, disk.Options{})
	if err != nil || !st.Exists() {
		return sc, nil, err
	}
	return sc, st, nil
}

// check verifies the attachment's leases exist and match prevResult's addresses.
func check(ctx context.Context, in *cniplumb.Input) error {
	conf, err := ipam.ParseConf(in.Stdin, in.Args)
	if err != nil {
		return err
	}
	st, err := disk.Open(conf.DataDir, conf.Network, disk.Options{})
	if err != nil {
		return err
	}
	if !st.Exists() {
		return types.NewError(types.ErrUnknownContainer, "no lease",
			fmt.Sprintf("network %s has no leases in %s; ADD the attachment again", conf.Network, st.Dir()))
	}
	var prev []net.IP
	if in.PrevResult != nil {
		prev = []net.IP{}
		for _, ip := range in.PrevResult.IPs {
			prev = append(prev, ip.Address.IP)
		}
	}
	return ipam.Check(ctx, st, conf, owner(in), prev)
}

// gc releases the leases of every attachment not in cni.dev/valid-attachments.
func gc(ctx context.Context, in *cniplumb.Input) error {
	sc, st, err := existingStore(in)
	if st == nil || err != nil {
		return err
	}
	var valid []ipam.Owner
	for o := range in.ValidAttachments {
		valid = append(valid, ipam.Owner{ContainerID: o.ContainerID, IfName: o.IfName})
	}
	cniplumb.Log(ctx).Decision("gc", "validAttachments", len(valid), "dataDir", sc.DataDir)
	defer cniplumb.Log(ctx).Step("host-local gc")()
	if err := ipam.GC(ctx, st, valid); err != nil {
		return fmt.Errorf("garbage-collecting leases of network %s: %w", sc.Network, err)
	}
	return nil
}

// status fails with code 50 when a range set is exhausted or the lease directory is
// not writable.
func status(ctx context.Context, in *cniplumb.Input) error {
	conf, err := ipam.ParseConf(in.Stdin, "")
	if err != nil {
		return err
	}
	st, err := disk.Open(conf.DataDir, conf.Network, disk.Options{})
	if err != nil {
		return err
	}
	if err := ipam.Status(ctx, st, conf); err != nil {
		if cniplumb.Code(err) == cniplumb.CodeNotAvailable {
			return err
		}
		return cniplumb.NotAvailable("the lease store of network %s cannot be used: %v", conf.Network, err)
	}
	return nil
}
