// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/podwire/podwire/integration/nstest"
	"github.com/podwire/podwire/internal/testenv"
	"github.com/podwire/podwire/pkg/netfilter"
)

// These tests swap binaries under live pods: pods made by the reference bridge
// (containernetworking/plugins v1.10.0, with its host-local) are deleted by podwire's
// bridge and the other way round, for both ipMasq backends, and the node must come
// back exactly as before. Both binaries share one libcni cache, as they would on a
// node where only the files in the CNI bin dir change.

// referencePlugins returns a directory holding the reference bridge and host-local.
func referencePlugins(t *testing.T) string { return referenceDir(t, "bridge", "host-local") }

// compat is one test's pair of libcni clients sharing a cache.
type compat struct {
	h         *nstest.H
	ours, ref *libcni.CNIConfig
}

func newCompat(t *testing.T) *compat {
	refDir := referencePlugins(t)
	h := nstest.New(t)
	cache := filepath.Join(t.TempDir(), "cache")
	return &compat{h: h,
		ours: libcni.NewCNIConfigWithCacheDir([]string{h.BinDir}, cache, nil),
		ref:  libcni.NewCNIConfigWithCacheDir([]string{refDir}, cache, nil)}
}

// compatConf is a dual-stack bridge+host-local conflist; backend "" leaves
// ipMasqBackend out (each plugin's default).
func compatConf(h *nstest.H, backend string) *libcni.NetworkConfigList {
	extra := `"isGateway":true,"isDefaultGateway":true,"ipMasq":true`
	if backend != "" {
		extra += fmt.Sprintf(`,"ipMasqBackend":%q`, backend)
	}
	return bridgeConf(h, extra, `[[{"subnet":"10.24.0.0/24"}],[{"subnet":"fd00:24::/64"}]]`)
}

func (c *compat) add(t *testing.T, who *libcni.CNIConfig, list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) *current.Result {
	t.Helper()
	r, err := c.h.AddWith(who, list, rt)
	if err != nil {
		t.Fatalf("ADD %s by %s: %v", rt.ContainerID, c.name(who), err)
	}
	return r
}

func (c *compat) del(t *testing.T, who *libcni.CNIConfig, list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) {
	t.Helper()
	if err := c.h.DelWith(who, list, rt); err != nil {
		t.Fatalf("DEL %s by %s: %v", rt.ContainerID, c.name(who), err)
	}
}

func (c *compat) name(who *libcni.CNIConfig) string {
	if who == c.ref {
		return "the reference"
	}
	return "podwire"
}

func (c *compat) check(t *testing.T, list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) {
	t.Helper()
	if err := c.h.InHost(func() error { return c.ours.CheckNetworkList(context.Background(), list, rt) }); err != nil {
		t.Errorf("podwire CHECK of %s: %v", rt.ContainerID, err)
	}
}

func (c *compat) gc(t *testing.T, list *libcni.NetworkConfigList, valid ...*libcni.RuntimeConf) {
	t.Helper()
	var keep []types.GCAttachment
	for _, rt := range valid {
		keep = append(keep, types.GCAttachment{ContainerID: rt.ContainerID, IfName: rt.IfName})
	}
	if err := c.h.InHost(func() error {
		return c.ours.GCNetworkList(context.Background(), list, &libcni.GCArgs{ValidAttachments: keep})
	}); err != nil {
		t.Fatalf("podwire GC: %v", err)
	}
}

var (
	nftHandleRe  = regexp.MustCompile(` # handle \d+`)
	nftCounterRe = regexp.MustCompile(`counter packets \d+ bytes \d+ `)
)

// masqLayout is what the node shows of ipMasq in both layouts, with r's addresses
// replaced by placeholders so two pods' rules compare equal. Standalone object
// comments are left out: the reference names its table and masq_checks chain in a
// comment, which google/nftables cannot write (rule comments are kept).
func (c *compat) masqLayout(t *testing.T, r *current.Result) string {
	t.Helper()
	ipt := c.h.Run(c.h.HostNS, "sh", "-c", "iptables-save -t nat; ip6tables-save -t nat")
	nft := c.h.Run(c.h.HostNS, "sh", "-c", "nft list table inet "+"cni_plugins_masquerade 2>/dev/null; true")
	var out []string
	for _, l := range strings.Split(ipt, "\n") {
		if strings.Contains(l, "CNI-") {
			out = append(out, l)
		}
	}
	for _, l := range strings.Split(nft, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "comment ") {
			continue
		}
		out = append(out, nftCounterRe.ReplaceAllString(nftHandleRe.ReplaceAllString(l, ""), ""))
	}
	s := strings.Join(out, "\n")
	for i, ip := range r.IPs {
		s = strings.ReplaceAll(s, ip.Address.IP.String(), fmt.Sprintf("<addr%d>", i))
	}
	return s
}

