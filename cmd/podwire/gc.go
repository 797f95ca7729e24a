// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/ipam"
	"github.com/podwire/podwire/pkg/link"
	"github.com/podwire/podwire/pkg/netfilter"
	"github.com/podwire/podwire/pkg/portstate"
	"github.com/podwire/podwire/pkg/tc"
)

// Removal is one thing GC removes.
type Removal struct {
	Network string `json:"network"`
	Plugin  string `json:"plugin"` // the conflist entry whose GC removes it; "libcni" for DEL of a cached attachment
	Kind    string `json:"kind"`   // del, lease, masquerade, hostports, portmap-marker, ifb
	Name    string `json:"name"`
	Owner   string `json:"owner,omitempty"` // network/containerID/ifname when known
}

// GCPlan is gc --dry-run's output.
type GCPlan struct {
	Removals []Removal `json:"removals"`
	Notes    []string  `json:"notes,omitempty"`
}

// stringList is a repeatable flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, strings.Split(v, ",")...); return nil }

func runGC(args []string, out io.Writer) error {
	fs := newFlags("gc")
	nd := nodeFlags(fs)
	only := fs.String("network", "", "only this network")
	dry := fs.Bool("dry-run", false, "list what GC would remove, remove nothing")
	asJSON := fs.Bool("json", false, "print the dry run as JSON")
	all := fs.Bool("all", false, "without --valid or --cri: treat every attachment as stale")
	var valid, cri stringList
	fs.Var(&valid, "valid", "a valid attachment CONTAINERID/IFNAME (repeatable, or comma-separated)")
	fs.Var(&cri, "cri", "a CRI socket whose pod sandboxes are the valid attachments (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if len(valid) == 0 && len(cri) == 0 && !*all && !*dry {
		// cnitool gc without attachments removes every pod of the network.
		return usageError{"no valid attachments given: every pod of every network would be removed; pass --valid ID/IFNAME, --cri SOCKET (e.g. /run/containerd/containerd.sock), or --all if that is what you want (try --dry-run first)"}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	nets, err := nd.networks(*only)
	if err != nil {
		return err
	}
	var gcAtt []types.GCAttachment
	for _, v := range valid {
		id, ifn, ok := strings.Cut(v, "/")
		if !ok || id == "" || ifn == "" {
			return usageError{fmt.Sprintf("--valid %q: want CONTAINERID/IFNAME, e.g. 0123abcd/eth0", v)}
		}
		gcAtt = append(gcAtt, types.GCAttachment{ContainerID: id, IfName: ifn})
	}
	sandboxes := map[string]bool{}
	for _, sock := range cri {
		ids, err := criSandboxes(ctx, sock)
		if err != nil {
			return err
		}
		for _, id := range ids {
			sandboxes[id] = true
		}
	}
	if *dry {
		plan := GCPlan{Removals: []Removal{}}
		for _, n := range nets {
			s, err := nd.readState(ctx, n)
			if err != nil {
				return fmt.Errorf("network %s: %w", n.List.Name, err)
			}
			p, err := planGC(ctx, n.List, s, withSandboxes(gcAtt, s, sandboxes))
			if err != nil {
				return fmt.Errorf("network %s: %w", n.List.Name, err)
			}
			plan.Removals = append(plan.Removals, p.Removals...)
			plan.Notes = append(plan.Notes, p.Notes...)
		}
		if *asJSON {
			enc := json.NewEncoder(out)
			enc.SetIndent("", "  ")
			return enc.Encode(plan)
		}
		printPlan(out, plan)
		return nil
	}
	c := libcni.NewCNIConfigWithCacheDir(nd.binDirs, nd.cacheDir, nil)
	var errs []error
	for _, n := range nets {
		s, err := nd.readState(ctx, n)
		if err != nil && len(sandboxes) > 0 {
			errs = append(errs, fmt.Errorf("network %s: reading which attachments the sandboxes have: %w", n.List.Name, err))
			continue
		}
		att := withSandboxes(gcAtt, s, sandboxes)
		if err := c.GCNetworkList(ctx, n.List, &libcni.GCArgs{ValidAttachments: att}); err != nil {
			errs = append(errs, fmt.Errorf("GC of network %s: %w", n.List.Name, err))
			continue
		}
		fmt.Fprintf(out, "network %s: GC done with %d valid attachments\n", n.List.Name, len(att))
	}
	return errors.Join(errs...)
}

// withSandboxes adds, for every CRI sandbox, each attachment of the network whose
// container ID is the sandbox's (CRI does not say which interfaces a sandbox has).
func withSandboxes(valid []types.GCAttachment, s *netState, sandboxes map[string]bool) []types.GCAttachment {
	out := append([]types.GCAttachment{}, valid...)
	if s == nil {
		return out
	}
	for _, o := range s.everyOwner() {
		if sandboxes[o.ContainerID] {
			out = append(out, types.GCAttachment{ContainerID: o.ContainerID, IfName: o.IfName})
		}
	}
	return out
}

// planGC is what libcni's GCNetworkList and then each plugin's GC remove, computed by
// the plugins' own planning functions on the state they read.
func planGC(ctx context.Context, l *libcni.NetworkConfigList, s *netState, att []types.GCAttachment) (GCPlan, error) {
	var p GCPlan
	if l.DisableGC {
		p.Notes = append(p.Notes, l.Name+": disableGC is set; GC does nothing")
		return p, nil
	}
	keep := cniplumb.Owners{}
	isValid := map[types.GCAttachment]bool{}
	for _, a := range att {
		keep[cniplumb.Owner{Network: l.Name, ContainerID: a.ContainerID, IfName: a.IfName}] = true
		isValid[a] = true
	}
	for _, a := range s.Cached {
		if !isValid[types.GCAttachment{ContainerID: a.ContainerID, IfName: a.IfName}] {
			p.add(l.Name, "libcni", "del", a.ContainerID+"/"+a.IfName, l.Name+"/"+a.ContainerID+"/"+a.IfName)
		}
	}
	if ok, _ := version.GreaterThanOrEqualTo(l.CNIVersion, "1.1.0"); !ok {
		p.Notes = append(p.Notes, fmt.Sprintf("%s: cniVersion %s: libcni calls the plugins' GC only from 1.1.0; only the DELs above run", l.Name, l.CNIVersion))
		return p, nil
	}
	var errs []error
	for _, pl := range l.Plugins {
		typ := pl.Network.Type
		switch typ {
		case "bridge":
			if pl.Network.IPAM.Type == "host-local" {
				errs = append(errs, p.planLeases(ctx, l, s, att))
			} else if pl.Network.IPAM.Type != "" {
				p.Notes = append(p.Notes, fmt.Sprintf("%s: IPAM plugin %s: its GC is not podwire's to preview", l.Name, pl.Network.IPAM.Type))
			}
			objs, err := netfilter.PlanGCMasq(ctx, l.Name, keep)
			errs = append(errs, err)
			p.addObjects(l.Name, typ, objs, s)
			// bridge's GC takes the "bridge" key as given (no cni0 default) to tell
			// which macspoofchk rules are this network's.
			var m map[string]any
			_ = json.Unmarshal(pl.Bytes, &m)
			ours := link.OnBridgeOrGone(ctx, link.NewNetlink(), str(m, "bridge"))
			objs, err = netfilter.PlanGCMacSpoof(keep, ours)
			errs = append(errs, err)
			p.addObjects(l.Name, typ, objs, s)
		case "portmap":
			errs = append(errs, p.planHostPorts(ctx, l, pl.Bytes, s, keep))
		case "bandwidth":
			ifbs, err := tc.NewNetlink(nil).IFBs(ctx)
			errs = append(errs, err)
			for _, r := range tc.PlanGC(ifbs, l.Name, keep) {
				for _, i := range r.IFBs {
					p.add(l.Name, typ, "ifb", i, ifbOwner(s, i))
				}
			}
		case "loopback":
		default:
			p.Notes = append(p.Notes, fmt.Sprintf("%s: plugin %s is not podwire's: what its GC removes is not listed", l.Name, typ))
		}
	}
	return p, errors.Join(errs...)
}

func (p *GCPlan) add(network, plugin, kind, name, owner string) {
	p.Removals = append(p.Removals, Removal{Network: network, Plugin: plugin, Kind: kind, Name: name, Owner: owner})
}

// addObjects lists objects with their owner: as the rules name it, else the known
// attachment whose names they carry.
func (p *GCPlan) addObjects(network, plugin string, objs []netfilter.Object, s *netState) {
	owners := s.everyOwner()
	for _, o := range objs {
		owner := ""
		if o.Owner != (netfilter.Owner{}) {
			owner = o.Owner.Key()
		}
		for _, ow := range owners {
			if owner == "" && o.Of(ow) {
				owner = ow.Key()
			}
		}
		p.add(network, plugin, o.What, o.Backend+" "+o.Key, owner)
	}
}

// planLeases is host-local's GC (through bridge): ipam.PlanGC in a transaction.
func (p *GCPlan) planLeases(ctx context.Context, l *libcni.NetworkConfigList, s *netState, att []types.GCAttachment) error {
	st, err := leaseStore(l)
	if err != nil || st == nil {
		return err
	}
	var valid []ipam.Owner
	for _, a := range att {
		valid = append(valid, ipam.Owner{ContainerID: a.ContainerID, IfName: a.IfName})
	}
	return readLeases(ctx, st, func(tx ipam.Tx) error {
		stale, err := ipam.PlanGC(tx, valid)
		for _, le := range stale {
			p.add(l.Name, "host-local", "lease", le.IP.String(), l.Name+"/"+le.Owner.ContainerID+"/"+le.Owner.IfName)
		}
		return err
	})
}

// planHostPorts is portmap's GC: each backend's GC in the backends portstate.GCKinds
// picks, then the stale markers.
func (p *GCPlan) planHostPorts(ctx context.Context, l *libcni.NetworkConfigList, conf []byte, s *netState, keep cniplumb.Owners) error {
	var raw struct {
		Backend string `json:"backend"`
	}
	_ = json.Unmarshal(conf, &raw)
	want, err := netfilter.ParseKind("backend", raw.Backend)
	if err != nil {
		want = netfilter.Auto // portmap's teardown reads leniently too
	}
	configured := netfilter.Kind("")
	if _, k, err := netfilter.OpenHostPorts(want); err == nil {
		configured = k
	}
	var errs []error
	for _, k := range portstate.GCKinds(configured, s.Markers) {
		if _, _, err := netfilter.OpenHostPorts(k); cniplumb.Code(err) == cniplumb.CodeNotAvailable {
			continue
		}
		objs, err := netfilter.PlanGCHostPorts(ctx, k, l.Name, keep)
		errs = append(errs, err)
		p.addObjects(l.Name, "portmap", objs, s)
	}
	for _, m := range portstate.PlanGC(s.Markers, l.Name, keep) {
		p.add(l.Name, "portmap", "portmap-marker", m.File, m.Owner)
	}
	return errors.Join(errs...)
}

func ifbOwner(s *netState, name string) string {
	for _, i := range s.IFBs {
		if i.Name == name {
			if o, ok := tc.OwnerOfAlias(i.Alias); ok {
				return o.Key()
			}
		}
	}
	return ""
}

func printPlan(out io.Writer, p GCPlan) {
	if len(p.Removals) == 0 {
		fmt.Fprintln(out, "GC would remove nothing")
	} else {
		fmt.Fprintln(out, "GC would remove:")
		w := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
		fmt.Fprintln(w, "NETWORK\tPLUGIN\tKIND\tNAME\tOWNER")
		for _, r := range p.Removals {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", r.Network, r.Plugin, r.Kind, r.Name, r.Owner)
		}
		w.Flush()
	}
	for _, n := range p.Notes {
		fmt.Fprintln(out, "note:", n)
	}
	fmt.Fprintln(os.Stderr, "nothing was removed (dry run)")
}
