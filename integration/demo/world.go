// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"

	"github.com/podwire/podwire/integration/nodestate"
)

// noShapingEnv set to 1 leaves the bandwidth plugin out of the conflist: pod B is not
// shaped, and the demo must fail at its throughput step (TestDemoFailsWithoutShaping).
const noShapingEnv = "PODWIRE_DEMO_NO_SHAPING"

const (
	nodeUplinkIP   = "192.0.2.1"
	clientUplinkIP = "192.0.2.2"
	hostPort       = 8080
)

// pod is one demo pod: its netns and what ADD returned.
type pod struct {
	name string
	ns   ns.NetNS
	rt   *libcni.RuntimeConf
	res  *current.Result
	ip   net.IP
}

type demo struct {
	start    time.Time
	root     string
	tmp      string
	binDir   string
	dataDir  string
	bridge   string // the conflist's bridge, renamed for this run (see loadConflist)
	runID    string // prefix of this run's container IDs
	node     ns.NetNS
	client   ns.NetNS
	a, b     *pod
	net      *libcni.NetworkConfigList
	lo       *libcni.NetworkConfigList
	cni      *libcni.CNIConfig
	pristine nodestate.Snapshot // the node before its network existed
	before   nodestate.Snapshot // the node with its network set up, before the pods
	added    []*pod
}

var tools = map[string]string{"ip": "iproute2", "tc": "iproute2", "iptables-save": "iptables", "nft": "nftables", "nsenter": "util-linux"}

func (d *demo) build(context.Context) error {
	var missing []string
	for cmd, pkg := range tools {
		if _, err := exec.LookPath(cmd); err != nil {
			missing = append(missing, pkg)
		}
	}
	if len(missing) > 0 {
		say("installing %s (used to show node state) with apt-get", strings.Join(missing, " "))
		if out, err := exec.Command("sh", "-c", "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "+strings.Join(missing, " ")).CombinedOutput(); err != nil {
			return fmt.Errorf("installing %v: %v\n%s", missing, err, out)
		}
	}
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return fmt.Errorf("go env GOMOD: %w", err)
	}
	d.root = filepath.Dir(strings.TrimSpace(string(out)))
	if d.tmp, err = os.MkdirTemp("", "podwire-demo-"); err != nil {
		return err
	}
	d.binDir = filepath.Join(d.tmp, "bin")
	d.dataDir = filepath.Join(d.tmp, "leases")
	// Names of this run's own: podwire keeps per-attachment and per-interface-name state
	// in /run/podwire, which every network namespace on the machine shares, so a demo
	// (or test) running at the same time with the same container IDs or bridge name
	// would read this run's records (seen: its DEL releasing route_localnet on the
	// other run's cni0 and leaving this one's on).
	d.runID = fmt.Sprintf("demo%d", os.Getpid())
	d.bridge = fmt.Sprintf("cni-demo%d", os.Getpid()%100000)
	cmd := exec.Command("make", "-s", "build", "BIN_DIR="+d.binDir)
	cmd.Dir = d.root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("make build: %v\n%s", err, out)
	}
	entries, _ := os.ReadDir(d.binDir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	say("plugins in private CNI bin dir %s: %s", d.binDir, strings.Join(names, " "))
	d.cni = libcni.NewCNIConfigWithCacheDir([]string{d.binDir}, filepath.Join(d.tmp, "cache"), nil)
	if d.net, err = d.loadConflist("10-kubenet.conflist"); err != nil {
		return err
	}
	d.lo, err = d.loadConflist("99-loopback.conflist")
	return err
}

// loadConflist reads a conf-example; the only changes are dataDir, so leases go to the
// demo's private directory instead of /var/lib/cni/networks, and the bridge's name, one
// of this run's own (see build).
func (d *demo) loadConflist(name string) (*libcni.NetworkConfigList, error) {
	path := filepath.Join(d.root, "conf-examples", name)
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var list map[string]any
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var plugins []any
	changes := "dataDir -> " + d.dataDir
	for _, p := range list["plugins"].([]any) {
		if ipam, ok := p.(map[string]any)["ipam"].(map[string]any); ok {
			ipam["dataDir"] = d.dataDir
		}
		if _, ok := p.(map[string]any)["bridge"]; ok {
			p.(map[string]any)["bridge"] = d.bridge
			changes += ", bridge -> " + d.bridge
		}
		if p.(map[string]any)["type"] == "bandwidth" && os.Getenv(noShapingEnv) == "1" {
			say("%s=1: the bandwidth plugin is left out of %s, so the throughput step must fail", noShapingEnv, name)
			continue
		}
		plugins = append(plugins, p)
	}
	list["plugins"] = plugins
	b, _ := json.Marshal(list)
	say("conflist %s (%s)", path, changes)
	return libcni.NetworkConfFromBytes(b)
}