// requireMasqOf fails unless the node masquerades r's IPv4 address in the layout of
// backend (the reference's chain CNI-… or table inet cni_plugins_masquerade) and not
// in the other.
func (c *compat) requireMasqOf(t *testing.T, backend string, rt *libcni.RuntimeConf, r *current.Result, list *libcni.NetworkConfigList) {
	t.Helper()
	ipt := c.h.Run(c.h.HostNS, "sh", "-c", "iptables-save -t nat")
	nft := c.h.Run(c.h.HostNS, "sh", "-c", "nft list table inet cni_plugins_masquerade 2>/dev/null; true")
	a := addrOf(t, r, false)
	chain := netfilter.MasqChain(netfilter.Owner{Network: list.Name, ContainerID: rt.ContainerID})
	inIPT := strings.Contains(ipt, "-A POSTROUTING -s "+a+"/32 ") && strings.Contains(ipt, "-j "+chain)
	inNFT := masqShows(nft, a) && strings.Contains(nft, "id: "+rt.ContainerID)
	if (backend == "iptables") != inIPT || (backend == "nftables") != inNFT {
		t.Fatalf("want %s's masquerade only in the %s layout; iptables:\n%s\nnftables:\n%s", a, backend, ipt, nft)
	}
}

// TestBridgeCompatReference: for each backend, a pod added by the reference and
// deleted by podwire, and a pod added by podwire and deleted by the reference, leave
// the node as before; both write the same rules for the same attachment.
func TestBridgeCompatReference(t *testing.T) {
	for _, backend := range []string{"iptables", "nftables"} {
		t.Run(backend, func(t *testing.T) {
			c := newCompat(t)
			h := c.h
			list := compatConf(h, backend)
			warmUp(t, h, list)
			before := h.Snapshot()

			// The reference's ADD, podwire's CHECK and DEL.
			p := h.NewPod()
			rt := h.RT(p, "eth0", nstest.WithContainerID(h.Prefix+"-compat"))
			r := c.add(t, c.ref, list, rt)
			c.requireMasqOf(t, backend, rt, r, list)
			refLayout := c.masqLayout(t, r)
			c.check(t, list, rt)
			c.del(t, c.ours, list, rt)
			c.del(t, c.ours, list, rt)
			settleBridge(t, h, h.Name("br"))
			h.RequireUnchanged(before)

			// The same attachment added by podwire shows exactly the reference's rules.
			p = h.NewPod()
			rt = h.RT(p, "eth0", nstest.WithContainerID(h.Prefix+"-compat"))
			r = c.add(t, c.ours, list, rt)
			c.requireMasqOf(t, backend, rt, r, list)
			if got := c.masqLayout(t, r); got != refLayout {
				t.Errorf("podwire's rules differ from the reference's for the same attachment:\nreference:\n%s\npodwire:\n%s", refLayout, got)
			}
			// podwire's ADD, the reference's DEL.
			c.del(t, c.ref, list, rt)
			settleBridge(t, h, h.Name("br"))
			if backend == "nftables" {
				// The reference never deletes its table and chains: what it leaves after
				// deleting podwire's pod must be exactly what it leaves after its own.
				afterRefDel := h.Snapshot()
				p = h.NewPod()
				rt = h.RT(p, "eth0")
				c.add(t, c.ref, list, rt)
				c.del(t, c.ref, list, rt)
				settleBridge(t, h, h.Name("br"))
				h.RequireUnchanged(afterRefDel)
				// podwire's DEL of its last pod takes that empty table away too.
				p = h.NewPod()
				rt = h.RT(p, "eth0")
				c.add(t, c.ours, list, rt)
				c.del(t, c.ours, list, rt)
				settleBridge(t, h, h.Name("br"))
			}
			h.RequireUnchanged(before)
		})
	}
}

