package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/podwire/podwire/pkg/link"
	"github.com/podwire/podwire/pkg/netfilter"
)

// ensureNodeSysctls sets what the node needs for bridged pods: forwarding for the
// families in use when the bridge is the gateway (as the reference), and
// bridge-nf-call-iptables (-ip6tables for IPv6) = 1, the Kubernetes network-plugin
// requirement that lets kube-proxy's rules see bridged traffic.
//
// None of this fails the pod: forwarding and bridge-nf are node-wide settings that an
// operator may manage elsewhere, and a pod on a node without br_netfilter still has
// connectivity. Problems are reported on stderr, which runtimes log.
func ensureNodeSysctls(c *conf, fams netfilter.Families) {
	if c.raw.IsGateway {
		if fams.Has(netfilter.IPv4) {
			warn(link.EnsureSysctl("net/ipv4/ip_forward", "1"))
		}
		if fams.Has(netfilter.IPv6) {
			warn(link.EnsureSysctl("net/ipv6/conf/all/forwarding", "1"))
		}
	}
	if !bridgeNetfilterPresent() {
		if err := loadBrNetfilter(); err != nil {
			warn(fmt.Errorf("net/bridge/bridge-nf-call-iptables is absent and br_netfilter could not be loaded (%v); bridged pod traffic bypasses iptables (kube-proxy); load br_netfilter on the node", err))
			return
		}
	}
	warn(link.EnsureSysctl("net/bridge/bridge-nf-call-iptables", "1"))
	if fams.Has(netfilter.IPv6) {
		warn(link.EnsureSysctl("net/bridge/bridge-nf-call-ip6tables", "1"))
	}
}

func warn(err error) {
	if err != nil {
		fmt.Fprintf(os.Stderr, "bridge: warning: %v\n", err)
	}
}

func bridgeNetfilterPresent() bool {
	_, err := os.Stat("/proc/sys/net/bridge/bridge-nf-call-iptables")
	return err == nil
}

// loadBrNetfilter loads the br_netfilter module without modprobe: finit_module on the
// module file of the running kernel, letting the kernel decompress it. Its dependency
// (bridge) is loaded already, since the bridge device exists.
func loadBrNetfilter() error {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return err
	}
	release := unix.ByteSliceToString(u.Release[:])
	base := filepath.Join("/lib/modules", release, "kernel/net/bridge/br_netfilter.ko")
	for _, ext := range []string{"", ".xz", ".zst", ".gz"} {
		f, err := os.Open(base + ext)
		if err != nil {
			continue
		}
		flags := 0
		if ext != "" {
			flags = unix.MODULE_INIT_COMPRESSED_FILE
		}
		err = unix.FinitModule(int(f.Fd()), "", flags)
		f.Close()
		if err != nil && err != unix.EEXIST {
			return fmt.Errorf("finit_module %s: %w", base+ext, err)
		}
		if !bridgeNetfilterPresent() {
			return fmt.Errorf("br_netfilter loaded but /proc/sys/net/bridge is still absent")
		}
		return nil
	}
	return fmt.Errorf("no br_netfilter module under /lib/modules/%s (%s)", release, strings.TrimSuffix(base, ".ko"))
}
