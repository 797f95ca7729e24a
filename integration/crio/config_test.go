// SPDX-License-Identifier: Apache-2.0

package crio

import (
	"regexp"
	"strings"
	"testing"
)

// TestConfigPathsBelowDir: every path the config names is below the test's directory,
// except the programs and CNI directories the caller passes and the host's runc and
// conmon, so a private CRI-O never writes a file of the machine's (or of another
// test's CRI-O).
func TestConfigPathsBelowDir(t *testing.T) {
	dir := "/tmp/crio-test-x"
	p := ConfigParams{Paths: PathsIn(dir), Pinns: "/cache/pinns", CNIConfDir: "/tmp/conf", CNIBinDir: "/tmp/bin"}
	cfg, err := Config(p)
	if err != nil {
		t.Fatal(err)
	}
	allowed := map[string]bool{Runc: true, Conmon: true, p.Pinns: true, p.CNIConfDir: true, p.CNIBinDir: true}
	paths := regexp.MustCompile(`"(/[^"]*)"`).FindAllStringSubmatch(cfg, -1)
	if len(paths) < 15 {
		t.Fatalf("config names only %d paths:\n%s", len(paths), cfg)
	}
	for _, m := range paths {
		if !strings.HasPrefix(m[1], dir+"/") && !allowed[m[1]] {
			t.Errorf("config names %s, outside %s", m[1], dir)
		}
	}
	for _, want := range []string{
		`cgroup_manager = "cgroupfs"`, `monitor_cgroup = "pod"`, `default_runtime = "runc"`,
		`enable_nri = false`, `irqbalance_config_restore_file = "disable"`, `listen = "` + dir + `/crio.sock"`,
		`pause_image = "` + SandboxImage + `"`, `network_dir = "/tmp/conf"`, `plugin_dirs = ["/tmp/bin"]`,
	} {
		if !strings.Contains(cfg, want) {
			t.Errorf("config lacks %s:\n%s", want, cfg)
		}
	}
}
