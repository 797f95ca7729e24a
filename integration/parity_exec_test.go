// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/google/go-cmp/cmp"

	"github.com/podwire/podwire/integration/nstest"
)

// These tests execute the reference plugins and podwire's directly, without libcni, for
// what a conflist cannot show: the cniVersions each reports, and what a chained plugin
// prints for a prevResult no real plugin would have made.

// TestParityVersions requires every plugin to report the cniVersions the reference's
// reports (CNI_COMMAND=VERSION), and to refuse ADD at a version outside them as the
// reference does (bandwidth below 0.3.0).
func TestParityVersions(t *testing.T) {
	refDir := referenceDir(t, "bridge", "host-local", "loopback", "portmap", "bandwidth")
	bin, err := nstest.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	for _, plugin := range []string{"bridge", "host-local", "loopback", "portmap", "bandwidth"} {
		var infos [2]string
		for i, dir := range []string{refDir, bin} {
			info, err := (&invoke.RawExec{}).ExecPlugin(context.Background(), filepath.Join(dir, plugin), nil, []string{"CNI_COMMAND=VERSION"})
			if err != nil {
				t.Fatalf("%s VERSION in %s: %v", plugin, dir, err)
			}
			pi, err := (&version.PluginDecoder{}).Decode(info)
			if err != nil {
				t.Fatalf("%s VERSION in %s: %v", plugin, dir, err)
			}
			infos[i] = strings.Join(pi.SupportedVersions(), " ")
		}
		if infos[0] != infos[1] {
			t.Errorf("%s supports %s, the reference %s", plugin, infos[1], infos[0])
		}
	}
}

// TestParityPassThrough: a chained plugin with nothing to do (portmap without
// mappings, bandwidth without a rate, loopback) prints prevResult exactly as the
// reference's does, which is as received: no conversion to 1.x and back.
func TestParityPassThrough(t *testing.T) {
	refDir := referenceDir(t, "loopback", "portmap", "bandwidth")
	h := nstest.New(t)
	pod := h.NewPod()
	prevs := map[string]string{
		"0.2.0": `{"cniVersion":"0.2.0","ip4":{"ip":"10.1.2.3/24","gateway":"10.1.2.1","routes":[{"dst":"0.0.0.0/0"}]},"dns":{"nameservers":["10.0.0.10"]}}`,
		"0.3.1": `{"cniVersion":"0.3.1","interfaces":[{"name":"eth0","sandbox":"/x"}],"ips":[{"address":"10.1.2.3/24","interface":0}]}`,
		"0.4.0": `{"cniVersion":"0.4.0","interfaces":[{"name":"eth0","sandbox":"/x"}],"ips":[{"version":"6","address":"10.1.2.3/24","interface":0},{"address":"fd00::3/64"}],"routes":[{"dst":"10.9.0.0/16","gw":"10.1.2.9","mtu":1400}]}`,
		"1.0.0": `{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/x"}],"ips":[{"address":"10.1.2.3/24","interface":0}],"dns":{"search":["a"]}}`,
		"1.1.0": `{"cniVersion":"1.1.0","interfaces":[{"name":"eth0","sandbox":"/x","mtu":1400,"socketPath":"/s"}],"ips":[{"address":"10.1.2.3/24","interface":0}],"routes":[{"dst":"10.9.0.0/16","table":100,"scope":253}]}`,
	}
	for _, plugin := range []string{"portmap", "bandwidth", "loopback"} {
		for v, prev := range prevs {
			if plugin == "bandwidth" && v == "0.2.0" {
				continue // the reference's bandwidth starts at 0.3.0
			}
			t.Run(plugin+"/"+v, func(t *testing.T) {
				conf := fmt.Sprintf(`{"cniVersion":%q,"name":"pass","type":%q,"prevResult":%s}`, v, plugin, prev)
				env := map[string]string{"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_IFNAME": "eth0", "CNI_NETNS": pod.Path()}
				var outs [2]any
				for i, dir := range []string{refDir, h.BinDir} {
					var stdout []byte
					err := h.InHost(func() error {
						var err error
						stdout, err = (&invoke.RawExec{}).ExecPlugin(context.Background(), filepath.Join(dir, plugin), []byte(conf), envList(env, dir))
						return err
					})
					if err != nil {
						t.Fatalf("%s in %s: %v", plugin, dir, err)
					}
					if err := json.Unmarshal(stdout, &outs[i]); err != nil {
						t.Fatalf("%s in %s printed %q: %v", plugin, dir, stdout, err)
					}
				}
				if d := cmp.Diff(outs[0], outs[1]); d != "" {
					t.Errorf("result differs (- reference, + podwire):\n%s", d)
				}
			})
		}
	}
}

func envList(env map[string]string, path string) []string {
	out := []string{"CNI_PATH=" + path}
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	return out
}
