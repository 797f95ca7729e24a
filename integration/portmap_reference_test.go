// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"

	"github.com/podwire/podwire/integration/nstest"
	"github.com/podwire/podwire/pkg/netfilter"
)

// pmReferencePortmap returns the reference portmap binary.
func pmReferencePortmap(t *testing.T) string {
	return filepath.Join(referenceDir(t, "portmap"), "portmap")
}

// pmMixed returns two libcni clients sharing one result cache: one with podwire's
// bridge, host-local and portmap, one with podwire's bridge and host-local and the
// reference portmap, so either portmap can DEL what the other ADDed.
func pmMixed(t *testing.T, h *nstest.H) (ours, mixed *libcni.CNIConfig) {
	t.Helper()
	ref := pmReferencePortmap(t)
	dir := t.TempDir()
	for _, p := range []string{"bridge", "host-local"} {
		if err := os.Symlink(filepath.Join(h.BinDir, p), filepath.Join(dir, p)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(ref, filepath.Join(dir, "portmap")); err != nil {
		t.Fatal(err)
	}
	cache := filepath.Join(t.TempDir(), "cache")
	return libcni.NewCNIConfigWithCacheDir([]string{h.BinDir}, cache, nil),
		libcni.NewCNIConfigWithCacheDir([]string{dir}, cache, nil)
}

// TestPortmapReferenceCompat proves that a node can switch between the reference
// portmap and podwire's under live pods, on the iptables backend (the reference's
// default): podwire's DEL removes what the reference's ADD made, shared chains
// included, and the reference's DEL removes what podwire's ADD made.
func TestPortmapReferenceCompat(t *testing.T) { pmReferenceCompat(t) }

// TestPortmapLegacyIPTables runs the traffic and the reference compatibility tests
// with iptables-legacy (PATH points iptables, iptables-restore and iptables-save, the
// reference's and the snapshot's included, at the legacy binaries).
func TestPortmapLegacyIPTables(t *testing.T) {
	nstest.RequireRoot(t)
	dir := t.TempDir()
	for _, fam := range []string{"iptables", "ip6tables"} {
		for _, suffix := range []string{"", "-restore", "-save"} {
			legacy, err := exec.LookPath(fam + "-legacy" + suffix)
			if err != nil {
				nstest.Missing(t, "iptables-legacy is not installed: %v", err)
			}
			if err := os.Symlink(legacy, filepath.Join(dir, fam+suffix)); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Setenv("PATH", dir+":"+os.Getenv("PATH"))
	t.Run("traffic", func(t *testing.T) { pmTraffic(t, netfilter.KindIPTables) })
	t.Run("reference", pmReferenceCompat)
}

func pmReferenceCompat(t *testing.T) {
	h := nstest.New(t)
	client := pmNode(t, h)
	ours, mixed := pmMixed(t, h)
	list := pmConf(h, pmBackend(netfilter.KindIPTables))
	pmWarmUp(t, h, list)
	before := h.Snapshot()

	// Reference ADD, podwire DEL. (Sections run in sequence on one node; the harness
	// fails the whole test, so they are not subtests.)
	{
		pod := h.NewPod()
		pmServe(t, pod, "pod", 80)
		rt := h.RT(pod, "eth0", pmMap("tcp:8080:80", "udp:8080:80"))
		if _, err := h.AddWith(mixed, list, rt); err != nil {
			t.Fatalf("reference ADD: %v", err)
		}
		rules := pmRules(t, h)
		chain := netfilter.HostPortChain(list.Name, rt.ContainerID)
		if !strings.Contains(rules, `dnat name: \"`+list.Name+`\"`) || !strings.Contains(rules, "-N "+chain) && !strings.Contains(rules, ":"+chain) {
			t.Fatalf("the reference's rules do not look as expected (chain %s):\n%s", chain, rules)
		}
		pmExpect(t, "reference forward", client, "tcp", pmNode4+":8080", "pod", pmClient4)
		if err := h.DelWith(ours, list, rt); err != nil {
			t.Fatalf("podwire DEL: %v", err)
		}
		if rules := pmRules(t, h); rules != "" {
			t.Errorf("podwire's DEL left the reference's rules:\n%s", rules)
		}
		if _, err := pmDialOnce(client, "tcp", pmNode4+":8080", nil); err == nil {
			t.Error("still forwarded after podwire's DEL")
		}
		// The reference's ADD turned route_localnet on and nothing of the reference
		// ever turns it off; podwire leaves knobs it did not set alone.
		h.Run(h.HostNS, "sysctl", "-qw", "net.ipv4.conf."+h.Name("br")+".route_localnet=0")
		pmSettle(t, h)
		h.RequireUnchanged(before)
	}

	// podwire ADD, reference DEL.
	{
		pod := h.NewPod()
		pmServe(t, pod, "pod", 80)
		rt := h.RT(pod, "eth0", pmMap("tcp:8080:80", "udp:8080:80"))
		if _, err := h.AddWith(ours, list, rt); err != nil {
			t.Fatalf("podwire ADD: %v", err)
		}
		pmExpect(t, "podwire forward", client, "tcp", pmNode4+":8080", "pod", pmClient4)
		pmExpect(t, "podwire hairpin", pod, "tcp", pmNode4+":8080", "pod", pmGW4)
		if err := h.DelWith(mixed, list, rt); err != nil {
			t.Fatalf("reference DEL: %v", err)
		}
		rules := pmRules(t, h)
		if strings.Contains(rules, "CNI-DN-") || strings.Contains(rules, "pw:") {
			t.Errorf("the reference's DEL left podwire's rules of the attachment:\n%s", rules)
		}
		if _, err := pmDialOnce(client, "tcp", pmNode4+":8080", nil); err == nil {
			t.Error("still forwarded after the reference's DEL")
		}
		// What stays are the shared chains, which the reference never removes; the
		// next podwire DEL (here: the runtime repeating it) clears them.
		if err := h.DelWith(ours, list, rt); err != nil {
			t.Fatalf("podwire DEL after the reference's: %v", err)
		}
		if got := len(pmMarkers(t, list.Name)); got != 0 {
			t.Errorf("%d markers left", got)
		}
		pmSettle(t, h)
		h.RequireUnchanged(before)
	}

	// Reference nftables ADD, podwire DEL.
	{
		nlist := pmConf(h, pmBackend(netfilter.KindNFTables))
		pod := h.NewPod()
		pmServe(t, pod, "pod", 80)
		rt := h.RT(pod, "eth0", pmMap("tcp:8080:80"))
		if _, err := h.AddWith(mixed, nlist, rt); err != nil {
			t.Fatalf("reference ADD: %v", err)
		}
		t.Cleanup(func() {
			for _, fam := range []string{"ip", "ip6"} {
				_, _ = nstest.RunIn(h.HostNS, "nft", "delete", "table", fam, "cni_hostport")
			}
		})
		pmExpect(t, "reference nftables forward", client, "tcp", pmNode4+":8080", "pod", pmClient4)
		if err := h.DelWith(ours, nlist, rt); err != nil {
			t.Fatalf("podwire DEL: %v", err)
		}
		out, _ := nstest.RunIn(h.HostNS, "nft", "list", "ruleset")
		if strings.Contains(out, rt.ContainerID) {
			t.Errorf("podwire's DEL left the reference's nftables rules:\n%s", out)
		}
		if _, err := pmDialOnce(client, "tcp", pmNode4+":8080", nil); err == nil {
			t.Error("still forwarded after podwire's DEL")
		}
	}
}
