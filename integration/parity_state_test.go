// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podwire/podwire/integration/nodestate"
	"github.com/podwire/podwire/integration/nstest"
)

// This file is the parity test's machinery: a libcni Exec that records what every
// plugin printed, a wait for the kernel to finish what it does after a link comes up,
// and the normalization that makes two runs in different namespaces comparable.

// recorder is libcni's default Exec, keeping each plugin's stdout (or the fact that it
// failed) in call order.
type recorder struct {
	invoke.RawExec
	version.PluginDecoder
	mu    sync.Mutex
	calls []call
}

type call struct {
	verb, plugin string
	stdout       []byte
	failed       bool
}

func newRecorder() *recorder { return &recorder{RawExec: invoke.RawExec{Stderr: nil}} }

func (r *recorder) ExecPlugin(ctx context.Context, path string, stdin []byte, environ []string) ([]byte, error) {
	out, err := r.RawExec.ExecPlugin(ctx, path, stdin, environ)
	verb := ""
	for _, kv := range environ {
		if v, ok := strings.CutPrefix(kv, "CNI_COMMAND="); ok {
			verb = v
		}
	}
	r.mu.Lock()
	r.calls = append(r.calls, call{verb: verb, plugin: filepath.Base(path), stdout: out, failed: err != nil})
	r.mu.Unlock()
	return out, err
}

func (r *recorder) Decode(b []byte) (version.PluginInfo, error) { return r.PluginDecoder.Decode(b) }

// take returns the calls recorded since the last take.
func (r *recorder) take() []call {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.calls
	r.calls = nil
	return c
}

// settle waits until the kernel has caught up with the links' carrier changes in each
// namespace: linkwatch updates a link's operational state (and, with it, adds the IPv6
// link-local address) up to a second after the carrier changed, which would otherwise
// make two snapshots of the same state differ.
func settle(t *testing.T, nss ...ns.NetNS) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		pending := ""
		for _, n := range nss {
			_ = n.Do(func(ns.NetNS) error {
				links, err := netlinksafe.LinkList()
				if err != nil {
					pending = err.Error()
					return nil
				}
				for _, l := range links {
					a := l.Attrs()
					if a.Flags&net.FlagUp == 0 || a.Flags&net.FlagLoopback != 0 || a.OperState == netlink.OperUnknown {
						continue
					}
					if carrier := a.RawFlags&unix.IFF_LOWER_UP != 0; carrier != (a.OperState == netlink.OperUp) {
						pending = fmt.Sprintf("%s: carrier %v, operstate %s", a.Name, carrier, a.OperState)
						syncLinkwatch(a.Name)
					}
				}
				return nil
			})
		}
		if pending == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("links did not settle: %s", pending)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// syncLinkwatch asks the kernel for the link state of dev (ETHTOOL_GLINK), which makes
// linkwatch process dev's pending carrier change now instead of within the second it
// may wait (a bridge losing its last port is not urgent to it). Errors do not matter:
// settle polls anyway.
func syncLinkwatch(dev string) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	value := struct{ cmd, data uint32 }{cmd: unix.ETHTOOL_GLINK}
	var ifr struct {
		name [unix.IFNAMSIZ]byte
		data unsafe.Pointer
		_    [16]byte
	}
	copy(ifr.name[:], dev)
	ifr.data = unsafe.Pointer(&value)
	_, _, _ = unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr)))
}

// normalizer rewrites what legitimately differs between two runs of the same
// configuration in different namespaces: namespace paths, generated veth names, MACs
// (each becomes the link that has it, e.g. <mac host/veth@>), IPv6 link-local
// addresses (derived from MACs), interface indexes and timers.
type normalizer struct {
	paths *strings.Replacer
	macs  map[string]string
}

var (
	vethNameRe  = regexp.MustCompile(`\bveth(?:[0-9a-f]{8}|[0-9a-f]{11})\b`)
	macRe       = regexp.MustCompile(`\b[0-9a-f]{1,2}(?::[0-9a-f]{1,2}){5}\b`)
	linkLocalRe = regexp.MustCompile(`\bfe80::[0-9a-f]+(?::[0-9a-f]+)*`)
	peerIndexRe = regexp.MustCompile(`@if\d+\b`)
	netnsidRe   = regexp.MustCompile(`link-netnsid \d+`)
	timerRe     = regexp.MustCompile(`\b(\w+_timer)\s+[\d.]+`)
	tentativeRe = regexp.MustCompile(` tentative\b`)
)

// newNormalizer labels the MACs of every link in pod and host as they are now.
func newNormalizer(t *testing.T, h *nstest.H, pod ns.NetNS) *normalizer {
	t.Helper()
	n := &normalizer{
		paths: strings.NewReplacer(pod.Path(), "@PODNS@", h.HostNS.Path(), "@HOSTNS@", h.DataDir, "@DATADIR@",
			filepath.Base(pod.Path()), "@PODNS@", filepath.Base(h.HostNS.Path()), "@HOSTNS@"),
		macs: map[string]string{},
	}
	for _, side := range []struct {
		label string
		n     ns.NetNS
	}{{"pod", pod}, {"host", h.HostNS}} {
		var names []string
		byName := map[string]string{}
		err := side.n.Do(func(ns.NetNS) error {
			links, err := netlinksafe.LinkList()
			for _, l := range links {
				name := vethNameRe.ReplaceAllString(l.Attrs().Name, "veth@")
				names = append(names, name)
				byName[name] = l.Attrs().HardwareAddr.String()
			}
			return err
		})
		if err != nil {
			t.Fatalf("listing links in %s: %v", side.label, err)
		}
		sort.Strings(names)
		for _, name := range names {
			mac := byName[name]
			if _, seen := n.macs[mac]; !seen && mac != "" && mac != "00:00:00:00:00:00" && mac != parityMAC {
				n.macs[mac] = "<mac " + side.label + "/" + name + ">"
			}
		}
	}
	return n
}

