// SPDX-License-Identifier: Apache-2.0

package gc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
)

// KindRuntimeAttachment is the Reclaimed kind of libcni cache entries GC removed in the
// runtime's other pod networks (containerd's cni-loopback): "attachment" stays the
// agent's own network.
const KindRuntimeAttachment = "runtime-attachment"

// Plan is GC's decision for one network: the attachments passed to libcni as valid,
// and the cached attachments of the network that are not, which libcni will DEL.
type Plan struct {
	Network string
	Valid   []types.GCAttachment // sorted
	Stale   []types.GCAttachment // sorted
}

// PlanNetwork decides GC of network: valid are ValidAttachments (what the runtime's live
// sandboxes hold) plus young (attachments whose ADD may still run, see Young and
// YoungCached); stale are the cached attachments of network outside valid. Pure.
func PlanNetwork(network string, sandboxIDs []string, cached []*libcni.NetworkAttachment, young []types.GCAttachment) Plan {
	p := Plan{Network: network, Valid: ValidAttachments(network, sandboxIDs, cached)}
	for _, a := range young {
		if !slices.Contains(p.Valid, a) {
			p.Valid = append(p.Valid, a)
		}
	}
	slices.SortFunc(p.Valid, compareAttachments)
	for _, a := range cached {
		g := types.GCAttachment{ContainerID: a.ContainerID, IfName: a.IfName}
		if a.Network == network && !slices.Contains(p.Valid, g) && !slices.Contains(p.Stale, g) {
			p.Stale = append(p.Stale, g)
		}
	}
	slices.SortFunc(p.Stale, compareAttachments)
	return p
}

func compareAttachments(a, b types.GCAttachment) int {
	if c := strings.Compare(a.ContainerID, b.ContainerID); c != 0 {
		return c
	}
	return strings.Compare(a.IfName, b.IfName)
}

// NetworkResult is GC of one of the runtime's other networks.
type NetworkResult struct {
	Network   string
	Valid     int
	Stale     int // cached attachments of the network that were not valid
	Reclaimed int // of those, gone from libcni's cache after the run
}

// runOther runs GC of one of the runtime's other pod networks, as the runtime loaded
// its conflist. Unlike the agent's own network it runs at the conflist's cniVersion:
// its plugins need not be podwire's nor speak 1.1.0, and libcni's DEL pass, which is
// what clears the cache entries, runs at any version (GC is sent to the plugins from
// 1.1.0 on).
func (d *Driver) runOther(ctx context.Context, list *libcni.NetworkConfigList, ids []string) (NetworkResult, error) {
	r := NetworkResult{Network: list.Name}
	cached, err := d.CNI.GetCachedAttachments("")
	if err != nil {
		return r, fmt.Errorf("not running GC of network %s, reading libcni's result cache: %w", list.Name, err)
	}
	var young []types.GCAttachment
	if d.Young != nil {
		if young, err = d.Young(ctx, list.Name); err != nil {
			return r, fmt.Errorf("not running GC of network %s, the attachments whose ADD may still run are unknown: %w", list.Name, err)
		}
	}
	p := PlanNetwork(list.Name, ids, cached, young)
	r.Valid, r.Stale = len(p.Valid), len(p.Stale)
	gcErr := d.CNI.GCNetworkList(ctx, list, &libcni.GCArgs{ValidAttachments: p.Valid})
	if after, err := d.CNI.GetCachedAttachments(""); err == nil {
		left := map[types.GCAttachment]bool{}
		for _, a := range after {
			if a.Network == list.Name {
				left[types.GCAttachment{ContainerID: a.ContainerID, IfName: a.IfName}] = true
			}
		}
		for _, a := range p.Stale {
			if !left[a] {
				r.Reclaimed++
			}
		}
	}
	if gcErr != nil {
		return r, fmt.Errorf("GC of the runtime's network %s: %w", list.Name, gcErr)
	}
	return r, nil
}

// runOthers runs runOther for every network Networks returns but own, collecting every
// error and going on.
func (d *Driver) runOthers(ctx context.Context, own string, ids []string) ([]NetworkResult, error) {
	// A network the runtime reported but that cannot be read is left alone; the
	// others still run.
	lists, err := d.Networks(ctx)
	var errs []error
	if err != nil {
		errs = append(errs, fmt.Errorf("listing the runtime's other networks (their cache entries stay this run): %w", err))
	}
	var out []NetworkResult
	for _, l := range lists {
		if l.Name == own {
			continue // GC'd above, with the conflist the agent wrote
		}
		r, err := d.runOther(ctx, l, ids)
		out = append(out, r)
		errs = append(errs, err)
	}
	return out, errors.Join(errs...)
}

// YoungCached returns the attachments of network in cached whose libcni cache entry
// under cacheDir was written less than grace before now. A runtime writes the entry
// when a network's ADD returns, but lists the sandbox only once all its networks' ADDs
// have: containerd's cni-loopback entry of a pod being created is there seconds before
// the pod is, and has no lease to keep it (see Young). An entry that is gone is skipped.
func YoungCached(cacheDir, network string, cached []*libcni.NetworkAttachment, grace time.Duration, now time.Time) ([]types.GCAttachment, error) {
	if grace <= 0 {
		return nil, nil
	}
	var out []types.GCAttachment
	for _, a := range cached {
		if a.Network != network {
			continue
		}
		// libcni's layout (CNIConfig.getCacheFilePath, unexported):
		// <cacheDir>/results/<network>-<containerID>-<ifName>.
		fi, err := os.Stat(filepath.Join(cacheDir, "results", a.Network+"-"+a.ContainerID+"-"+a.IfName))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading the age of libcni's cache entry: %w", err)
		}
		if now.Sub(fi.ModTime()) < grace {
			out = append(out, types.GCAttachment{ContainerID: a.ContainerID, IfName: a.IfName})
		}
	}
	return out, nil
}
