package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
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
					t.Skipf("plugin %s is not built in this tree yet", typ)
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
			settle()
			h.RequireUnchanged(before)
		})
	}
}
