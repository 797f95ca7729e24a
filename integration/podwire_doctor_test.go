// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/podwire/podwire/integration/nstest"
)

// TestPodwireDoctor runs podwire doctor in a test namespace where bridge-nf-call-
// iptables is 0 (or absent without br_netfilter) and KUBE-MARK-MASQ, which the
// network's portmap names as externalSetMarkChain, does not exist: both must be
// problems. With the sysctl at 1 and the chain made, both must be ok.
func TestPodwireDoctor(t *testing.T) {
	h := nstest.New(t)
	confDir := t.TempDir()
	conf := strings.ReplaceAll(`{"cniVersion":"1.0.0","name":"@PREFIX@net","plugins":[
	 {"type":"bridge","bridge":"@PREFIX@br","ipam":{"type":"host-local","ranges":[[{"subnet":"10.58.0.0/24"}]]}},
	 {"type":"portmap","capabilities":{"portMappings":true},"externalSetMarkChain":"KUBE-MARK-MASQ"}]}`, "@PREFIX@", h.Prefix)
	if err := os.WriteFile(filepath.Join(confDir, "10-net.conflist"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	const knob = "/proc/sys/net/bridge/bridge-nf-call-iptables"
	_, statErr := nstest.RunIn(h.HostNS, "test", "-e", knob)
	brNetfilter := statErr == nil
	if brNetfilter {
		h.Run(h.HostNS, "sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=0")
	}
	doctor := func() map[string][]cliCheck {
		out, errs, code := runCLI(t, h.HostNS.Path(), "doctor", "--json", "--conf-dir", confDir, "--bin-dir", h.BinDir, "--cri", filepath.Join(t.TempDir(), "none.sock"))
		if code > 1 {
			t.Fatalf("doctor: exit %d\n%s%s", code, out, errs)
		}
		var rep struct {
			Checks []cliCheck `json:"checks"`
		}
		cliJSONText(t, out, &rep)
		by := map[string][]cliCheck{}
		for _, c := range rep.Checks {
			by[c.Name] = append(by[c.Name], c)
		}
		return by
	}
	has := func(cs []cliCheck, status, word string) bool {
		for _, c := range cs {
			if c.Status == status && strings.Contains(c.Detail, word) {
				return true
			}
		}
		return false
	}
	by := doctor()
	if !has(by["br_netfilter"], "problem", "bridge-nf-call-iptables") {
		t.Errorf("doctor does not report bridge-nf-call-iptables (br_netfilter loaded: %v): %+v", brNetfilter, by["br_netfilter"])
	}
	if !has(by["externalSetMarkChain"], "problem", "KUBE-MARK-MASQ does not exist") {
		t.Errorf("doctor does not report the missing KUBE-MARK-MASQ: %+v", by["externalSetMarkChain"])
	}
	if !has(by["iptables"], "ok", "flavour") && !has(by["iptables"], "info", "not installed") {
		t.Errorf("doctor does not report iptables: %+v", by["iptables"])
	}
	h.Run(h.HostNS, "iptables", "-t", "nat", "-N", "KUBE-MARK-MASQ")
	h.Run(h.HostNS, "ip6tables", "-t", "nat", "-N", "KUBE-MARK-MASQ")
	if brNetfilter {
		h.Run(h.HostNS, "sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=1")
	}
	by = doctor()
	if brNetfilter && !has(by["br_netfilter"], "ok", "bridge-nf-call-iptables = 1") {
		t.Errorf("bridge-nf-call-iptables is 1 now: %+v", by["br_netfilter"])
	}
	if has(by["externalSetMarkChain"], "problem", "") || !has(by["externalSetMarkChain"], "ok", "KUBE-MARK-MASQ exists") {
		t.Errorf("KUBE-MARK-MASQ exists now: %+v", by["externalSetMarkChain"])
	}
}
