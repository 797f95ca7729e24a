// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/podwire/podwire/pkg/netfilter"
	"github.com/podwire/podwire/pkg/portstate"
)

// Check is one line of doctor's report.
type Check struct {
	Name   string `json:"check"`
	Status string `json:"status"` // ok, info, warning, problem
	Detail string `json:"detail"`
}

// doctor reads the current network namespace and the files of this node; procRoot is
// where /proc/sys is (tests point it nowhere else: sysctls are per netns).
type doctor struct {
	nd     *node
	rt     runtimeFlags
	checks []Check
}

func (d *doctor) add(name, status, format string, a ...any) {
	d.checks = append(d.checks, Check{name, status, fmt.Sprintf(format, a...)})
}

func runDoctor(args []string, out io.Writer) error {
	fs := newFlags("doctor")
	nd := nodeFlags(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	d := &doctor{nd: nd}
	d.rt.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx := context.Background()
	nets, err := nd.networks("")
	if err != nil {
		d.add("networks", "problem", "%v", err)
	}
	d.netfilter()
	d.sysctls(nets)
	d.localnet()
	d.markChains(nets)
	d.runtimes(ctx)
	problems := 0
	for _, c := range d.checks {
		if c.Status == "problem" {
			problems++
		}
	}
	if *asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(struct {
			Checks []Check `json:"checks"`
		}{d.checks}); err != nil {
			return err
		}
	} else {
		w := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
		for _, c := range d.checks {
			fmt.Fprintf(w, "%s\t%s\t%s\n", strings.ToUpper(c.Status), c.Name, c.Detail)
		}
		w.Flush()
	}
	if problems > 0 {
		return errFindings
	}
	return nil
}

func (d *doctor) netfilter() {
	for _, fam := range []netfilter.Family{netfilter.IPv4, netfilter.IPv6} {
		name := map[netfilter.Family]string{netfilter.IPv4: "iptables", netfilter.IPv6: "ip6tables"}[fam]
		i := netfilter.ProbeIPTables(fam)
		if i.Path == "" {
			d.add(name, "info", "not installed: the iptables backends (the reference's default for portmap and ipMasq) are unavailable; nftables is used")
			continue
		}
		d.add(name, "ok", "%s, %s flavour, version %s", i.Path, i.Flavour, i.Version)
	}
	if netfilter.ProbeHost().NFTables {
		d.add("nftables", "ok", "the kernel answers nf_tables requests")
	} else {
		d.add("nftables", "warning", "the kernel does not answer nf_tables requests: ipMasqBackend/backend \"nftables\" and macspoofchk cannot work; load nf_tables or use iptables")
	}
}

// readSysctl reads /proc/sys/<path>; ok is false when it does not exist.
func readSysctl(path string) (string, bool) {
	b, err := os.ReadFile(filepath.Join("/proc/sys", path))
	if err != nil {
		return "", false
	}
	return strings.TrimSpace(string(b)), true
}

func usesBridge(nets []network) bool {
	for _, n := range nets {
		if m, _ := plugin(n.List, "bridge"); m != nil {
			return true
		}
	}
	return len(nets) == 0
}

func (d *doctor) sysctls(nets []network) {
	bridged := usesBridge(nets)
	for _, k := range []string{"bridge-nf-call-iptables", "bridge-nf-call-ip6tables"} {
		v, ok := readSysctl("net/bridge/" + k)
		switch {
		case !ok && bridged:
			d.add("br_netfilter", "problem", "net.bridge.%s is absent in this network namespace: br_netfilter is not loaded, so traffic between pods on one bridge bypasses iptables/nftables (Kubernetes Services and hostPort hairpin fail); run modprobe br_netfilter and persist it in /etc/modules-load.d", k)
		case !ok:
			d.add("br_netfilter", "info", "net.bridge.%s is absent (br_netfilter not loaded); no network here uses a bridge", k)
		case v != "1" && bridged:
			d.add("br_netfilter", "problem", "net.bridge.%s is %s: bridged pod traffic bypasses the netfilter rules Services and hostPort hairpin need; set it to 1 (sysctl -w net.bridge.%s=1, and in /etc/sysctl.d)", k, v, k)
		default:
			d.add("br_netfilter", "ok", "net.bridge.%s = %s", k, v)
		}
	}
	v, _ := readSysctl("net/ipv4/ip_forward")
	if v == "1" {
		d.add("ip_forward", "ok", "net.ipv4.ip_forward = 1")
	} else {
		d.add("ip_forward", "warning", "net.ipv4.ip_forward = %s: pods cannot reach beyond the node until something sets it (bridge sets it on ADD with isGateway; kubelet and most installers set it at boot)", v)
	}
}