// TestBridgeCompatDefaults is the plain swap: neither conflist names a backend. The
// reference then uses iptables; podwire uses nftables when the reference could remove
// its rules (nft >= 1.0.1 installed), else iptables too. Either binary's DEL removes
// the other's pod, whichever layout it is in, and podwire's CHECK accepts either.
func TestBridgeCompatDefaults(t *testing.T) {
	c := newCompat(t)
	h := c.h
	list := compatConf(h, "")
	warmUp(t, h, list)
	before := h.Snapshot()

	p1, p2 := h.NewPod(), h.NewPod()
	rt1, rt2 := h.RT(p1, "eth0"), h.RT(p2, "eth0")
	r1 := c.add(t, c.ref, list, rt1)
	c.requireMasqOf(t, "iptables", rt1, r1, list)
	c.add(t, c.ours, list, rt2)
	c.check(t, list, rt1)
	c.check(t, list, rt2)
	c.del(t, c.ours, list, rt1)
	c.del(t, c.ref, list, rt2)
	settleBridge(t, h, h.Name("br"))
	// The reference's nftables teardown leaves its empty table when podwire's pod was
	// in nftables; podwire's next DEL of a pod removes it.
	p3 := h.NewPod()
	rt3 := h.RT(p3, "eth0")
	c.add(t, c.ours, list, rt3)
	c.del(t, c.ours, list, rt3)
	settleBridge(t, h, h.Name("br"))
	h.RequireUnchanged(before)
}

// TestBridgeCompatGC: podwire's GC removes the masquerade of stale pods the reference
// made (which the reference itself cannot: it has no GC), in both backends, and keeps
// the valid ones.
func TestBridgeCompatGC(t *testing.T) {
	c := newCompat(t)
	h := c.h
	ipt, nft := compatConf(h, "iptables"), compatConf(h, "nftables")
	warmUp(t, h, ipt)
	before := h.Snapshot()

	var rts []*libcni.RuntimeConf
	var rs []*current.Result
	for i, list := range []*libcni.NetworkConfigList{ipt, ipt, nft, nft} {
		p := h.NewPod()
		rt := h.RT(p, "eth0", nstest.WithContainerID(fmt.Sprintf("%s-gc%d", h.Prefix, i)))
		rts = append(rts, rt)
		rs = append(rs, c.add(t, c.ref, list, rt))
	}
	c.gc(t, ipt, rts[0], rts[2])
	c.requireMasqOf(t, "iptables", rts[0], rs[0], ipt)
	c.requireMasqOf(t, "nftables", rts[2], rs[2], nft)
	for _, i := range []int{1, 3} {
		if layout := c.masqLayout(t, rs[i]); strings.Contains(layout, "<addr") ||
			strings.Contains(layout, netfilter.MasqChain(netfilter.Owner{Network: ipt.Name, ContainerID: rts[i].ContainerID})) {
			t.Errorf("GC left the masquerade of stale pod %s:\n%s", rts[i].ContainerID, layout)
		}
	}
	c.check(t, ipt, rts[0])
	c.check(t, nft, rts[2])
	// The stale pods' links are still there: DEL them (podwire), then the kept ones
	// with the reference.
	c.del(t, c.ours, ipt, rts[1])
	c.del(t, c.ours, nft, rts[3])
	c.del(t, c.ref, ipt, rts[0])
	c.del(t, c.ref, nft, rts[2])
	settleBridge(t, h, h.Name("br"))
	// The reference leaves its empty nftables table; podwire's next DEL removes it.
	p := h.NewPod()
	rt := h.RT(p, "eth0")
	c.add(t, c.ours, nft, rt)
	c.del(t, c.ours, nft, rt)
	settleBridge(t, h, h.Name("br"))
	h.RequireUnchanged(before)
}

