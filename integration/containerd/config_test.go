// SPDX-License-Identifier: Apache-2.0

package containerd

import (
	"strings"
	"testing"
)

func TestMajorMinor(t *testing.T) {
	for in, want := range map[string]string{
		"1.6.20~ds1": "1.6", "v2.4.2": "2.4", "2.4.2+unknown": "2.4", "1.7": "1.7",
		"": "", "1": "", "x.y.z": "", "v.1": "",
	} {
		if got := majorMinor(in); got != want {
			t.Errorf("majorMinor(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestConfig renders each schema and checks that every parameter lands under the key
// that release reads (a misplaced %[n] would leave the CNI dirs or the sandbox image
// under a key the other schema uses, which containerd ignores silently).
func TestConfig(t *testing.T) {
	p := configParams{Root: "/R", State: "/S", Temp: "/T", Socket: "/S.sock", Opt: "/O", SandboxImage: "img:1",
		CNIBinDir: "/BIN", CNIConfDir: "/CONF", RuncRoot: "/RUNC", Shim: "/SHIM"}
	for _, tc := range []struct {
		version int
		want    []string
	}{
		{2, []string{"version = 2", `root = "/R"`, `sandbox_image = "img:1"`, `bin_dir = "/BIN"`, `conf_dir = "/CONF"`, `Root = "/RUNC"`, `address = "/S.sock"`}},
		{3, []string{"version = 3", `root = "/R"`, `sandbox = "img:1"`, `bin_dirs = ["/BIN"]`, `conf_dir = "/CONF"`, `Root = "/RUNC"`,
			`runtime_path = "/SHIM"`, `"io.containerd.nri.v1.nri"`, `[plugins.'io.containerd.cri.v1.runtime'.cni]`}},
	} {
		out, err := Runtime{Name: "x", ConfigVersion: tc.version}.config(p)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(out, "%!") {
			t.Errorf("version %d: bad format verbs:\n%s", tc.version, out)
		}
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("version %d config lacks %s:\n%s", tc.version, w, out)
			}
		}
	}
	if _, err := (Runtime{Name: "x", ConfigVersion: 1}).config(p); err == nil {
		t.Error("config version 1: want an error")
	}
}
