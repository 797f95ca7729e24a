// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"

	"github.com/containernetworking/cni/libcni"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/ipam"
	"github.com/podwire/podwire/pkg/ipam/disk"
	"github.com/podwire/podwire/pkg/link"
	"github.com/podwire/podwire/pkg/netfilter"
	"github.com/podwire/podwire/pkg/portstate"
	"github.com/podwire/podwire/pkg/tc"
)

// netState is one network's objects on the node, read through the plugins'
// packages. Reading changes nothing (the lease store's transaction may bring
// podwire's own index in .podwire up to date, as any plugin call would).
type netState struct {
	Name     string
	Bridge   string // the bridge entry's "bridge", "" without a bridge entry
	LeaseDir string // "" without host-local
	Leases   []ipam.Lease
	Markers  []portstate.Stored
	IFBs     []tc.IFB // of this network, by their alias
	Masq     []netfilter.Object
	HostPort []netfilter.Object
	MacSpoof []netfilter.Object          // of this network's owners
	Cached   []*libcni.NetworkAttachment // libcni's cached ADD results of this network
	Ports    []string                    // veths on the bridge
}

// host is what the commands read the node through: the plugins' own backends, or
// fakes in tests.
type host struct {
	links link.Backend
	ports func(bridge string) ([]string, error) // the bridge's ports
	tc    tc.Backend
	nf    *netfilter.Lister
	// markers is portmap's state directory.
	markers portstate.Dir
	// hostPorts is the kind of host-port backend portmap opens for a configured one
	// (netfilter.OpenHostPorts); a code-50 error when the node lacks it.
	hostPorts func(netfilter.Kind) (netfilter.Kind, error)
}

// realHost reads the node's kernel and portmap's state directory.
func realHost() *host {
	return &host{links: link.NewNetlink(), ports: link.BridgePorts, tc: tc.NewNetlink(nil), nf: netfilter.NewLister(),
		markers: portstate.DefaultDir, hostPorts: func(k netfilter.Kind) (netfilter.Kind, error) {
			_, k, err := netfilter.OpenHostPorts(k)
			return k, err
		}}
}

// leaseStore opens the network's host-local store, when its bridge (or any entry)
// delegates to host-local; nil without one.
func leaseStore(l *libcni.NetworkConfigList) (*disk.Store, error) {
	for _, p := range l.Plugins {
		if p.Network.IPAM.Type != "host-local" {
			continue
		}
		_, b := plugin(l, p.Network.Type)
		sc, err := ipam.ParseStoreConf(b, "")
		if err != nil {
			return nil, fmt.Errorf("the ipam section of %s: %w", p.Network.Type, err)
		}
		return disk.Open(sc.DataDir, sc.Network, disk.Options{})
	}
	return nil, nil
}

// readLeases lists the store's leases in one transaction, with f's verdict (PlanGC's
// for the dry run) from the same transaction.
func readLeases(ctx context.Context, st *disk.Store, f func(ipam.Tx) error) error {
	if !st.Exists() {
		return nil
	}
	return st.Do(ctx, f)
}

// readState reads everything inspect shows of network n; objs is every netfilter
// object of the node (host.nf's List).
func (nd *node) readState(ctx context.Context, n network, objs []netfilter.Object) (*netState, error) {
	s := &netState{Name: n.List.Name}
	var errs []error
	if br, _ := plugin(n.List, "bridge"); br != nil {
		s.Bridge = str(br, "bridge")
		if s.Bridge == "" {
			s.Bridge = "cni0"
		}
		ports, err := nd.h.ports(s.Bridge)
		s.Ports, errs = ports, append(errs, err)
	}
	st, err := leaseStore(n.List)
	errs = append(errs, err)
	if st != nil {
		s.LeaseDir = st.Dir()
		errs = append(errs, readLeases(ctx, st, func(tx ipam.Tx) (err error) {
			s.Leases, err = tx.All()
			return err
		}))
	}
	s.Markers, err = nd.h.markers.List(s.Name)
	errs = append(errs, err)
	ifbs, err := nd.h.tc.IFBs(ctx)
	errs = append(errs, err)
	for _, i := range ifbs {
		if tc.OfNetwork(i.Alias, s.Name) {
			s.IFBs = append(s.IFBs, i)
		}
	}
	s.Cached, err = nd.cached(s.Name)
	errs = append(errs, err)
	s.addObjects(objs)
	return s, errors.Join(errs...)
}

// addObjects takes the network's objects from objs: those the layout says are its,
// then, where a layout names no network (macspoofchk, the reference portmap's
// cni_hostport), those of an attachment the network knows.
func (s *netState) addObjects(objs []netfilter.Object) {
	var nameless []netfilter.Object
	for _, o := range objs {
		switch {
		case !o.InNetwork(s.Name):
			nameless = append(nameless, o)
		case o.What == "masquerade":
			s.Masq = append(s.Masq, o)
		case o.What == "hostports":
			s.HostPort = append(s.HostPort, o)
		}
	}
	owners := s.everyOwner()
	for _, o := range nameless {
		if slices.ContainsFunc(owners, o.Of) {
			if o.What == "macspoof" {
				s.MacSpoof = append(s.MacSpoof, o)
			} else if o.What == "hostports" {
				s.HostPort = append(s.HostPort, o)
			}
		}
	}
}

// cached returns libcni's cached attachments of network (what GCNetworkList DELs
// when they are not valid).
func (nd *node) cached(network string) ([]*libcni.NetworkAttachment, error) {
	c := libcni.NewCNIConfigWithCacheDir(nd.binDirs, nd.cacheDir, nil)
	all, err := c.GetCachedAttachments("")
	if err != nil {
		return nil, fmt.Errorf("reading libcni's cache in %s: %w", filepath.Join(nd.cacheDir, "results"), err)
	}
	var out []*libcni.NetworkAttachment
	for _, a := range all {
		if a.Network == network {
			out = append(out, a)
		}
	}
	return out, nil
}

// owners is every attachment the state names, in a stable order: leases first, then
// libcni's cache, then markers and IFB aliases.
func (s *netState) owners() []cniplumb.Owner {
	var out []cniplumb.Owner
	seen := map[cniplumb.Owner]bool{}
	add := func(o cniplumb.Owner) {
		if o.ContainerID != "" && !seen[o] {
			seen[o] = true
			out = append(out, o)
		}
	}
	for _, l := range s.Leases {
		add(cniplumb.Owner{Network: s.Name, ContainerID: l.Owner.ContainerID, IfName: l.Owner.IfName})
	}
	for _, a := range s.Cached {
		add(cniplumb.Owner{Network: s.Name, ContainerID: a.ContainerID, IfName: a.IfName})
	}
	return out
}

// everyOwner is owners plus the attachments only markers, IFB aliases and rule tags
// name (an attachment whose lease is gone).
func (s *netState) everyOwner() []cniplumb.Owner {
	out := s.owners()
	seen := map[cniplumb.Owner]bool{}
	for _, o := range out {
		seen[o] = true
	}
	add := func(o cniplumb.Owner, ok bool) {
		if ok && o.Network == s.Name && !seen[o] {
			seen[o] = true
			out = append(out, o)
		}
	}
	for _, m := range s.Markers {
		add(portstate.OwnerOfKey(m.Owner))
	}
	for _, i := range s.IFBs {
		add(tc.OwnerOfAlias(i.Alias))
	}
	for _, o := range append(append([]netfilter.Object{}, s.Masq...), s.HostPort...) {
		add(o.Owner, o.Owner.IfName != "")
	}
	return out
}
