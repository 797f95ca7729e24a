// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

const cgroupFS = "/sys/fs/cgroup"

// pinDir makes the run dir's ns/ a private mount of its own: a namespace can be pinned
// by a bind mount only on a mount that does not propagate (the machine's / is shared).
func (s *State) pinDir() error {
	dir := filepath.Join(s.Plan.Dir, "ns")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if !isMountpoint(dir) {
		if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind-mounting %s onto itself: %w", dir, err)
		}
		if err := s.add(&s.Mounts, dir); err != nil {
			return err
		}
	}
	if err := unix.Mount("", dir, "", unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making %s private: %w", dir, err)
	}
	return nil
}

// segment makes the nodes' L2 segment: a bridge in the machine's netns holding the
// control plane's address.
func (s *State) segment() error {
	p := s.Plan
	br, err := netlink.LinkByName(p.Bridge)
	if err != nil {
		attrs := netlink.NewLinkAttrs()
		attrs.Name = p.Bridge
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: attrs}); err != nil {
			return fmt.Errorf("creating bridge %s: %w", p.Bridge, err)
		}
		if err := s.add(&s.Links, p.Bridge); err != nil {
			return err
		}
		if br, err = netlink.LinkByName(p.Bridge); err != nil {
			return err
		}
	} else if !containsStr(s.Links, p.Bridge) {
		return fmt.Errorf("a link %s exists that this lab did not make: remove it or choose another prefix", p.Bridge)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: p.HostIP.AsSlice(), Mask: net.CIDRMask(p.Segment.Bits(), 32)}}
	if err := netlink.AddrReplace(br, addr); err != nil {
		return fmt.Errorf("addressing %s: %w", p.Bridge, err)
	}
	return netlink.LinkSetUp(br)
}

// nodeNetNS pins n's network namespace, wires it to the segment with a veth pair
// (eth0 inside, n.HostEnd on the bridge) and routes it through the machine's side.
func (s *State) nodeNetNS(n Node) error {
	if !isMountpoint(n.NetNS) {
		if err := touch(n.NetNS); err != nil {
			return err
		}
		if _, err := run("unshare", "--net="+n.NetNS, "true"); err != nil {
			return fmt.Errorf("pinning node %s's network namespace: %w", n.Name, err)
		}
		if err := s.add(&s.Mounts, n.NetNS); err != nil {
			return err
		}
	}
	netns, err := ns.GetNS(n.NetNS)
	if err != nil {
		return err
	}
	defer netns.Close()
	if _, err := netlink.LinkByName(n.HostEnd); err != nil {
		attrs := netlink.NewLinkAttrs()
		attrs.Name = n.HostEnd
		peer := n.HostEnd + "p"
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: peer}); err != nil {
			return fmt.Errorf("creating veth %s: %w", n.HostEnd, err)
		}
		if err := s.add(&s.Links, n.HostEnd); err != nil {
			return err
		}
		pl, err := netlink.LinkByName(peer)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetNsFd(pl, int(netns.Fd())); err != nil {
			return fmt.Errorf("moving %s into node %s: %w", peer, n.Name, err)
		}
		if err := netns.Do(func(ns.NetNS) error {
			l, err := netlink.LinkByName(peer)
			if err != nil {
				return err
			}
			return netlink.LinkSetName(l, "eth0")
		}); err != nil {
			return err
		}
	}
	host, err := netlink.LinkByName(n.HostEnd)
	if err != nil {
		return err
	}
	br, err := netlink.LinkByName(s.Plan.Bridge)
	if err != nil {
		return err
	}
	if err := netlink.LinkSetMaster(host, br); err != nil {
		return err
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return err
	}
	return netns.Do(func(ns.NetNS) error {
		for _, name := range []string{"lo", "eth0"} {
			l, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
		}
		eth0, _ := netlink.LinkByName("eth0")
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: n.IP.AsSlice(), Mask: net.CIDRMask(s.Plan.Segment.Bits(), 32)}}
		if err := netlink.AddrReplace(eth0, addr); err != nil {
			return fmt.Errorf("addressing node %s: %w", n.Name, err)
		}
		def := &netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: s.Plan.HostIP.AsSlice()}
		if err := netlink.RouteReplace(def); err != nil {
			return fmt.Errorf("node %s's default route: %w", n.Name, err)
		}
		// A node forwards for its pods; the value is the node netns's own.
		return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644)
	})
}

