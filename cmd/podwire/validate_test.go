// SPDX-License-Identifier: Apache-2.0

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The plugins' binaries only need to exist for validate; these are empty files.
func fakeBinDir(t *testing.T) string {
	dir := t.TempDir()
	for _, p := range []string{"bridge", "host-local", "portmap", "bandwidth", "loopback"} {
		if err := os.WriteFile(filepath.Join(dir, p), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestValidateFindings(t *testing.T) {
	bin := fakeBinDir(t)
	for _, tc := range []struct {
		name, conf string
		want       []string // substrings of the findings; none: no finding at all
	}{
		{"good", `{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge","ipam":{"type":"host-local","ranges":[[{"subnet":"10.1.0.0/24"}]]}},{"type":"portmap","capabilities":{"portMappings":true}}]}`, nil},
		{"logFile, logLevel and logMaxBytes are known", `{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"loopback","logFile":"/var/log/podwire.log","logLevel":"debug","logMaxBytes":1048576}]}`, nil},
		{"foreign plugin keys are not judged", `{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge"},{"type":"portmap","capabilities":{"portMappings":true}},{"type":"loopback"},{"type":"bandwidth","capabilities":{"bandwidth":true},"foo":1}]}`,
			[]string{`unknown key "foo"`}},
		{"nested typo", `{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge","ipam":{"type":"host-local","rnages":[[{"subnet":"10.1.0.0/24"}]]}}]}`,
			[]string{`plugins[0] (bridge).ipam.rnages`, `did you mean "ranges"`}},
		{"a .conf file", `{"cniVersion":"1.0.0","name":"n","type":"bridge","isGatway":true}`, []string{`did you mean "isGateway"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ext := ".conflist"
			if strings.HasPrefix(tc.name, "a .conf") {
				ext = ".conf"
			}
			f := filepath.Join(t.TempDir(), "10-n"+ext)
			if err := os.WriteFile(f, []byte(tc.conf), 0o644); err != nil {
				t.Fatal(err)
			}
			v := &validator{binDirs: []string{bin}}
			if err := v.path(f); err != nil {
				t.Fatal(err)
			}
			var text []string
			for _, fd := range v.findings {
				text = append(text, fd.String())
			}
			all := strings.Join(text, "\n")
			if len(tc.want) == 0 && len(text) > 0 {
				t.Errorf("want no findings, got:\n%s", all)
			}
			for _, w := range tc.want {
				if !strings.Contains(all, w) {
					t.Errorf("findings lack %q:\n%s", w, all)
				}
			}
		})
	}
}

func TestRuntimeVerdicts(t *testing.T) {
	old := []foundRuntime{{"containerd", "1.6.20", "--runtime"}}
	if errs, _ := runtimeVerdicts(old, "1.1.0"); len(errs) != 1 || !strings.Contains(errs[0], "refuses 1.1.0") {
		t.Errorf("containerd 1.6 and 1.1.0: %v", errs)
	}
	if errs, notes := runtimeVerdicts(old, "1.0.0"); len(errs) != 0 || len(notes) != 1 {
		t.Errorf("containerd 1.6 and 1.0.0: %v %v", errs, notes)
	}
	if errs, notes := runtimeVerdicts([]foundRuntime{{"containerd", "2.1.0", ""}}, "1.1.0"); len(errs)+len(notes) != 0 {
		t.Errorf("containerd 2.1 and 1.1.0: %v %v", errs, notes)
	}
}
