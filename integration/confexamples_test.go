// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"

	"github.com/podwire/podwire/integration/nstest"
)

// TestConfExamples loads every conflist in conf-examples/ through libcni and runs
// ADD, CHECK and DEL for a pod in a fresh namespace, then requires the node to be as
// it was (after a first ADD/DEL created the bridge, which stays by design). The only
// edits are the ones a test needs: a private dataDir and a prefixed bridge name.
func TestConfExamples(t *testing.T) {
	root, err := nstest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(root, "conf-examples", "*.conflist"))
	if len(files) < 6 {
		t.Fatalf("found %d conflists in conf-examples, want at least 6", len(files))
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			h := nstest.New(t)
			raw, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			var list map[string]any
			if err := json.Unmarshal(raw, &list); err != nil {
				t.Fatalf("%s is not valid JSON: %v", file, err)
			}
			caps := map[string]any{}
			hasBridge := false
			for _, p := range list["plugins"].([]any) {
				pm := p.(map[string]any)
				typ := pm["type"].(string)
				if _, err := os.Stat(filepath.Join(h.BinDir, typ)); err != nil {
					t.Fatalf("%s names plugin %s, which is missing from %s: %v", file, typ, h.BinDir, err)
				}
				if _, ok := pm["bridge"]; ok {
					pm["bridge"] = h.Name("br")
					hasBridge = true
				}
				if ipam, ok := pm["ipam"].(map[string]any); ok {
					ipam["dataDir"] = h.DataDir
				}
				if c, ok := pm["capabilities"].(map[string]any); ok {
					if c["portMappings"] == true {
						caps["portMappings"] = []map[string]any{{"hostPort": 18080, "containerPort": 80, "protocol": "tcp"}}
					}
					if c["bandwidth"] == true {
						caps["bandwidth"] = map[string]any{"ingressRate": 10_000_000, "ingressBurst": 4294967295,
							"egressRate": 10_000_000, "egressBurst": 4294967295}
					}
				}
			}
			// Usable as they are on containerd 1.6 and 1.7, whose libcni 1.1.x knows
			// cniVersion up to 1.0.0 (docs/runtimes.md).
			if v, _ := list["cniVersion"].(string); !slices.Contains([]string{"0.3.1", "0.4.0", "1.0.0"}, v) {
				t.Errorf("%s has cniVersion %q; containerd 1.6 and 1.7 refuse every pod above 1.0.0: use 1.0.0", file, v)
			}
			edited, _ := json.Marshal(list)
			conf, err := libcni.NetworkConfFromBytes(edited)
			if err != nil {
				t.Fatalf("libcni rejects %s: %v", file, err)
			}
			ifName := "eth0"
			if strings.Contains(file, "loopback") {
				ifName = "lo"
			}
			warm := h.NewPod()
			h.MustAdd(conf, h.RT(warm, ifName, nstest.WithCaps(caps)))
			if hasBridge {
				waitLinkLocal(t, h, h.Name("br"))
			}
			h.MustDel(conf, h.RT(warm, ifName, nstest.WithCaps(caps)))
			// The bridge loses its carrier and finishes IPv6 DAD on its own time; compare
			// settled states only.
			settle := func() {
				if hasBridge {
					settleBridge(t, h, h.Name("br"))
				}
			}
			settle()
			before := h.Snapshot()

			pod := h.NewPod()
			rt := h.RT(pod, ifName, nstest.WithCaps(caps))
			res := h.MustAdd(conf, rt)
			var addrs []string
			for _, ip := range res.IPs {
				addrs = append(addrs, ip.Address.String())
				if ip.Gateway != nil && ifName != "lo" {
					h.MustPing(pod, ip.Gateway.String())
				}
			}
			t.Logf("ADD: %s", strings.Join(addrs, " "))
			if conf.CNIVersion != "0.3.0" && conf.CNIVersion != "0.3.1" {
				if err := h.Check(conf, rt); err != nil {
					t.Fatalf("CHECK: %v", err)
				}
				t.Log("CHECK passes")
			}
			h.MustDel(conf, rt)
			t.Log("DEL done")

			// An attachment this runtime's libcni cache does not know (its ADD went
			// through another client, as after a lost cache or a crash before the cache
			// write). Below 1.1.0 libcni sends no GC verb, so GC leaves it; the same file
			// at 1.1.0, as the README says to get GC and STATUS, has it removed.
			other := libcni.NewCNIConfigWithCacheDir([]string{h.BinDir}, t.TempDir(), nil)
			orphan := h.RT(h.NewPod(), ifName, nstest.WithCaps(caps))
			if _, err := h.AddWith(other, conf, orphan); err != nil {
				t.Fatalf("ADD through a second client: %v", err)
			}
			leases := len(leaseFiles(t, h, conf))
			if err := h.GC(conf, nil); err != nil {
				t.Fatalf("GC: %v", err)
			}
			if got := len(leaseFiles(t, h, conf)); got != leases {
				t.Errorf("GC at cniVersion %s changed the leases from %d to %d; libcni should not send the GC verb below 1.1.0", conf.CNIVersion, leases, got)
			}
			list["cniVersion"] = "1.1.0"
			edited, _ = json.Marshal(list)
			conf11, err := libcni.NetworkConfFromBytes(edited)
			if err != nil {
				t.Fatal(err)
			}
			if err := h.Status(conf11); err != nil {
				t.Fatalf("STATUS at 1.1.0: %v", err)
			}
			if err := h.GC(conf11, nil); err != nil {
				t.Fatalf("GC at 1.1.0: %v", err)
			}
			if got := len(leaseFiles(t, h, conf)); got != 0 {
				t.Errorf("GC at 1.1.0 with no valid attachment left %d of %d leases", got, leases)
			}
			t.Logf("GC: %d leases kept at %s, removed at 1.1.0", leases, conf.CNIVersion)
			if err := h.DelWith(other, conf, orphan); err != nil {
				t.Fatalf("DEL of the orphan: %v", err)
			}
			settle()
			h.RequireUnchanged(before)
		})
	}
}