// nodeMountNS pins n's mount namespace and binds the node's directories and kernel
// sysctl files into it. It is private, not a slave of the machine's: on a shared machine
// other work mounts over /run/containerd and the like, and as a slave the node received
// those mounts over its own binds (its CRI socket vanished under a running kubelet).
func (s *State) nodeMountNS(n Node) error {
	if !isMountpoint(n.MountNS) {
		if err := touch(n.MountNS); err != nil {
			return err
		}
		if _, err := run("unshare", "--mount="+n.MountNS, "--propagation", "private", "true"); err != nil {
			return fmt.Errorf("pinning node %s's mount namespace: %w", n.Name, err)
		}
		if err := s.add(&s.Mounts, n.MountNS); err != nil {
			return err
		}
		// Then shared again, in peer groups of the node's own (nothing reaches the
		// machine): containerd refuses a HostToContainer volume (podwire-agent's
		// /run/netns) whose source mount, or one below the node's bind, is private.
		if _, err := run("nsenter", "--mount="+n.MountNS, "--", "mount", "--make-rshared", "/"); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	for _, target := range NodeDirs {
		src := n.Path("fs", target)
		if err := os.MkdirAll(src, 0o755); err != nil {
			return err
		}
		if err := s.machineDir(target); err != nil {
			return err
		}
		if _, err := run("nsenter", "--mount="+n.MountNS, "--", "mount", "--bind", src, target); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
		// Shared inside the node (a new peer group: nothing reaches the machine): the kubelet and containerd refuse mountPropagation
		// (podwire-agent's /run/netns is HostToContainer) on a private source.
		if _, err := run("nsenter", "--mount="+n.MountNS, "--", "mount", "--make-shared", target); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	for file, value := range KernelSysctls {
		src := n.Path("sysctl", strings.ReplaceAll(strings.TrimPrefix(file, "/proc/sys/"), "/", "."))
		if err := os.MkdirAll(filepath.Dir(src), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(src, []byte(value+"\n"), 0o644); err != nil {
			return err
		}
		if _, err := run("nsenter", "--mount="+n.MountNS, "--", "mount", "--bind", src, file); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	return nil
}

// machineDir makes the bind target dir on the machine if it is missing, and records it
// (Down removes it again when it is empty).
func (s *State) machineDir(dir string) error {
	var missing []string
	for d := dir; d != "/"; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil {
			break
		}
		missing = append(missing, d)
	}
	for i := len(missing) - 1; i >= 0; i-- {
		if err := os.Mkdir(missing[i], 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
		if err := s.add(&s.Dirs, missing[i]); err != nil {
			return err
		}
	}
	return nil
}

// hierarchies are the cgroup hierarchies mounted under /sys/fs/cgroup (this machine is
// cgroup v1, hybrid: each controller its own, plus name=systemd and the unified one).
func hierarchies() ([]string, error) {
	ents, err := os.ReadDir(cgroupFS)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() && isMountpoint(filepath.Join(cgroupFS, e.Name())) {
			out = append(out, filepath.Join(cgroupFS, e.Name()))
		}
	}
	sort.Strings(out)
	return out, nil
}

// cgroup makes path in every hierarchy (a cpuset cgroup starts with no CPUs and no
// memory nodes: they are copied from the parent).
func (s *State) cgroup(path string) error {
	hs, err := hierarchies()
	if err != nil {
		return err
	}
	for _, h := range hs {
		dir := filepath.Join(h, path)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("creating cgroup %s: %w", dir, err)
		}
		if filepath.Base(h) == "cpuset" {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				b, err := os.ReadFile(filepath.Join(filepath.Dir(dir), f))
				if err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
					return fmt.Errorf("%s/%s: %w", dir, f, err)
				}
			}
		}
	}
	return s.add(&s.Cgroups, path)
}

// enterCgroup moves pid into path in every hierarchy; its later children start there.
func enterCgroup(path string, pid int) error {
	hs, err := hierarchies()
	if err != nil {
		return err
	}
	for _, h := range hs {
		if err := os.WriteFile(filepath.Join(h, path, "cgroup.procs"), []byte(fmt.Sprint(pid)), 0o644); err != nil {
			return fmt.Errorf("moving pid %d into %s%s: %w", pid, h, path, err)
		}
	}
	return nil
}

func isMountpoint(path string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	clean := filepath.Clean(path)
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && unescapeMount(f[4]) == clean {
			return true
		}
	}
	return false
}

// unescapeMount undoes mountinfo's octal escapes of space, tab, newline and backslash.
func unescapeMount(s string) string {
	r := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	return r.Replace(s)
}

func touch(file string) error {
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(file, os.O_CREATE|os.O_RDONLY, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}

func containsStr(list []string, v string) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}
