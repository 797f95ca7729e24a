// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/link"
	"github.com/podwire/podwire/pkg/netfilter"
	"github.com/podwire/podwire/pkg/tc"
)

// Attachment is one row of inspect: everything podwire holds for one
// network/container/interface.
type Attachment struct {
	Network       string   `json:"network"`
	ContainerID   string   `json:"containerID"`
	IfName        string   `json:"ifName"`
	Addresses     []string `json:"addresses,omitempty"`
	LeaseFiles    []string `json:"leaseFiles,omitempty"`
	HostVeth      string   `json:"hostVeth,omitempty"` // present on the node; "" when gone
	NetNS         string   `json:"netns,omitempty"`    // from libcni's cache
	HostPorts     []Rules  `json:"hostPorts,omitempty"`
	PortmapMarker string   `json:"portmapMarker,omitempty"`
	Masquerade    []Rules  `json:"masquerade,omitempty"`
	MacSpoof      []Rules  `json:"macspoof,omitempty"`
	Qdiscs        []string `json:"qdiscs,omitempty"`
	IFB           string   `json:"ifb,omitempty"`
	Problems      []string `json:"problems,omitempty"`
}

// Rules is one backend's rules of an attachment.
type Rules struct {
	Backend string   `json:"backend"`
	Key     string   `json:"key"`
	Rules   []string `json:"rules"`
}

// Orphan is an object no attachment accounts for, or a lease whose pod is gone.
type Orphan struct {
	Network string `json:"network"`
	Kind    string `json:"kind"` // veth, ifb, masquerade, hostports, portmap-marker, lease
	Name    string `json:"name"`
	Detail  string `json:"detail"`
}

// Inventory is inspect's whole output.
type Inventory struct {
	Attachments []Attachment `json:"attachments"`
	Orphans     []Orphan     `json:"orphans"`
}

func runInspect(args []string, out io.Writer) error {
	fs := newFlags("inspect")
	nd := nodeFlags(fs)
	only := fs.String("network", "", "only this network")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	nets, err := nd.networks(*only)
	if err != nil {
		return err
	}
	ctx := context.Background()
	inv := Inventory{Attachments: []Attachment{}, Orphans: []Orphan{}}
	for _, n := range nets {
		s, err := nd.readState(ctx, n)
		if err != nil {
			fmt.Fprintf(os.Stderr, "podwire inspect: network %s: %v\n", n.List.Name, err)
		}
		a, o := s.inventory(ctx)
		inv.Attachments = append(inv.Attachments, a...)
		inv.Orphans = append(inv.Orphans, o...)
	}
	if *asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(inv)
	}
	printInventory(out, inv)
	return nil
}

// inventory joins the state into rows: an attachment is an owner with a lease or a
// cached ADD result; every other object is an orphan, and so is a lease whose veth is
// gone.
func (s *netState) inventory(ctx context.Context) ([]Attachment, []Orphan) {
	var rows []Attachment
	var orphans []Orphan
	usedVeth := map[string]bool{}
	usedIFB := map[string]bool{}
	usedMarker := map[string]bool{}
	usedObj := map[string]bool{}
	ports := map[string]bool{}
	for _, p := range s.Ports {
		ports[p] = true
	}
	tcb := tc.NewNetlink(nil)
	for _, o := range s.owners() {
		a := Attachment{Network: o.Network, ContainerID: o.ContainerID, IfName: o.IfName}
		for _, l := range s.Leases {
			if l.Owner.ContainerID == o.ContainerID && l.Owner.IfName == o.IfName {
				a.Addresses = append(a.Addresses, l.IP.String())
				a.LeaseFiles = append(a.LeaseFiles, filepath.Join(s.LeaseDir, l.IP.String()))
			}
		}
		for _, c := range s.Cached {
			if c.ContainerID == o.ContainerID && c.IfName == o.IfName {
				a.NetNS = c.NetNS
				if _, err := os.Stat(c.NetNS); c.NetNS != "" && err != nil {
					a.Problems = append(a.Problems, "netns "+c.NetNS+" is gone")
				}
			}
		}
		if veth, err := link.HostVethName(o); err == nil && s.Bridge != "" {
			if _, err := link.NewNetlink().Inspect(ctx, link.Ref{Name: veth}); err == nil {
				a.HostVeth, usedVeth[veth] = veth, true
			} else {
				a.Problems = append(a.Problems, "host veth "+veth+" is gone")
			}
		}
		for _, i := range s.IFBs {
			if tc.OwnedBy(i.Alias, o) {
				a.IFB, usedIFB[i.Name] = i.Name, true
			}
		}
		if a.HostVeth != "" || a.IFB != "" {
			a.Qdiscs = qdiscs(ctx, tcb, a.HostVeth, a.IFB)
		}
		for _, m := range s.Markers {
			if m.ID == netfilter.IDOf(o) {
				a.PortmapMarker, usedMarker[m.File] = m.File, true
			}
		}
		a.Masquerade = rulesOf(s.Masq, o, usedObj)
		a.HostPorts = rulesOf(s.HostPort, o, usedObj)
		a.MacSpoof = rulesOf(s.MacSpoof, o, usedObj)
		if len(a.Addresses) == 0 && s.LeaseDir != "" {
			a.Problems = append(a.Problems, "no lease in "+s.LeaseDir)
		}
		if len(a.Problems) > 0 && len(a.Addresses) > 0 {
			orphans = append(orphans, Orphan{s.Name, "lease", strings.Join(a.LeaseFiles, " "),
				fmt.Sprintf("%s: %s", o, strings.Join(a.Problems, "; "))})
		}
		rows = append(rows, a)
	}
	for _, p := range s.Ports {
		if !usedVeth[p] {
			orphans = append(orphans, Orphan{s.Name, "veth", p, "a port of bridge " + s.Bridge + " that no lease or cached attachment of " + s.Name + " names"})
		}
	}
	for _, i := range s.IFBs {
		if !usedIFB[i.Name] {
			orphans = append(orphans, Orphan{s.Name, "ifb", i.Name, "alias " + i.Alias})
		}
	}
	for _, m := range s.Markers {
		if !usedMarker[m.File] {
			orphans = append(orphans, Orphan{s.Name, "portmap-marker", m.File, m.Marker.String()})
		}
	}
	for _, o := range slices.Concat(s.Masq, s.HostPort, s.MacSpoof) {
		if !usedObj[o.String()] {
			orphans = append(orphans, Orphan{s.Name, o.What, o.Backend + " " + o.Key, ownerText(o.Owner)})
		}
	}
	slices.SortFunc(rows, func(a, b Attachment) int {
		return strings.Compare(a.ContainerID+"/"+a.IfName, b.ContainerID+"/"+b.IfName)
	})
	return rows, orphans
}

