// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/podwire/podwire/integration/nodestate"
	"github.com/podwire/podwire/integration/nstest"
)

// cliNode is a test network in a conf dir of its own, with a libcni client whose cache
// the CLI reads.
type cliNode struct {
	h       *nstest.H
	list    *libcni.NetworkConfigList
	cni     *libcni.CNIConfig
	args    []string // --conf-dir, --bin-dir, --cache-dir
	confDir string
}

func newCLINode(t *testing.T, h *nstest.H, text string) *cliNode {
	confDir, cacheDir := t.TempDir(), t.TempDir()
	text = strings.ReplaceAll(strings.ReplaceAll(text, "@PREFIX@", h.Prefix), "@DATADIR@", h.DataDir)
	if err := os.WriteFile(filepath.Join(confDir, "10-test.conflist"), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return &cliNode{h: h, list: h.Conflist(text), cni: libcni.NewCNIConfigWithCacheDir([]string{h.BinDir}, cacheDir, nil),
		args: []string{"--conf-dir", confDir, "--bin-dir", h.BinDir, "--cache-dir", cacheDir}, confDir: confDir}
}

func (n *cliNode) inspect(t *testing.T) cliInventory {
	var inv cliInventory
	cliJSON(t, n.h.HostNS.Path(), &inv, append([]string{"inspect", "--json"}, n.args...)...)
	return inv
}

func (n *cliNode) add(t *testing.T, id string, opts ...func(*libcni.RuntimeConf)) (*current.Result, ns.NetNS) {
	t.Helper()
	pod := n.h.NewPod()
	rt := n.h.RT(pod, "eth0", append(opts, nstest.WithContainerID(id))...)
	r, err := n.h.AddWith(n.cni, n.list, rt)
	if err != nil {
		t.Fatalf("ADD %s: %v", id, err)
	}
	t.Cleanup(func() { _ = n.h.DelWith(n.cni, n.list, rt) })
	return r, pod
}

// cliConf has @BACKEND@ for both netfilter users' backend ("" picks as the
// reference does: iptables when installed).
const cliConf = `{"cniVersion":"1.1.0","name":"@PREFIX@net","plugins":[
 {"type":"bridge","bridge":"@PREFIX@br","isGateway":true,"ipMasq":true,"ipMasqBackend":"@BACKEND@","macspoofchk":true,
  "ipam":{"type":"host-local","ranges":[[{"subnet":"10.57.0.0/24"}]],"dataDir":"@DATADIR@"}},
 {"type":"portmap","backend":"@BACKEND@","capabilities":{"portMappings":true}},
 {"type":"bandwidth","capabilities":{"bandwidth":true}}]}`

// TestPodwireInspectAndGC makes real state through libcni (pods with hostPorts and
// shaping, a plain pod, a pod whose netns is gone, an orphaned veth on the bridge) and
// requires inspect --json to list exactly that, gc --dry-run to change nothing, and a
// following GC to remove exactly what the dry run listed.
func TestPodwireInspectAndGC(t *testing.T) {
	for _, backend := range []string{"iptables", "nftables"} {
		t.Run(backend, func(t *testing.T) { testInspectAndGC(t, backend) })
	}
}

func testInspectAndGC(t *testing.T, backend string) {
	h := nstest.New(t)
	n := newCLINode(t, h, strings.ReplaceAll(cliConf, "@BACKEND@", backend))
	id := func(s string) string { return h.Prefix + "-" + s }
	ra, _ := n.add(t, id("a"), mergeCaps(pmMap("tcp:18080:80"), withBandwidth(10_000_000, 10_000_000, containerdBurst)))
	rb, _ := n.add(t, id("b"))
	rc, _ := n.add(t, id("c"), mergeCaps(pmMap("tcp:18081:80", "udp:18081:53"), withBandwidth(20_000_000, 30_000_000, containerdBurst)))
	rd, podD := n.add(t, id("d"))
	// d's sandbox dies without a DEL: its lease, cached result and masquerade stay.
	// The kernel removes its veth pair asynchronously; wait for that.
	h.DeletePod(podD)
	vethD := hostVeth(t, h, rd)
	for i := 0; slices.Contains(linkNames(h, "master", h.Name("br")), vethD); i++ {
		if i == 100 {
			t.Fatalf("veth %s of the deleted pod d is still there after 10 s", vethD)
		}
		time.Sleep(100 * time.Millisecond)
	}
	orphan := h.Name("orph")
	h.Run(h.HostNS, "ip", "link", "add", orphan, "type", "veth", "peer", "name", h.Name("orq"))
	h.Run(h.HostNS, "ip", "link", "set", orphan, "master", h.Name("br"))

	inv := n.inspect(t)
	rows := map[string]cliAttachment{}
	for _, a := range inv.Attachments {
		rows[a.ContainerID] = a
		if a.IfName != "eth0" || a.Network != h.Prefix+"net" {
			t.Errorf("row %+v: want network %snet, eth0", a, h.Prefix)
		}
	}
	if len(rows) != 4 || len(inv.Attachments) != 4 {
		t.Fatalf("inspect lists %d attachments, want a, b, c, d:\n%+v", len(inv.Attachments), inv.Attachments)
	}
	for name, r := range map[string]*current.Result{"a": ra, "b": rb, "c": rc} {
		a := rows[id(name)]
		if want := resultAddrs(r); !slices.Equal(a.Addresses, want) {
			t.Errorf("%s: addresses %v, ADD gave %v", name, a.Addresses, want)
		}
		if a.HostVeth != hostVeth(t, h, r) || len(a.Masquerade) == 0 || len(a.MacSpoof) == 0 || len(a.Problems) != 0 {
			t.Errorf("%s: host veth %q (ADD made %s), masquerade %v, macspoof %v, problems %v", name, a.HostVeth, hostVeth(t, h, r), a.Masquerade, a.MacSpoof, a.Problems)
		}
		shaped := name != "b"
		if (a.IFB != "") != shaped || a.IFB != ifbOf(r) || (len(a.HostPorts) > 0) != shaped || (a.PortmapMarker != "") != shaped || (len(a.Qdiscs) > 0) != shaped {
			t.Errorf("%s: ifb %q (ADD made %q), hostPorts %v, marker %q, qdiscs %v", name, a.IFB, ifbOf(r), a.HostPorts, a.PortmapMarker, a.Qdiscs)
		}
		for _, hp := range append(a.HostPorts, a.Masquerade...) {
			if !strings.HasPrefix(hp.Backend, backend) {
				t.Errorf("%s: rules in %s, the conflist asks for %s", name, hp.Backend, backend)
			}
		}
		for _, hp := range a.HostPorts {
			if hp.Backend == "" || !strings.Contains(strings.Join(hp.Rules, "\n"), map[string]string{"a": "18080", "c": "18081"}[name]) {
				t.Errorf("%s: hostPorts %+v do not show its port", name, hp)
			}
		}
	}
	if d := rows[id("d")]; len(d.Addresses) != 1 || d.HostVeth != "" || !strings.Contains(strings.Join(d.Problems, ";"), "gone") {
		t.Errorf("d (sandbox gone): %+v; want its lease, no host veth and the problem", d)
	}
	// Exactly what exists: the lease files, IFBs and bridge ports on the node.
	var files, ifbs, veths []string
	for _, a := range inv.Attachments {
		files = append(files, a.LeaseFiles...)
		if a.IFB != "" {
			ifbs = append(ifbs, a.IFB)
		}
		if a.HostVeth != "" {
			veths = append(veths, a.HostVeth)
		}
	}
	requireSame(t, "lease files", files, leaseFilesIn(t, filepath.Join(h.DataDir, h.Prefix+"net")))
	requireSame(t, "IFBs", ifbs, linkNames(h, "type", "ifb"))
	var kinds []string
	for _, o := range inv.Orphans {
		kinds = append(kinds, o.Kind+" "+o.Name)
		if o.Kind == "veth" {
			veths = append(veths, o.Name)
		}
	}
	requireSame(t, "bridge ports", veths, linkNames(h, "master", h.Name("br")))
	leaseD := filepath.Join(h.DataDir, h.Prefix+"net", rows[id("d")].Addresses[0])
	requireSame(t, "orphans", kinds, []string{"veth " + orphan, "lease " + leaseD})

	// The table for people shows the same rows.
	text, errs, code := runCLI(t, h.HostNS.Path(), append([]string{"inspect"}, n.args...)...)
	if code != 0 || !strings.Contains(text, id("a")[:min(13, len(id("a")))]) || !strings.Contains(text, orphan) {
		t.Errorf("inspect: exit %d\n%s%s", code, text, errs)
	}
	t.Logf("podwire inspect:\n%s", text)

	// The dry run changes nothing and lists c's and d's objects, nothing of a's or b's.
	// (IPv6 link-local addresses finishing DAD would change the snapshot on their own.)
	for i := 0; strings.TrimSpace(h.Run(h.HostNS, "ip", "-6", "-o", "addr", "show", "tentative")) != ""; i++ {
		if i == 100 {
			t.Fatal("IPv6 addresses still tentative after 10 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	before := h.Snapshot()
	valid := []string{"--valid", id("a") + "/eth0", "--valid", id("b") + "/eth0"}
	var plan cliPlan
	cliJSON(t, h.HostNS.Path(), &plan, append(append([]string{"gc", "--dry-run", "--json"}, n.args...), valid...)...)
	h.RequireUnchanged(before)
	text, _, _ = runCLI(t, h.HostNS.Path(), append(append([]string{"gc", "--dry-run"}, n.args...), valid...)...)
	t.Logf("podwire gc --dry-run:\n%s", text)
	got := map[string]bool{}
	for _, r := range plan.Removals {
		got[r.Kind] = true
		if !strings.Contains(r.Owner, id("c")) && !strings.Contains(r.Owner, id("d")) {
			t.Errorf("dry run removes %+v, not of c or d", r)
		}
	}
	for _, k := range []string{"del", "lease", "masquerade", "macspoof", "hostports", "portmap-marker", "ifb"} {
		if !got[k] {
			t.Errorf("dry run lists no %s:\n%+v", k, plan.Removals)
		}
	}

	// Without valid attachments the real GC refuses (cnitool's would remove every pod).
	if out, errs, code := runCLI(t, h.HostNS.Path(), append([]string{"gc"}, n.args...)...); code != 2 || !strings.Contains(errs, "--all") {
		t.Errorf("gc without valid attachments: exit %d, want 2 and a hint at --valid/--cri/--all\n%s%s", code, out, errs)
	}
	h.RequireUnchanged(before)

	// A real GC removes exactly that: every listed object goes, every other stays.
	out, errs, code := runCLI(t, h.HostNS.Path(), append(append([]string{"gc"}, n.args...), valid...)...)
	if code != 0 {
		t.Fatalf("podwire gc: exit %d\n%s\n%s", code, out, errs)
	}
	after := n.inspect(t)
	var again cliPlan
	cliJSON(t, h.HostNS.Path(), &again, append(append([]string{"gc", "--dry-run", "--json"}, n.args...), valid...)...)
	if len(again.Removals) != 0 {
		t.Errorf("after GC, a dry run still lists %+v", again.Removals)
	}
	for _, a := range after.Attachments {
		if a.ContainerID != id("a") && a.ContainerID != id("b") {
			t.Errorf("after GC, %s is still there: %+v", a.ContainerID, a)
		}
	}
	for _, a := range inv.Attachments {
		if a.ContainerID == id("a") || a.ContainerID == id("b") {
			if b := findRow(after, a.ContainerID); b == nil || !sameRow(*b, a) {
				t.Errorf("GC changed valid attachment %s:\nbefore %+v\nafter  %+v", a.ContainerID, a, b)
			}
		}
	}
	var left []string
	for _, o := range after.Orphans {
		left = append(left, o.Kind+" "+o.Name)
	}
	requireSame(t, "orphans after GC", left, []string{"veth " + orphan})
	// nft rule text (as nodestate lists it) carries no owner; c's rules name its port.
	requireRemovedExactly(t, before, h.Snapshot(), plan, inv, "18081")
}

// requireRemovedExactly checks every line of node state GC removed against the dry
// run: each must name something of an attachment the dry run listed.
func requireRemovedExactly(t *testing.T, before, after nodestate.Snapshot, plan cliPlan, inv cliInventory, staleTokens ...string) {
	t.Helper()
	stale := map[string]bool{}
	for _, r := range plan.Removals {
		if f := strings.Split(r.Owner, "/"); len(f) == 3 {
			stale[f[1]] = true
		}
	}
	tokens := staleTokens
	for _, a := range inv.Attachments {
		if !stale[a.ContainerID] {
			continue
		}
		tokens = append(tokens, a.ContainerID, a.HostVeth, a.IFB)
		tokens = append(tokens, a.Addresses...)
		for _, r := range slices.Concat(a.HostPorts, a.Masquerade, a.MacSpoof) {
			tokens = append(tokens, r.Key)
			for _, w := range strings.Fields(strings.Join(r.Rules, " ")) {
				if strings.HasPrefix(w, "CNI-") && w != "CNI-HOSTPORT-DNAT" && w != "CNI-HOSTPORT-MASQ" {
					tokens = append(tokens, w) // the attachment's own chains
				}
			}
		}
	}
	for _, r := range plan.Removals {
		tokens = append(tokens, lastField(r.Name))
	}
	for _, line := range strings.Split(nodestate.Diff(before, after), "\n") {
		if !strings.HasPrefix(line, "-") {
			continue
		}
		ok := false
		for _, tk := range tokens {
			ok = ok || tk != "" && strings.Contains(line, tk)
		}
		if !ok {
			t.Errorf("GC removed %q, which the dry run did not list (removals %+v)", line, plan.Removals)
		}
	}
}

func lastField(s string) string {
	f := strings.Fields(s)
	if len(f) == 0 {
		return ""
	}
	return filepath.Base(f[len(f)-1])
}

// mergeCaps applies several capability options to one RuntimeConf (each of them
// replaces CapabilityArgs on its own).
func mergeCaps(opts ...func(*libcni.RuntimeConf)) func(*libcni.RuntimeConf) {
	return func(rt *libcni.RuntimeConf) {
		caps := map[string]any{}
		for _, o := range opts {
			var one libcni.RuntimeConf
			o(&one)
			for k, v := range one.CapabilityArgs {
				caps[k] = v
			}
		}
		rt.CapabilityArgs = caps
	}
}

func findRow(inv cliInventory, id string) *cliAttachment {
	for i := range inv.Attachments {
		if inv.Attachments[i].ContainerID == id {
			return &inv.Attachments[i]
		}
	}
	return nil
}

func sameRow(a, b cliAttachment) bool {
	return slices.Equal(a.Addresses, b.Addresses) && a.HostVeth == b.HostVeth && a.IFB == b.IFB &&
		len(a.HostPorts) == len(b.HostPorts) && len(a.Masquerade) == len(b.Masquerade) && a.PortmapMarker == b.PortmapMarker
}

func resultAddrs(r *current.Result) []string {
	var out []string
	for _, ip := range r.IPs {
		out = append(out, ip.Address.IP.String())
	}
	return out
}

func requireSame(t *testing.T, what string, got, want []string) {
	t.Helper()
	g, w := slices.Clone(got), slices.Clone(want)
	sort.Strings(g)
	sort.Strings(w)
	if !slices.Equal(g, w) {
		t.Errorf("%s: inspect says %v, the node has %v", what, g, w)
	}
}

func leaseFilesIn(t *testing.T, dir string) []string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if e.Type().IsRegular() && e.Name() != "lock" && !strings.HasPrefix(e.Name(), "last_reserved_ip") && !strings.HasPrefix(e.Name(), ".") {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	return out
}

// linkNames lists the host netns's links matching `ip link show <filter...>`.
func linkNames(h *nstest.H, filter ...string) []string {
	out := h.Run(h.HostNS, "ip", append([]string{"-o", "link", "show"}, filter...)...)
	var names []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) > 1 {
			name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
			names = append(names, name)
		}
	}
	return names
}
