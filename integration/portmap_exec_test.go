// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/podwire/podwire/integration/nstest"
	"github.com/podwire/podwire/pkg/netfilter"
)

// pmExecLog puts logging wrappers for the iptables tools first in PATH (which libcni
// passes to plugins) and returns a function that returns and clears the log.
func pmExecLog(t *testing.T) func() []string {
	t.Helper()
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	for _, tool := range []string{"iptables", "ip6tables", "iptables-restore", "ip6tables-restore", "iptables-save", "ip6tables-save", "nft"} {
		real, err := exec.LookPath(tool)
		if err != nil {
			continue
		}
		script := fmt.Sprintf("#!/bin/sh\necho \"%s $*\" >> %s\nexec %s \"$@\"\n", tool, log, real)
		if err := os.WriteFile(filepath.Join(dir, tool), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", dir+":"+os.Getenv("PATH"))
	return func() []string {
		b, _ := os.ReadFile(log)
		_ = os.Remove(log)
		var out []string
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if l != "" {
				out = append(out, l)
			}
		}
		return out
	}
}

func pmCount(log []string, tool string) int {
	n := 0
	for _, l := range log {
		if strings.HasPrefix(l, tool+" ") {
			n++
		}
	}
	return n
}

// TestPortmapExecCount counts the iptables tools portmap runs: none at all for an
// attachment without port mappings (ADD, CHECK, DEL) or on the nftables backend. On
// the iptables backend: one iptables-restore per change, one `iptables --version` per
// call (go-iptables' probe), reads of portmap's own chains and -C of its entry jumps
// only, and no ip6tables for a pod without IPv6.
func TestPortmapExecCount(t *testing.T) {
	h := nstest.New(t)
	logged := pmExecLog(t)
	conf := func(backend netfilter.Kind) string {
		return `{"cniVersion":"1.1.0","name":"@PREFIX@net","plugins":[
	 {"type":"bridge","bridge":"@PREFIX@br","isGateway":true,"hairpinMode":true,
	  "ipam":{"type":"host-local","ranges":[[{"subnet":"10.78.0.0/24"}]],"dataDir":"@DATADIR@"}},
	 {"type":"portmap","capabilities":{"portMappings":true},"backend":"` + string(backend) + `"}]}`
	}
	ipt := h.Conflist(conf(netfilter.KindIPTables))
	pmWarmUp(t, h, ipt)
	pmSettle(t, h)
	before := h.Snapshot()
	logged()

	// No port mappings: nothing at all.
	p0 := h.NewPod()
	rt0 := h.RT(p0, "eth0")
	h.MustAdd(ipt, rt0)
	if err := h.Check(ipt, rt0); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	h.MustDel(ipt, rt0)
	if log := logged(); len(log) != 0 {
		t.Errorf("an attachment without port mappings ran:\n%s", strings.Join(log, "\n"))
	}

	p1, p2 := h.NewPod(), h.NewPod()
	rt1, rt2 := h.RT(p1, "eth0", pmMap("tcp:8080:80")), h.RT(p2, "eth0", pmMap("tcp:8081:80", "udp:8081:80"))
	for _, step := range []struct {
		what string
		do   func()
	}{
		{"first ADD on the node", func() { h.MustAdd(ipt, rt1) }},
		{"second ADD", func() { h.MustAdd(ipt, rt2) }},
		{"CHECK", func() {
			if err := h.Check(ipt, rt2); err != nil {
				t.Errorf("CHECK: %v", err)
			}
		}},
		{"DEL of one of two", func() { h.MustDel(ipt, rt1) }},
		{"DEL of the last", func() { h.MustDel(ipt, rt2) }},
	} {
		step.do()
		log := logged()
		t.Logf("%s: %s", step.what, strings.Join(log, " | "))
		restores := 1
		if step.what == "CHECK" {
			restores = 0
		}
		if pmCount(log, "iptables-restore") != restores || pmCount(log, "ip6tables") != 0 || pmCount(log, "ip6tables-restore") != 0 ||
			pmCount(log, "iptables-save") != 0 || len(log) > 8 {
			t.Errorf("%s ran:\n%s", step.what, strings.Join(log, "\n"))
		}
		for _, l := range log {
			if strings.HasPrefix(l, "iptables ") && !strings.Contains(l, "-S CNI-HOSTPORT-") && !strings.Contains(l, " -C ") && l != "iptables --version" &&
				!strings.Contains(l, "-S "+netfilter.HostPortChain(ipt.Name, rt2.ContainerID)) {
				t.Errorf("%s listed more than portmap's own chains: %s", step.what, l)
			}
		}
	}
	// A repeated DEL finds no marker; since the runtime passes portMappings again, the
	// attachment might be the reference portmap's, so portmap looks (per family: the
	// probe, CNI-HOSTPORT-DNAT and the container's chain) but changes nothing.
	h.MustDel(ipt, rt2)
	if log := logged(); pmCount(log, "iptables-restore") != 0 || pmCount(log, "ip6tables-restore") != 0 || len(log) > 6 {
		t.Errorf("a repeated DEL ran:\n%s", strings.Join(log, "\n"))
	}

	// nftables: netlink only.
	nft := h.Conflist(conf(netfilter.KindNFTables))
	p3 := h.NewPod()
	rt3 := h.RT(p3, "eth0", pmMap("tcp:8082:80"))
	h.MustAdd(nft, rt3)
	if err := h.Check(nft, rt3); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	h.MustDel(nft, rt3)
	if log := logged(); len(log) != 0 {
		t.Errorf("the nftables backend ran:\n%s", strings.Join(log, "\n"))
	}
	pmSettle(t, h)
	h.RequireUnchanged(before)
}
