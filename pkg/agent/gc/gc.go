// SPDX-License-Identifier: Apache-2.0

// Package gc drives the chain's CNI GC, which containerd never calls
// (containerd/containerd#12130) and CRI-O calls only at startup: the agent lists the
// runtime's pod sandboxes over CRI, builds cni.dev/valid-attachments from them and
// libcni's result cache, and runs libcni's GCNetworkList. libcni first DELs every cached
// attachment of the network that is not valid, then sends GC to each plugin; the plugins
// serialize GC with their own ADD and DEL through their per-network locks.
//
// The list is run at cniVersion 1.1.0 whatever the conflist says: the GC verb exists
// from 1.1.0 on, podwire's plugins implement it, and a 1.0.0 conflist (containerd 1.6's
// libcni) would otherwise get only the DELs.
package gc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
)

// CNI is the part of *libcni.CNIConfig the agent uses.
type CNI interface {
	GCNetworkList(ctx context.Context, list *libcni.NetworkConfigList, args *libcni.GCArgs) error
	GetStatusNetworkList(ctx context.Context, list *libcni.NetworkConfigList) error
	GetCachedAttachments(containerID string) ([]*libcni.NetworkAttachment, error)
}

var _ CNI = (*libcni.CNIConfig)(nil)

// DefaultIfName is the interface name the kubelet's runtimes use for the pod network.
const DefaultIfName = "eth0"

// ValidAttachments returns the attachments GC must keep: every cached attachment of
// network whose container is a live sandbox, plus (sandbox, eth0) for each live sandbox,
// so that a sandbox whose cache entry is missing keeps its objects too. Sorted.
func ValidAttachments(network string, sandboxIDs []string, cached []*libcni.NetworkAttachment) []types.GCAttachment {
	live := map[string]bool{}
	for _, id := range sandboxIDs {
		live[id] = true
	}
	set := map[types.GCAttachment]bool{}
	for _, a := range cached {
		if a.Network == network && live[a.ContainerID] {
			set[types.GCAttachment{ContainerID: a.ContainerID, IfName: a.IfName}] = true
		}
	}
	for id := range live {
		set[types.GCAttachment{ContainerID: id, IfName: DefaultIfName}] = true
	}
	out := make([]types.GCAttachment, 0, len(set))
	for a := range set {
		out = append(out, a)
	}
	slices.SortFunc(out, compareAttachments)
	return out
}

// Snapshot is the node's GC-relevant objects by kind ("lease", "veth", "ifb",
// "attachment"), each a set of keys. The difference of two tells what GC reclaimed.
type Snapshot map[string]map[string]bool

// Counter takes snapshots.
type Counter interface {
	Snapshot(network string) (Snapshot, error)
}

// Reclaimed counts, by kind, the objects of before that after no longer has.
func Reclaimed(before, after Snapshot) map[string]int {
	out := map[string]int{}
	for kind, keys := range before {
		n := 0
		for k := range keys {
			if !after[kind][k] {
				n++
			}
		}
		out[kind] = n
	}
	return out
}

// Result is one GC run.
type Result struct {
	Valid     int             // valid attachments passed
	Young     int             // of those, kept only for their young lease (see Young)
	Stale     int             // cached attachments of the network that were not valid
	Reclaimed map[string]int  // by kind; nil when no Counter and no Networks
	Runtime   []NetworkResult // the runtime's other networks (see Driver.Networks)
}

// Driver runs GC for one network.
type Driver struct {
	CNI       CNI
	Sandboxes func(ctx context.Context) ([]string, error)
	Counter   Counter // may be nil
	// Young returns attachments to keep although no live sandbox holds them: those
	// whose ADD may still be running (see Young). May be nil.
	Young func(ctx context.Context, network string) ([]types.GCAttachment, error)
	// Networks returns the runtime's other pod networks, as the runtime loaded their
	// conflists (containerd's own cni-loopback, which no conf dir holds). After the
	// agent's network, GC runs for each of them with the same sandboxes, so that what a
	// leaked sandbox left there (a cache entry, at least) goes too; a network not
	// listed, such as another runtime's sharing the cache dir, is never touched. May be
	// nil.
	Networks func(ctx context.Context) ([]*libcni.NetworkConfigList, error)
}