// TestBridgeCompatTwoInterfaces: the reference's iptables layout has one chain per
// network and container, so two interfaces of one container on one network share it.
// podwire's DEL of one interface (knowing its addresses from prevResult) removes only
// that interface's jump and keeps the chain for the other.
func TestBridgeCompatTwoInterfaces(t *testing.T) {
	c := newCompat(t)
	h := c.h
	list := compatConf(h, "iptables")
	warmUp(t, h, list)
	before := h.Snapshot()

	p := h.NewPod()
	rt0, rt1 := h.RT(p, "eth0"), h.RT(p, "net1")
	r0 := c.add(t, c.ref, list, rt0)
	r1 := c.add(t, c.ref, list, rt1)
	c.del(t, c.ours, list, rt0)
	c.requireMasqOf(t, "iptables", rt1, r1, list)
	if ipt := h.Run(h.HostNS, "iptables-save", "-t", "nat"); strings.Contains(ipt, "-s "+addrOf(t, r0, false)+"/32") {
		t.Errorf("eth0's jump survived its DEL:\n%s", ipt)
	}
	c.check(t, list, rt1)
	c.del(t, c.ours, list, rt1)
	settleBridge(t, h, h.Name("br"))
	h.RequireUnchanged(before)
}

// TestBridgeCompatLegacyIPTables repeats both directions on a node whose `iptables` is
// iptables-legacy (rules in x_tables, invisible to nftables): podwire then finds the
// reference's chain through /proc/net/ip_tables_names and the iptables listing, not
// through netlink. The node snapshot reads iptables-nft, so the legacy tables are
// checked on their own.
func TestBridgeCompatLegacyIPTables(t *testing.T) {
	bin := t.TempDir()
	for _, tool := range []string{"iptables", "iptables-restore", "iptables-save", "ip6tables", "ip6tables-restore", "ip6tables-save"} {
		fam, verb, _ := strings.Cut(tool, "-")
		name := fam + "-legacy"
		if verb != "" {
			name += "-" + verb
		}
		legacy, err := exec.LookPath(name)
		if err != nil {
			nstest.Missing(t, "%s is not installed: %v", name, err)
		}
		if err := os.Symlink(legacy, filepath.Join(bin, tool)); err != nil {
			t.Fatal(err)
		}
	}
	c := newCompat(t)
	h := c.h
	if out, err := nstest.RunIn(h.HostNS, filepath.Join(bin, "iptables"), "-t", "nat", "-S", "POSTROUTING"); err != nil {
		testenv.KernelLacks(t, fmt.Sprintf("iptables-legacy -t nat fails: %v\n%s", err, out), "CONFIG_IP_NF_IPTABLES", "CONFIG_IP_NF_NAT")
	}
	// The plugins (through libcni) and the observers below run with this PATH.
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	legacyNAT := func() string {
		return h.Run(h.HostNS, "sh", "-c", "iptables-save -t nat; ip6tables-save -t nat")
	}
	ipt, auto := compatConf(h, "iptables"), compatConf(h, "")
	warmUp(t, h, ipt)
	before := h.Snapshot()
	// The last case uses the default backend: podwire picks nftables here (nft is
	// installed) and must still remove the reference's legacy chain.
	for _, tc := range []struct {
		what         string
		list         *libcni.NetworkConfigList
		adder, deler *libcni.CNIConfig
	}{
		{"reference ADD, podwire DEL", ipt, c.ref, c.ours},
		{"podwire ADD, reference DEL", ipt, c.ours, c.ref},
		{"default backends: reference ADD, podwire DEL", auto, c.ref, c.ours},
	} {
		p := h.NewPod()
		rt := h.RT(p, "eth0")
		r := c.add(t, tc.adder, tc.list, rt)
		chain := netfilter.MasqChain(netfilter.Owner{Network: tc.list.Name, ContainerID: rt.ContainerID})
		if got := legacyNAT(); !strings.Contains(got, "-A POSTROUTING -s "+addrOf(t, r, false)+"/32") || !strings.Contains(got, ":"+chain) {
			t.Fatalf("%s: no legacy masquerade for %s:\n%s", tc.what, rt.ContainerID, got)
		}
		if strings.Contains(h.Run(h.HostNS, "nft", "list", "ruleset"), chain) {
			t.Fatalf("%s: the rules went to iptables-nft, not to iptables-legacy", tc.what)
		}
		c.check(t, tc.list, rt)
		c.del(t, tc.deler, tc.list, rt)
		if got := legacyNAT(); strings.Contains(got, "CNI-") {
			t.Errorf("%s: legacy masquerade left after DEL:\n%s", tc.what, got)
		}
		settleBridge(t, h, h.Name("br"))
		h.RequireUnchanged(before)
	}
}