func (d *demo) world(context.Context) error {
	var err error
	if d.node, err = testutils.NewNS(); err != nil {
		return fmt.Errorf("creating node netns: %w", err)
	}
	if d.client, err = testutils.NewNS(); err != nil {
		return fmt.Errorf("creating client netns: %w", err)
	}
	// The node's uplink to the outside client: node 192.0.2.1 <-> client 192.0.2.2.
	err = d.node.Do(func(ns.NetNS) error {
		lo, _ := netlink.LinkByName("lo")
		if err := netlink.LinkSetUp(lo); err != nil {
			return err
		}
		la := netlink.NewLinkAttrs()
		la.Name = "uplink0"
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "uplink1", PeerNamespace: netlink.NsFd(int(d.client.Fd()))}); err != nil {
			return fmt.Errorf("creating uplink veth: %w", err)
		}
		l, err := netlink.LinkByName("uplink0")
		if err != nil {
			return err
		}
		// No IPv6 DAD on the uplink: a link-local address leaving "tentative" during the
		// demo would show up as a change of the node.
		if err := os.WriteFile("/proc/sys/net/ipv6/conf/uplink0/accept_dad", []byte("0"), 0o644); err != nil {
			return err
		}
		addr, _ := netlink.ParseAddr(nodeUplinkIP + "/24")
		if err := netlink.AddrAdd(l, addr); err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	})
	if err != nil {
		return fmt.Errorf("node uplink: %w", err)
	}
	err = d.client.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("uplink1")
		if err != nil {
			return err
		}
		if err := os.WriteFile("/proc/sys/net/ipv6/conf/uplink1/accept_dad", []byte("0"), 0o644); err != nil {
			return err
		}
		addr, _ := netlink.ParseAddr(clientUplinkIP + "/24")
		if err := netlink.AddrAdd(l, addr); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		lo, _ := netlink.LinkByName("lo")
		return netlink.LinkSetUp(lo)
	})
	if err != nil {
		return fmt.Errorf("client uplink: %w", err)
	}
	d.a = &pod{name: "pod-a"}
	d.b = &pod{name: "pod-b"}
	for _, p := range []*pod{d.a, d.b} {
		if p.ns, err = testutils.NewNS(); err != nil {
			return fmt.Errorf("creating %s netns: %w", p.name, err)
		}
	}
	say("node    %s  (uplink %s/24)", d.node.Path(), nodeUplinkIP)
	say("client  %s  (uplink %s/24, outside the node)", d.client.Path(), clientUplinkIP)
	say("pod-a   %s", d.a.ns.Path())
	say("pod-b   %s", d.b.ns.Path())
	if d.pristine, err = nodestate.Take(d.node.Path(), d.dataDir); err != nil {
		return fmt.Errorf("snapshot of the pristine node: %w", err)
	}
	// A node's first pod creates the bridge, sets the forwarding sysctls and gives the
	// bridge its gateway address; all of that stays for the next pod, as with the
	// reference plugins. One warm-up pod does it here, so the snapshot the pods are
	// compared with is the node as it is between pods.
	warm, err := testutils.NewNS()
	if err != nil {
		return fmt.Errorf("creating the warm-up pod netns: %w", err)
	}
	defer func() { _ = warm.Close(); _ = testutils.UnmountNS(warm) }()
	wrt := &libcni.RuntimeConf{ContainerID: d.runID + "-warm-up", NetNS: warm.Path(), IfName: "eth0"}
	err = d.inNode(func() error {
		if _, err := d.cni.AddNetworkList(context.Background(), d.net, wrt); err != nil {
			return err
		}
		return d.cni.DelNetworkList(context.Background(), d.net, wrt)
	})
	if err != nil {
		return fmt.Errorf("warm-up pod: %w", err)
	}
	if err := d.settleBridge(); err != nil {
		return err
	}
	if d.before, err = nodestate.Take(d.node.Path(), d.dataDir); err != nil {
		return fmt.Errorf("snapshot before: %w", err)
	}
	say("node network set up by a warm-up pod (ADD then DEL): bridge %s, forwarding sysctls", d.bridge)
	say("snapshot of the node taken (links, addresses, routes, sysctls, iptables, nft, qdiscs, filters, leases)")
	return nil
}

// settleBridge waits until the bridge without ports shows no carrier and its IPv6 link-local
// address has finished DAD, so the snapshot does not race the kernel.
func (d *demo) settleBridge() error {
	for i := 0; i < 100; i++ {
		l, _ := exec.Command("nsenter", "--net="+d.node.Path(), "ip", "-o", "link", "show", d.bridge).CombinedOutput()
		a, _ := exec.Command("nsenter", "--net="+d.node.Path(), "ip", "-o", "addr", "show", "dev", d.bridge).CombinedOutput()
		if strings.Contains(string(l), "NO-CARRIER") && strings.Contains(string(a), "fe80::") && !strings.Contains(string(a), "tentative") {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("bridge %s did not settle within 5 s after the warm-up pod", d.bridge)
}

// teardown removes everything the demo made, whatever state it is in.
func (d *demo) teardown() {
	for _, p := range d.added {
		_ = d.inNode(func() error { return d.cni.DelNetworkList(context.Background(), d.net, p.rt) })
	}
	for _, n := range []ns.NetNS{d.node, d.client} {
		if n != nil {
			_ = n.Close()
			_ = testutils.UnmountNS(n)
		}
	}
	for _, p := range []*pod{d.a, d.b} {
		if p != nil && p.ns != nil {
			_ = p.ns.Close()
			_ = testutils.UnmountNS(p.ns)
		}
	}
	if d.tmp != "" {
		_ = os.RemoveAll(d.tmp)
	}
}

// inNode runs f on a thread in the node netns; plugins libcni starts from f run there.
func (d *demo) inNode(f func() error) error {
	return d.node.Do(func(ns.NetNS) error { return f() })
}