// ForGC returns a copy of list at cniVersion 1.1.0 (see the package comment).
func ForGC(list *libcni.NetworkConfigList) (*libcni.NetworkConfigList, error) {
	return AtVersion(list, "1.1.0")
}

// AtVersion re-reads list's bytes with cniVersion set to v.
func AtVersion(list *libcni.NetworkConfigList, v string) (*libcni.NetworkConfigList, error) {
	if list.CNIVersion == v {
		return list, nil
	}
	raw := map[string]any{}
	if err := json.Unmarshal(list.Bytes, &raw); err != nil {
		return nil, fmt.Errorf("re-reading conflist %s: %w", list.Name, err)
	}
	raw["cniVersion"] = v
	b, err := json.Marshal(raw)
	if err != nil {
		return nil, err
	}
	return libcni.ConfListFromBytes(b)
}

// Run lists the sandboxes and runs GC on list. When the sandboxes cannot be listed it
// runs nothing: GC with an empty valid set would tear down every pod.
func (d *Driver) Run(ctx context.Context, list *libcni.NetworkConfigList) (Result, error) {
	ids, err := d.Sandboxes(ctx)
	if err != nil {
		return Result{}, fmt.Errorf("not running GC, the runtime's sandboxes are unknown: %w", err)
	}
	cached, err := d.CNI.GetCachedAttachments("")
	if err != nil {
		return Result{}, fmt.Errorf("reading libcni's result cache: %w", err)
	}
	var young []types.GCAttachment
	if d.Young != nil {
		if young, err = d.Young(ctx, list.Name); err != nil {
			return Result{}, fmt.Errorf("not running GC, the attachments whose ADD may still run are unknown: %w", err)
		}
	}
	p := PlanNetwork(list.Name, ids, cached, young)
	valid := p.Valid
	res := Result{Valid: len(valid), Young: len(valid) - len(ValidAttachments(list.Name, ids, cached)), Stale: len(p.Stale)}
	gcList, err := ForGC(list)
	if err != nil {
		return res, err
	}
	var before Snapshot
	if d.Counter != nil {
		before, err = d.Counter.Snapshot(list.Name)
		if err != nil {
			before = nil
		}
	}
	gcErr := d.CNI.GCNetworkList(ctx, gcList, &libcni.GCArgs{ValidAttachments: valid})
	if before != nil {
		if after, err := d.Counter.Snapshot(list.Name); err == nil {
			res.Reclaimed = Reclaimed(before, after)
		}
	}
	var errs []error
	if gcErr != nil {
		errs = append(errs, fmt.Errorf("GC of network %s: %w", list.Name, gcErr))
	}
	if d.Networks != nil {
		// Even when the own network's GC failed: the two are independent, and a
		// network's leftovers should not wait for another's fix.
		rs, err := d.runOthers(ctx, list.Name, ids)
		res.Runtime = rs
		n := 0
		for _, r := range rs {
			n += r.Reclaimed
		}
		if res.Reclaimed == nil {
			res.Reclaimed = map[string]int{}
		}
		res.Reclaimed[KindRuntimeAttachment] = n
		errs = append(errs, err)
	}
	return res, errors.Join(errs...)
}

// Status runs the chain's STATUS at 1.1.0; nil means every plugin is ready.
func Status(ctx context.Context, c CNI, list *libcni.NetworkConfigList) error {
	l, err := ForGC(list)
	if err != nil {
		return err
	}
	if err := c.GetStatusNetworkList(ctx, l); err != nil {
		var te *types.Error
		if errors.As(err, &te) {
			return te
		}
		return err
	}
	return nil
}
