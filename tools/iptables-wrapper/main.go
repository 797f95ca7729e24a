// SPDX-License-Identifier: Apache-2.0

// Command iptables-wrapper is podwire-agent's image's iptables, iptables-save,
// iptables-restore and their ip6tables twins (links to it): it runs Debian's
// xtables-nft-multi or xtables-legacy-multi, whichever the host's rules are in, as
// kube-proxy's image does with kubernetes-sigs/iptables-wrappers. A container's tools must
// use the host's mode: iptables-nft rules are invisible to iptables-legacy and the other
// way round, so a GC with the wrong one finds none of portmap's rules.
//
// The mode, decided once per container (the image's root is read-only, so the verdict is
// kept in $TMPDIR, the DaemonSet's emptyDir, instead of relinking the binaries):
//  1. nft if iptables-nft-save shows kube-proxy's KUBE-IPTABLES-HINT or the kubelet's
//     KUBE-KUBELET-CANARY chain in the mangle table, legacy if iptables-legacy-save does;
//  2. else legacy if iptables-legacy-save (IPv4 and IPv6) lists more rules than
//     iptables-nft-save, else nft (also on a host with no rules yet: new hosts are nft).
//
// Then it execs the multi binary in its place, with the name it was called by (the
// multi binaries dispatch on argv[0]): no process of its own stays.
package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// sbin is where the image has the multi binaries (Debian's paths).
const sbin = "/usr/sbin"

func main() {
	name := filepath.Base(os.Args[0])
	if !strings.HasPrefix(name, "iptables") && !strings.HasPrefix(name, "ip6tables") {
		fmt.Fprintf(os.Stderr, "iptables-wrapper: called as %q; it runs as iptables, iptables-save, iptables-restore or an ip6tables one (a link to it)\n", name)
		os.Exit(2)
	}
	mode, err := hostMode()
	if err != nil {
		fmt.Fprintln(os.Stderr, "iptables-wrapper:", err)
		os.Exit(4)
	}
	bin := filepath.Join(sbin, "xtables-"+mode+"-multi")
	argv := append([]string{name}, os.Args[1:]...)
	if err := unix.Exec(bin, argv, os.Environ()); err != nil {
		fmt.Fprintf(os.Stderr, "iptables-wrapper: running %s as %s: %v\n", bin, name, err)
		os.Exit(4)
	}
}

// hostMode is the cached verdict, or a fresh one that is then cached.
func hostMode() (string, error) {
	cache := filepath.Join(os.TempDir(), "podwire-iptables-mode")
	if b, err := os.ReadFile(cache); err == nil {
		if m := strings.TrimSpace(string(b)); m == "nft" || m == "legacy" {
			return m, nil
		}
	}
	m := detect(save)
	// Written to a temporary file and renamed: a concurrent caller reads all or nothing.
	// A read-only or missing TMPDIR only costs the detection again next time.
	tmp := fmt.Sprintf("%s.%d", cache, os.Getpid())
	if err := os.WriteFile(tmp, []byte(m+"\n"), 0o644); err == nil {
		if err := os.Rename(tmp, cache); err != nil {
			_ = os.Remove(tmp)
		}
	}
	return m, nil
}

// detect decides the mode from listings; save(mode, tool, args...) is `<tool> args` of
// xtables-<mode>-multi, "" when it fails (no such table or module in that mode).
func detect(save func(mode, tool string, args ...string) string) string {
	for _, m := range []string{"nft", "legacy"} {
		for _, tool := range []string{"iptables-save", "ip6tables-save"} {
			out := save(m, tool, "-t", "mangle")
			if strings.Contains(out, ":KUBE-IPTABLES-HINT ") || strings.Contains(out, ":KUBE-KUBELET-CANARY ") {
				return m
			}
		}
	}
	rules := map[string]int{}
	for _, m := range []string{"nft", "legacy"} {
		for _, tool := range []string{"iptables-save", "ip6tables-save"} {
			for _, l := range strings.Split(save(m, tool), "\n") {
				if strings.HasPrefix(l, "-") {
					rules[m]++
				}
			}
		}
	}
	if rules["legacy"] > rules["nft"] {
		return "legacy"
	}
	return "nft"
}

func save(mode, tool string, args ...string) string {
	cmd := exec.Command(filepath.Join(sbin, "xtables-"+mode+"-multi"), args...)
	cmd.Args[0] = tool
	var out bytes.Buffer
	cmd.Stdout = &out
	if err := cmd.Run(); err != nil {
		return ""
	}
	return out.String()
}