func ownerText(o netfilter.Owner) string {
	if o == (netfilter.Owner{}) {
		return "owner not named in the rules"
	}
	return "of " + o.Key()
}

func rulesOf(objs []netfilter.Object, o cniplumb.Owner, used map[string]bool) []Rules {
	var out []Rules
	for _, ob := range objs {
		if ob.Of(o) {
			used[ob.String()] = true
			out = append(out, Rules{Backend: ob.Backend, Key: ob.Key, Rules: ob.Rules})
		}
	}
	return out
}

// qdiscs describes podwire's shaping on the host veth and the IFB.
func qdiscs(ctx context.Context, b tc.Backend, veth, ifb string) []string {
	st, err := b.Observe(ctx, veth, ifb)
	if err != nil {
		return []string{"error: " + err.Error()}
	}
	var out []string
	if d := st.Dev; d != nil {
		if d.Root != nil {
			out = append(out, fmt.Sprintf("%s root tbf %+v", veth, *d.Root))
		} else if d.RootOther != "" {
			out = append(out, veth+" root "+d.RootOther+" (not podwire's)")
		}
		if d.Hook != "" {
			out = append(out, veth+" "+d.Hook)
		}
		for _, r := range d.Redirects {
			out = append(out, fmt.Sprintf("%s filter prio %d redirect to %s", veth, r.Prio, r.Target))
		}
	}
	if i := st.IFB; i != nil && i.Root != nil {
		out = append(out, fmt.Sprintf("%s root tbf %+v", ifb, *i.Root))
	}
	return out
}

func printInventory(out io.Writer, inv Inventory) {
	w := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NETWORK\tCONTAINER\tIF\tADDRESSES\tHOST VETH\tHOSTPORTS\tMASQ\tIFB\tPROBLEMS")
	dash := func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	}
	for _, a := range inv.Attachments {
		var hp, mq []string
		for _, r := range a.HostPorts {
			hp = append(hp, fmt.Sprintf("%s(%d rules)", r.Backend, len(r.Rules)))
		}
		for _, r := range a.Masquerade {
			mq = append(mq, r.Backend)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.Network, shortID(a.ContainerID), a.IfName,
			dash(strings.Join(a.Addresses, ",")), dash(a.HostVeth), dash(strings.Join(hp, ",")), dash(strings.Join(mq, ",")),
			dash(a.IFB), dash(strings.Join(a.Problems, "; ")))
	}
	w.Flush()
	if len(inv.Orphans) > 0 {
		fmt.Fprintln(out, "\nORPHANS (run podwire gc --dry-run to see what GC removes)")
		w = tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
		for _, o := range inv.Orphans {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", o.Network, o.Kind, o.Name, o.Detail)
		}
		w.Flush()
	}
	fmt.Fprintln(out, "\nleases, rules and qdiscs in full: podwire inspect --json")
}

func shortID(id string) string {
	if len(id) > 16 {
		return id[:13] + "..."
	}
	return id
}