func (n *normalizer) text(s string) string {
	s = n.paths.Replace(s)
	s = vethNameRe.ReplaceAllString(s, "veth@")
	s = linkLocalRe.ReplaceAllString(s, "fe80::@")
	s = macRe.ReplaceAllStringFunc(s, func(m string) string {
		parts := strings.Split(m, ":")
		for i, p := range parts {
			if len(p) == 1 {
				parts[i] = "0" + p
			}
		}
		canon := strings.Join(parts, ":")
		if l, ok := n.macs[canon]; ok {
			return l
		}
		if canon == "ff:ff:ff:ff:ff:ff" || canon == "00:00:00:00:00:00" {
			return canon
		}
		return "<mac ?>"
	})
	s = peerIndexRe.ReplaceAllString(s, "@if?")
	s = netnsidRe.ReplaceAllString(s, "link-netnsid ?")
	s = timerRe.ReplaceAllString(s, "$1")
	return tentativeRe.ReplaceAllString(s, "")
}

// paritySections are the sections compared between the two implementations: the
// kernel state the plugins set up for a pod (links with their type, master, MTU and
// txqueuelen, addresses, routes, sysctls; issue 15) and the lease files. Firewall rules
// and qdiscs are podwire's own layouts by design (owner-tagged rules, clsact and
// peak-rate TBFs; see the portmap and bandwidth READMEs); for them the test requires
// only that DEL leaves nothing of the pod, whichever implementation made it.
var paritySections = []string{"link-attrs", "addrs", "routes4", "routes6", "sysctl-all", "leases"}

// compared is the part of s that paritySections name.
func compared(s nodestate.Snapshot) nodestate.Snapshot {
	out := nodestate.Snapshot{}
	for _, side := range []string{"pod", "host"} {
		for _, k := range paritySections {
			if v, ok := s[side+" "+k]; ok {
				out[side+" "+k] = v
			}
		}
	}
	return out
}

// linkAttrs lists each link of netns n with what the plugins set on it: type, master,
// MTU, txqueuelen, admin state, MAC (normalized later), promiscuity.
func linkAttrs(t *testing.T, n ns.NetNS) string {
	t.Helper()
	var lines []string
	err := n.Do(func(ns.NetNS) error {
		links, err := netlinksafe.LinkList()
		if err != nil {
			return err
		}
		names := map[int]string{}
		for _, l := range links {
			names[l.Attrs().Index] = l.Attrs().Name
		}
		for _, l := range links {
			a := l.Attrs()
			master := "-"
			if a.MasterIndex != 0 {
				master = names[a.MasterIndex]
			}
			lines = append(lines, fmt.Sprintf("%s type=%s master=%s mtu=%d txqueuelen=%d up=%v mac=%s promisc=%d",
				a.Name, l.Type(), master, a.MTU, a.TxQLen, a.Flags&net.FlagUp != 0, a.HardwareAddr, a.Promisc))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("listing links in %s: %v", n.Path(), err)
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// result normalizes a plugin's stdout as JSON: keys sorted, so only content counts.
func (n *normalizer) result(b []byte) string {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return n.text(fmt.Sprintf("not JSON: %q", b))
	}
	out, _ := json.MarshalIndent(v, "", "  ")
	return n.text(string(out))
}

// snapshot is the normalized state of the pod and host namespaces: the sections
// paritySections names and, when full, every section of nodestate as well (firewall
// rules, qdiscs, filters, `ip -d link`), for requireNothingLeft.
func (n *normalizer) snapshot(t *testing.T, h *nstest.H, pod ns.NetNS, full bool) nodestate.Snapshot {
	t.Helper()
	out := nodestate.Snapshot{}
	for _, side := range []struct {
		label string
		n     ns.NetNS
		dirs  []string
	}{{"pod", pod, nil}, {"host", h.HostNS, []string{h.DataDir}}} {
		s := nodestate.Snapshot{}
		if full {
			var err error
			if s, err = nodestate.Take(side.n.Path(), side.dirs...); err != nil {
				t.Fatalf("snapshot of the %s namespace: %v", side.label, err)
			}
		}
		parts := strings.Split(h.Run(side.n, "sh", "-c", `ip -o addr show; echo @@; ip -4 route show table all; echo @@; ip -6 route show table all; echo @@
			cd /proc/sys/net && grep -r . ipv4/conf ipv6/conf ipv4/ip_forward bridge 2>/dev/null; true`), "@@\n")
		if len(parts) != 4 {
			t.Fatalf("listing addresses, routes and sysctls in the %s namespace: %d parts", side.label, len(parts))
		}
		s["addrs"] = addrIndexRe.ReplaceAllString(addrLifetimeRe.ReplaceAllString(parts[0], ""), "")
		s["routes4"], s["routes6"], s["sysctl-all"] = parts[1], parts[2], parts[3]
		s["link-attrs"] = linkAttrs(t, side.n)
		leases, err := nodestate.Leases(side.dirs...)
		if err != nil {
			t.Fatal(err)
		}
		s["leases"] = leases
		for k, v := range s {
			// Sorted: the kernel lists routes in an order that depends on how they
			// were added, which is not state.
			lines := strings.Split(strings.TrimSpace(n.text(v)), "\n")
			sort.Strings(lines)
			out[side.label+" "+k] = strings.Join(lines, "\n")
		}
	}
	return out
}

var (
	addrIndexRe    = regexp.MustCompile(`(?m)^\d+: `)
	addrLifetimeRe = regexp.MustCompile(`(?m)\\\s+valid_lft.*$`)
)