func (d *doctor) localnet() {
	users, set, err := portstate.LocalnetUsers(portstate.DefaultDir)
	if err != nil {
		d.add("route_localnet", "warning", "%v", err)
		return
	}
	if len(users) == 0 {
		d.add("route_localnet", "ok", "no interface has route_localnet on for portmap")
		return
	}
	var ifs []string
	for i := range users {
		ifs = append(ifs, i)
	}
	sort.Strings(ifs)
	for _, i := range ifs {
		v, ok := readSysctl("net/ipv4/conf/" + i + "/route_localnet")
		if !ok {
			v = "absent (the interface is not in this network namespace)"
		}
		who := "set by someone else (kube-proxy or the operator); portmap leaves it alone"
		if set[i] {
			who = "turned on by portmap; off again with its last user"
		}
		d.add("route_localnet", "info", "%s: route_localnet = %s for %d attachments with host ports via 127.0.0.1 (%s)", i, v, len(users[i]), who)
	}
}

// markChains checks that the chains portmap's externalSetMarkChain names exist: with
// a missing chain every ADD with host ports fails.
func (d *doctor) markChains(nets []network) {
	for _, n := range nets {
		m, _ := plugin(n.List, "portmap")
		chain := str(m, "externalSetMarkChain")
		if chain == "" {
			continue
		}
		for _, fam := range []netfilter.Family{netfilter.IPv4, netfilter.IPv6} {
			if netfilter.ProbeIPTables(fam).Path == "" {
				continue
			}
			ok, err := netfilter.ChainExists(fam, "nat", chain)
			switch {
			case err != nil:
				d.add("externalSetMarkChain", "warning", "network %s: looking up %s in the %s nat table: %v", n.List.Name, chain, fam, err)
			case !ok:
				d.add("externalSetMarkChain", "problem", "network %s: portmap's externalSetMarkChain %s does not exist in the %s nat table: every ADD with host ports fails until kube-proxy (iptables mode) creates it; start kube-proxy, or drop externalSetMarkChain to let portmap masquerade itself", n.List.Name, chain, fam)
			default:
				d.add("externalSetMarkChain", "ok", "network %s: %s exists in the %s nat table", n.List.Name, chain, fam)
			}
		}
	}
}

// runtimes reports the container runtime found (CRI Version RPC, else binaries)
// and what its CNI layer does (pkg/runtimes).
func (d *doctor) runtimes(ctx context.Context) {
	found, errs := d.rt.detect(ctx)
	defer d.crio(found)
	for _, err := range errs {
		d.add("runtime", "warning", "%v", err)
	}
	for _, r := range found {
		d.add("runtime", "info", "%s via %s%s", r, r.Via, runtimeGC(r))
	}
	if len(found) == 0 && len(d.rt.given) == 0 {
		d.add("runtime", "info", "no container runtime found (no CRI socket answers, no containerd or crio in PATH); pass --cri SOCKET")
	}
}

// versionWord picks the first word of line that looks like a version.
func versionWord(line string) string {
	for _, w := range strings.Fields(line) {
		w = strings.TrimPrefix(w, "v")
		if len(w) > 0 && w[0] >= '0' && w[0] <= '9' && strings.Contains(w, ".") {
			return w
		}
	}
	return ""
}
