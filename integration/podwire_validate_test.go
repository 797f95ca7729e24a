// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/podwire/podwire/integration/nstest"
)

// validateCase is a realistic mistake: the conflist (or, with a second file, a conf
// dir) and words the finding must contain.
type validateCase struct {
	name   string
	conf   string
	second string // another file in the same dir, for dir-level mistakes
	want   []string
	rt     string // the node's runtime (--runtime); "none" when empty
}

const goodBridge = `{"type":"bridge","bridge":"cni0","isGateway":true,"ipMasq":true,
  "ipam":{"type":"host-local","ranges":[[{"subnet":"10.244.1.0/24"}]]}}`

func conflist(plugins ...string) string {
	return `{"cniVersion":"1.0.0","name":"kubenet","plugins":[` + strings.Join(plugins, ",") + `]}`
}

var validateCases = []validateCase{
	{name: "isGatway typo", conf: conflist(`{"type":"bridge","isGatway":true,"ipam":{"type":"host-local","subnet":"10.1.0.0/24"}}`),
		want: []string{`"isGatway"`, `did you mean "isGateway"`}},
	{name: "ipmasq in the wrong case", conf: conflist(`{"type":"bridge","ipmasq":true}`), want: []string{`did you mean "ipMasq"`}},
	{name: "flat ranges", conf: conflist(`{"type":"bridge","ipam":{"type":"host-local","ranges":[{"subnet":"10.1.0.0/24"}]}}`),
		want: []string{"ranges is a list of range sets", "[[{...}]]"}},
	{name: "portmap without capabilities", conf: conflist(goodBridge, `{"type":"portmap","snat":true}`),
		want: []string{"portMappings", "maps nothing"}},
	{name: "plugin missing from CNI_PATH", conf: conflist(`{"type":"bridg"}`), want: []string{`"bridg" is not in the plugin directories`, `did you mean "bridge"`}},
	{name: "duplicate network names in a dir", conf: conflist(goodBridge), second: conflist(goodBridge),
		want: []string{`network "kubenet" is also defined by`, "never used"}},
	{name: "no name", conf: `{"cniVersion":"1.0.0","plugins":[` + goodBridge + `]}`, want: []string{`no "name"`}},
	{name: "cniVersion podwire does not speak", conf: strings.Replace(conflist(goodBridge), "1.0.0", "2.0.0", 1),
		want: []string{`cniVersion "2.0.0"`}},
	{name: "subnet prefix too long", conf: conflist(`{"type":"bridge","ipam":{"type":"host-local","ranges":[[{"subnet":"10.1.0.0/33"}]]}}`),
		want: []string{"host-local refuses it", "10.1.0.0/33"}},
	{name: "rangeStart outside the subnet", conf: conflist(`{"type":"bridge","ipam":{"type":"host-local","ranges":[[{"subnet":"10.1.0.0/24","rangeStart":"10.2.0.10"}]]}}`),
		want: []string{"host-local refuses it", "10.2.0.10"}},
	{name: "boolean in quotes", conf: conflist(`{"type":"bridge","isGateway":"true"}`), want: []string{`"isGateway" must be true or false`}},
	{name: "bandwidth before bridge", conf: conflist(`{"type":"bandwidth","capabilities":{"bandwidth":true}}`, goodBridge),
		want: []string{"bandwidth is a chained plugin", "must come after"}},
	{name: "ipMasqBackend nft", conf: conflist(`{"type":"bridge","ipMasq":true,"ipMasqBackend":"nft"}`), want: []string{`"ipMasqBackend" must be "iptables" or "nftables"`, `"nft"`}},
	{name: "portmap backend nft", conf: conflist(goodBridge, `{"type":"portmap","backend":"nft","capabilities":{"portMappings":true}}`),
		want: []string{`"backend" must be "iptables" or "nftables"`}},
	{name: "subent in a range", conf: conflist(`{"type":"bridge","ipam":{"type":"host-local","ranges":[[{"subent":"10.1.0.0/24"}]]}}`),
		want: []string{`ranges[0][0].subent`, `did you mean "subnet"`}},
	{name: "datadir in the wrong case", conf: conflist(`{"type":"bridge","ipam":{"type":"host-local","datadir":"/var/lib/x","ranges":[[{"subnet":"10.1.0.0/24"}]]}}`),
		want: []string{`did you mean "dataDir"`}},
	{name: "plugin instead of plugins", conf: `{"cniVersion":"1.0.0","name":"kubenet","plugin":[` + goodBridge + `]}`,
		want: []string{`did you mean "plugins"`}},
	{name: "trailing comma", conf: `{"cniVersion":"1.0.0","name":"kubenet","plugins":[` + goodBridge + `,]}`, want: []string{"not valid JSON", "line 2"}},
	{name: "portMapping capability", conf: conflist(goodBridge, `{"type":"portmap","capabilities":{"portMapping":true}}`),
		want: []string{`unknown capability "portMapping"`, `did you mean "portMappings"`}},
	{name: "empty plugins", conf: `{"cniVersion":"1.0.0","name":"kubenet","plugins":[]}`, want: []string{`"plugins" is empty`}},
	{name: "bandwidth without capabilities", conf: conflist(goodBridge, `{"type":"bandwidth"}`), want: []string{"shapes nothing"}},
	{name: "cniVersion 1.1.0 with containerd 1.6", conf: strings.Replace(conflist(goodBridge), "1.0.0", "1.1.0", 1), rt: "containerd=1.6.20",
		want: []string{"containerd 1.6.20", "refuses 1.1.0 for every pod", `"cniVersion": "1.0.0"`}},
	{name: "ipam not an object", conf: conflist(`{"type":"bridge","ipam":"host-local"}`), want: []string{`"ipam" must be an object`}},
}

// TestPodwireValidate runs podwire validate on each realistic mistake (it must fail
// and say what is wrong in the conflist's words) and on every conf-example (it must
// pass without an error or warning on a runtime that takes their cniVersion).
func TestPodwireValidate(t *testing.T) {
	bin, err := nstest.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	if len(validateCases) < 15 {
		t.Fatalf("only %d cases", len(validateCases))
	}
	for _, tc := range validateCases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			target := filepath.Join(dir, "10-net.conflist")
			if err := os.WriteFile(target, []byte(tc.conf), 0o644); err != nil {
				t.Fatal(err)
			}
			if tc.second != "" {
				if err := os.WriteFile(filepath.Join(dir, "20-net.conflist"), []byte(tc.second), 0o644); err != nil {
					t.Fatal(err)
				}
				target = dir
			}
			rt := tc.rt
			if rt == "" {
				rt = "none"
			}
			out, errs, code := runCLI(t, "", "validate", "--bin-dir", bin, "--runtime", rt, target)
			if code != 1 {
				t.Errorf("exit %d, want 1\n%s%s", code, out, errs)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
		})
	}
	root, err := nstest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	// The examples are at 1.0.0, which every runtime takes: containerd 1.6 (Debian 12's)
	// as much as 2.1.
	for _, rt := range []string{"containerd=1.6.20", "containerd=2.1.0"} {
		out, errs, code := runCLI(t, "", "validate", "--bin-dir", bin, "--runtime", rt, filepath.Join(root, "conf-examples"))
		if code != 0 || !strings.Contains(out, "0 errors") {
			t.Errorf("conf-examples with %s: exit %d\n%s%s", rt, code, out, errs)
		}
	}
}
