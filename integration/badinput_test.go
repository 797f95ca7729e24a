// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/podwire/podwire/integration/nstest"
)

// TestBadInputEveryPlugin feeds each built plugin the same table of hostile and
// malformed input a runtime (or an attacker controlling pod names) could pass, for ADD,
// CHECK and DEL: every case must exit non-zero with a JSON CNI error carrying the
// expected code, and leave the node and the data dir exactly as they were. Per-plugin
// tables of plugin-specific keys live in each plugin's own tests.
func TestBadInputEveryPlugin(t *testing.T) {
	h := nstest.New(t)
	pod := h.NewPod()
	long := strings.Repeat("a", 5000)
	prev := `"prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"` + pod.Path() + `"}],"ips":[{"address":"10.1.2.3/24","interface":0}]}`
	confFor := func(plugin, extra string) string {
		c := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"bad","type":%q`, plugin)
		switch plugin {
		case "bridge":
			c += fmt.Sprintf(`,"bridge":%q,"ipam":{"type":"host-local","subnet":"10.99.0.0/24","dataDir":%q}`, h.Name("br"), h.DataDir)
		case "host-local":
			c += fmt.Sprintf(`,"ipam":{"type":"host-local","subnet":"10.99.0.0/24","dataDir":%q}`, h.DataDir)
		case "portmap":
			c += `,"runtimeConfig":{"portMappings":[{"hostPort":8080,"containerPort":80}]},` + prev
		case "bandwidth":
			c += `,"runtimeConfig":{"bandwidth":{"ingressRate":1000000,"ingressBurst":0}},` + prev
		}
		if extra != "" {
			c += "," + extra
		}
		return c + "}"
	}
	type tcase struct {
		name  string
		env   map[string]string
		stdin func(plugin string) string
		code  uint
	}
	good := func(p string) string { return confFor(p, "") }
	cases := []tcase{
		{"malformed JSON", nil, func(p string) string { return strings.TrimSuffix(good(p), "}") }, 6},
		{"NUL byte in JSON", nil, func(p string) string { return good(p)[:20] + "\x00" + good(p)[20:] }, 6},
		{"cniVersion not a string", nil, func(p string) string { return strings.Replace(good(p), `"1.0.0"`, `1.0`, 1) }, 6},
		{"unsupported cniVersion", nil, func(p string) string { return strings.Replace(good(p), `"1.0.0"`, `"42.0.0"`, 1) }, 1},
		{"hostile network name", nil, func(p string) string { return strings.Replace(good(p), `"name":"bad"`, `"name":"../../etc"`, 1) }, 7},
		{"network name with NUL", nil, func(p string) string { return strings.Replace(good(p), `"name":"bad"`, `"name":"a\u0000b"`, 1) }, 7},
		{"very long network name", nil, func(p string) string { return strings.Replace(good(p), `"name":"bad"`, `"name":"`+long+`"`, 1) }, 7},
		{"container ID ../../etc", map[string]string{"CNI_CONTAINERID": "../../etc"}, good, 4},
		{"container ID with slash", map[string]string{"CNI_CONTAINERID": "abc/def"}, good, 4},
		{"very long container ID", map[string]string{"CNI_CONTAINERID": long}, good, 4},
		{"ifname too long", map[string]string{"CNI_IFNAME": "eth0123456789012"}, good, 4},
		{"ifname ..", map[string]string{"CNI_IFNAME": ".."}, good, 4},
		{"ifname with slash", map[string]string{"CNI_IFNAME": "../x"}, good, 4},
		{"netns relative", map[string]string{"CNI_NETNS": "../../proc/1/ns/net"}, good, 4},
	}
	plugins := []string{"loopback", "host-local", "bridge", "portmap", "bandwidth"}
	before := h.Snapshot()
	entriesBefore := dirList(t, h.DataDir)
	for _, plugin := range plugins {
		if _, err := os.Stat(filepath.Join(h.BinDir, plugin)); err != nil {
			t.Fatalf("plugin %s not built: %v", plugin, err)
		}
		for _, cmd := range []string{"ADD", "CHECK", "DEL"} {
			for _, tc := range cases {
				t.Run(plugin+"/"+cmd+"/"+tc.name, func(t *testing.T) {
					env := map[string]string{"CNI_COMMAND": cmd, "CNI_CONTAINERID": "c1", "CNI_IFNAME": "eth0", "CNI_NETNS": pod.Path()}
					for k, v := range tc.env {
						env[k] = v
					}
					out, exit := h.Exec(plugin, env, tc.stdin(plugin))
					if exit == 0 {
						t.Fatalf("exit 0; stdout %s", out)
					}
					e, err := nstest.CNIError(out)
					if err != nil {
						t.Fatal(err)
					}
					if e.Code != tc.code {
						t.Errorf("code %d (%s), want %d", e.Code, e.Error(), tc.code)
					}
				})
			}
		}
	}
	h.RequireUnchanged(before)
	if after := dirList(t, h.DataDir); after != entriesBefore {
		t.Fatalf("data dir changed:\nbefore: %s\nafter:  %s", entriesBefore, after)
	}
	t.Logf("%d bad inputs × 3 verbs × %d plugins rejected with the right code; node and data dir unchanged", len(cases), len(plugins))
}

func dirList(t *testing.T, dir string) string {
	var out []string
	_ = filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil {
			out = append(out, p)
		}
		return nil
	})
	return strings.Join(out, " ")
}
