// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/podwire/podwire/integration/containerd"
	"github.com/podwire/podwire/integration/nstest"
)

// statusPodIP is the only address of TestContainerdStatus's range.
const statusPodIP = "10.244.1.10"

// TestContainerdStatus shows which containerd asks the plugins for their STATUS (CNI
// 1.1.0). Its conflist's range has a single address; one pod takes it, so host-local's
// STATUS fails for a real reason: the range is exhausted. containerd 2.x calls STATUS
// on every CRI Status call (go-cni's Status, for conflists at cniVersion 1.1.0), so
// `crictl info` must report NetworkReady false with host-local's message, and true
// again once the pod is removed and its lease released. containerd 1.6's libcni has no
// STATUS (and cannot take a 1.1.0 conflist's results, so its conflist is at 1.0.0):
// it must keep reporting NetworkReady true, and the next pod fails only in ADD.
func TestContainerdStatus(t *testing.T) {
	nstest.RequireRoot(t)
	forEachContainerd(t, testContainerdStatus)
}

func testContainerdStatus(t *testing.T, rt containerd.Runtime) {
	h := nstest.New(t)
	repo, err := nstest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	conf := loadKubenetExample(t, h, repo)
	cniVersion := "1.1.0"
	if rt.ConfigVersion < 3 {
		cniVersion = "1.0.0"
	}
	raw := oneAddressConflist(t, conf.raw, cniVersion)
	confDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(confDir, "10-kubenet.conflist"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	d := containerd.Start(t, containerd.Options{
		NetNS: h.HostNS.Path(), CNIBinDir: h.BinDir, CNIConfDir: confDir, Dir: t.TempDir(), Repo: repo, Runtime: rt,
	})
	requireCRIReady(t, d)
	t.Logf("check: %s with conflist %s at cniVersion %s, range %s only: CRI reports NetworkReady", d.Version, strings.Join(conf.plugins, " + "), cniVersion, statusPodIP)

	id := runPod(t, d, "only", conf)
	if p, err := d.InspectPod(id); err != nil || p.Status.Network.IP != statusPodIP {
		t.Fatalf("pod %s: %+v, %v; want IP %s", short(id), p, err, statusPodIP)
	}
	t.Logf("check: pod %s took the range's only address %s", short(id), statusPodIP)

	if rt.ConfigVersion < 3 {
		// Give a STATUS-calling runtime as long as the 2.x branch waits, then require
		// that nothing changed.
		time.Sleep(2 * time.Second)
		c := networkCondition(t, d)
		if !c.Status {
			t.Fatalf("%s reports NetworkReady false (%s: %s): want true, it has no CNI STATUS", rt.Name, c.Reason, c.Message)
		}
		t.Logf("check: with the range exhausted, %s still reports NetworkReady true: it never calls STATUS", rt.Name)
		_, err := runPodErr(t, d, "second", conf)
		if err == nil || !strings.Contains(err.Error(), "no free address") {
			t.Fatalf("second pod on an exhausted range: %v; want ADD to fail with host-local's \"no free address\"", err)
		}
		t.Logf("check: the next pod fails only in ADD: %s", addError(err.Error()))
	} else {
		c := waitNetworkReady(t, d, false)
		if c.Reason != "NetworkPluginNotReady" || !strings.Contains(c.Message, "range set 0") || !strings.Contains(c.Message, "is exhausted") ||
			!strings.Contains(c.Message, "of network "+conf.network) {
			t.Fatalf("NetworkReady false with reason %q message %q: want NetworkPluginNotReady and host-local's \"range set 0 (...) of network %s is exhausted\"", c.Reason, c.Message, conf.network)
		}
		t.Logf("check: %s calls STATUS: crictl info reports NetworkReady false, reason %s, message %q", rt.Name, c.Reason, c.Message)
	}

	d.MustCrictl("stopp", id)
	d.MustCrictl("rmp", id)
	if _, err := os.Stat(filepath.Join(h.DataDir, conf.network, statusPodIP)); !os.IsNotExist(err) {
		t.Fatalf("lease of %s still there after rmp: %v", statusPodIP, err)
	}
	if rt.ConfigVersion >= 3 {
		waitNetworkReady(t, d, true)
		t.Logf("check: pod removed, lease of %s released: crictl info reports NetworkReady true again", statusPodIP)
		return
	}

	// What a 1.1.0 conflist does to containerd 1.6 (why podwire-agent writes 1.0.0
	// for it): loaded, and NetworkReady stays true, but every pod fails in ADD.
	tmp := filepath.Join(confDir, ".10-kubenet.conflist.tmp")
	if err := os.WriteFile(tmp, oneAddressConflist(t, conf.raw, "1.1.0"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(confDir, "10-kubenet.conflist")); err != nil {
		t.Fatal(err)
	}
	waitLoadedCNIVersion(t, d, conf.network, "1.1.0")
	if c := networkCondition(t, d); !c.Status {
		t.Fatalf("%s with a 1.1.0 conflist reports NetworkReady false (%s: %s), want true", rt.Name, c.Reason, c.Message)
	}
	_, err = runPodErr(t, d, "v110", conf)
	if err == nil || !strings.Contains(err.Error(), `unsupported CNI result version \"1.1.0\"`) {
		t.Fatalf("pod with a 1.1.0 conflist on %s: %v; want ADD to fail with libcni's unsupported CNI result version \"1.1.0\"", rt.Name, err)
	}
	t.Logf("check: with the conflist at 1.1.0, %s loads it and reports NetworkReady true, but every pod fails: %s", rt.Name, addError(err.Error()))
}

// waitLoadedCNIVersion waits until `crictl info`'s cniconfig (go-cni's GetConfig)
// shows network at cniVersion: containerd reloads conf_dir asynchronously.
func waitLoadedCNIVersion(t *testing.T, d *containerd.Daemon, network, want string) {
	t.Helper()
	var last string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		var info struct {
			CNIConfig struct {
				Networks []struct {
					Config struct{ Name, CNIVersion string }
				}
			} `json:"cniconfig"`
		}
		out := d.MustCrictl("info")
		if err := json.Unmarshal([]byte(out), &info); err != nil {
			t.Fatalf("parsing crictl info: %v\n%s", err, out)
		}
		for _, n := range info.CNIConfig.Networks {
			if n.Config.Name == network {
				if last = n.Config.CNIVersion; last == want {
					return
				}
			}
		}
	}
	t.Fatalf("containerd did not reload network %s at cniVersion %s within 30s (loaded: %q)", network, want, last)
}

// oneAddressConflist rewrites the kubenet conflist to cniVersion with a host-local
// range of the single address statusPodIP.
func oneAddressConflist(t *testing.T, raw []byte, cniVersion string) []byte {
	t.Helper()
	var list map[string]any
	if err := json.Unmarshal(raw, &list); err != nil {
		t.Fatal(err)
	}
	list["cniVersion"] = cniVersion
	for _, p := range list["plugins"].([]any) {
		ipam, ok := p.(map[string]any)["ipam"].(map[string]any)
		if !ok {
			continue
		}
		r := ipam["ranges"].([]any)[0].([]any)[0].(map[string]any)
		r["rangeStart"], r["rangeEnd"] = statusPodIP, statusPodIP
	}
	out, err := json.MarshalIndent(list, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// criCondition is one of `crictl info`'s status conditions.
type criCondition struct {
	Type    string `json:"type"`
	Status  bool   `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// networkCondition returns `crictl info`'s NetworkReady condition.
func networkCondition(t *testing.T, d *containerd.Daemon) criCondition {
	t.Helper()
	out := d.MustCrictl("info")
	var info struct {
		Status struct {
			Conditions []criCondition `json:"conditions"`
		} `json:"status"`
	}
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		t.Fatalf("parsing crictl info: %v\n%s", err, out)
	}
	for _, c := range info.Status.Conditions {
		if c.Type == "NetworkReady" {
			return c
		}
	}
	t.Fatalf("crictl info has no NetworkReady condition:\n%s", out)
	return criCondition{}
}

// waitNetworkReady polls `crictl info` until NetworkReady is want. containerd asks the
// plugins on every call, so this takes one call on an idle machine; 30s is for a busy one.
func waitNetworkReady(t *testing.T, d *containerd.Daemon, want bool) criCondition {
	t.Helper()
	var c criCondition
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if c = networkCondition(t, d); c.Status == want {
			return c
		}
	}
	t.Fatalf("NetworkReady is %v after 30s (reason %q, message %q), want %v", c.Status, c.Reason, c.Message, want)
	return c
}

// addError cuts crictl's log line down to the plugin's error.
func addError(s string) string {
	for _, line := range strings.Split(s, "\n") {
		if i := strings.Index(line, "plugin type="); i >= 0 {
			return strings.ReplaceAll(strings.TrimSuffix(line[i:], `"`), `\"`, `"`)
		}
	}
	return s
}
