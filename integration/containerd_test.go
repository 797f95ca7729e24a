// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/podwire/podwire/integration/containerd"
	"github.com/podwire/podwire/integration/nodestate"
	"github.com/podwire/podwire/integration/nstest"
)

const (
	e2eHostPort      = 30080
	e2eContainerPort = 8080
	e2eNodeUplinkIP  = "192.0.2.1" // TEST-NET-1, only inside the test's namespaces
	e2eClientIP      = "192.0.2.2"
	e2eBandwidth     = "10M"
	e2eLibcniCache   = containerd.LibcniCacheDir
)

// TestContainerd is the end-to-end test of the plugins as production drives them:
// containerd with its CRI plugin, runc, crictl, and the kubenet conf-example, once with
// Debian's containerd (1.6) and once with containerd 2.x built from the Go module
// proxy. containerd runs in the test's "node" netns with its own config, root, state
// and socket; a pod sandbox with a hostPort and the Kubernetes bandwidth annotations
// must get an address from the conflist's range, answer on its hostPort, have TBF
// shaping on its host veth, and leave nothing behind once stopped and removed.
func TestContainerd(t *testing.T) {
	nstest.RequireRoot(t)
	forEachContainerd(t, testContainerdPod)
}

// forEachContainerd runs f as one subtest per containerd release: Debian's, named by
// its version (containerd-1.6), and containerd.Containerd2Version built from the Go
// module proxy (containerd-2.4). A release that is missing, or fails to build, skips
// its subtest outside CI and fails it under CI=true.
func forEachContainerd(t *testing.T, f func(t *testing.T, rt containerd.Runtime)) {
	deb := containerd.Debian()
	t.Run(deb.Name, func(t *testing.T) {
		requireRuntime(t, deb)
		f(t, deb)
	})
	t.Run(containerd.Containerd2Name, func(t *testing.T) {
		repo, err := nstest.RepoRoot()
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		rt, err := containerd.EnsureContainerd2(repo)
		if err != nil {
			nstest.Missing(t, "containerd %s: %v", containerd.Containerd2Version, err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Logf("built containerd %s from the Go module proxy in %s (cached in %s)", containerd.Containerd2Version, d.Round(time.Second), filepath.Dir(rt.Containerd))
		}
		requireRuntime(t, rt)
		f(t, rt)
	})
}

// requireRuntime skips (fails under CI) when Debian packages rt needs are missing.
func requireRuntime(t *testing.T, rt containerd.Runtime) {
	t.Helper()
	if missing := rt.Missing(); len(missing) > 0 {
		nstest.Missing(t, "%s end-to-end test needs Debian packages %s: `apt-get install %s` (.ci/run installs them)",
			rt.Name, strings.Join(missing, ", "), strings.Join(missing, " "))
	}
}

// testContainerdPod is TestContainerd against one containerd release.
func testContainerdPod(t *testing.T, rt containerd.Runtime) {
	h := nstest.New(t)
	repo, err := nstest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	conf := loadKubenetExample(t, h, repo)
	confDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(confDir, "10-kubenet.conflist"), conf.raw, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("conflist %s: %s (subnet %s); containerd adds its own loopback network", conf.source, strings.Join(conf.plugins, " + "), conf.subnet)
	client := h.NewPod()
	addUplink(t, h, client)
	d := containerd.Start(t, containerd.Options{
		NetNS: h.HostNS.Path(), CNIBinDir: h.BinDir, CNIConfDir: confDir, Dir: t.TempDir(), Repo: repo, Runtime: rt,
	})
	requireCRIReady(t, d)
	t.Logf("check: %s runs in the test's node netns %s (pid %d), CRI reports RuntimeReady and NetworkReady", d.Version, h.HostNS.Path(), d.Pid())
	t.Logf("check: sandbox image %s built locally and imported (crictl inspecti)", containerd.SandboxImage)

	// A first pod creates what outlives pods by design (the bridge, the hostPort
	// chains, ip_forward), so the snapshot taken after it must come back exactly.
	warmID := runPod(t, d, "warm", conf)
	// While the warm pod gives the bridge carrier, let IPv6 DAD finish on the node's
	// new addresses (the bridge's link-local): a tentative address would otherwise
	// sit in the snapshot and "change" once the next pod brings carrier back.
	waitNoTentative(t, h)
	d.MustCrictl("stopp", warmID)
	d.MustCrictl("rmp", warmID)
	t.Logf("check: warm-up pod %s ran, stopped and was removed", short(warmID))
	before := settledSnapshot(t, h)
	mountsBefore, err := d.Mounts()
	if err != nil {
		t.Fatal(err)
	}

	id := runPod(t, d, "web", conf)
	pod, err := d.InspectPod(id)
	if err != nil {
		t.Fatal(err)
	}
	if pod.Status.State != "SANDBOX_READY" || pod.Info.Pid == 0 {
		t.Fatalf("pod %s: state %s pid %d, want SANDBOX_READY with a pid", short(id), pod.Status.State, pod.Info.Pid)
	}
	netnsFile := pod.NetNSPath()
	if !strings.HasPrefix(netnsFile, d.State+"/") || !exists(netnsFile) {
		t.Fatalf("pod netns %q is not a file under containerd's state dir %s", netnsFile, d.State)
	}
	t.Logf("check: crictl runp created pod %s (SANDBOX_READY, pause pid %d, netns %s)", short(id), pod.Info.Pid, netnsFile)

	podIP := net.ParseIP(pod.Status.Network.IP)
	if podIP == nil || !conf.subnet.Contains(podIP) {
		t.Fatalf("crictl inspectp reports pod IP %q, want one in %s", pod.Status.Network.IP, conf.subnet)
	}
	t.Logf("check: crictl inspectp reports pod IP %s, inside the conflist's %s", podIP, conf.subnet)

	// The pause process's netns: reachable from the test whatever mount namespace
	// containerd keeps the netns file in.
	podNS, err := ns.GetNS(fmt.Sprintf("/proc/%d/ns/net", pod.Info.Pid))
	if err != nil {
		t.Fatal(err)
	}
	defer podNS.Close()
	peerIdx := checkPodInterfaces(t, podNS, podIP)
	hostVeth := checkHostVeth(t, h, peerIdx, conf.bridge)
	t.Logf("check: pod has eth0 %s and lo up; its host veth %s is enslaved to bridge %s", podIP, hostVeth, conf.bridge)
	h.MustPing(podNS, conf.gateway.String())
	t.Logf("check: pod pings its gateway %s on the bridge", conf.gateway)
	checkEgress(t, client, podNS)
	lease := filepath.Join(h.DataDir, conf.network, podIP.String())
	if b, err := os.ReadFile(lease); err != nil || !strings.Contains(string(b), id) {
		t.Fatalf("host-local lease %s: %q, %v; want it to name sandbox %s", lease, b, err, id)
	}
	t.Logf("check: host-local lease %s names the sandbox", lease)
	cached := libcniCacheFiles(id)
	checkRuntimeConfig(t, conf.network, id)

	// The conf-example's chain is what a kubenet node runs: hostPort and shaping are
	// part of it, not optional checks.
	for _, p := range []string{"portmap", "bandwidth"} {
		if !conf.has(p) {
			t.Fatalf("%s has no %s plugin: the test checks hostPort %d and TBF shaping through it", conf.source, p, e2eHostPort)
		}
	}
	checkHostPort(t, h, client, podNS, id)
	checkShaping(t, h, hostVeth)

	d.MustCrictl("stopp", id)
	if p, err := d.InspectPod(id); err != nil || p.Status.State != "SANDBOX_NOTREADY" {
		t.Fatalf("after stopp: pod state %v, %v; want SANDBOX_NOTREADY", p, err)
	}
	if exists(netnsFile) {
		t.Errorf("after stopp: pod netns file %s still exists", netnsFile)
	}
	if _, err := netlinkInHost(h, func() (netlink.Link, error) { return netlink.LinkByName(hostVeth) }); err == nil {
		t.Errorf("after stopp: host veth %s still exists", hostVeth)
	}
	requireSettledUnchanged(t, h, before)
	t.Logf("check: crictl stopp ran CNI DEL: pod netns removed, host veth gone, node state (links, addresses, routes, iptables, nftables, qdiscs, filters, sysctls, leases) as before the pod")

	d.MustCrictl("rmp", id)
	if out := d.MustCrictl("pods", "-q"); strings.TrimSpace(out) != "" {
		t.Errorf("after rmp: crictl pods still lists %q", out)
	}
	if _, err := os.Stat(lease); !os.IsNotExist(err) {
		t.Errorf("after rmp: lease %s still exists (%v)", lease, err)
	}
	if left := libcniCacheFiles(id); len(left) > 0 {
		t.Errorf("after rmp: libcni cache entries left: %v", left)
	}
	if mounts, err := d.Mounts(); err != nil {
		t.Fatal(err)
	} else if strings.Join(mounts, "\n") != strings.Join(mountsBefore, "\n") {
		t.Errorf("after rmp: containerd's mounts under %s are %v, were %v", d.Dir, mounts, mountsBefore)
	}
	if cg := d.Cgroups(); len(cg) > 0 {
		t.Errorf("after rmp: pod cgroups left: %v", cg)
	}
	if entries, _ := os.ReadDir(filepath.Dir(netnsFile)); len(entries) > 0 {
		t.Errorf("after rmp: netns files left in %s: %d", filepath.Dir(netnsFile), len(entries))
	}
	requireSettledUnchanged(t, h, before)
	t.Logf("check: crictl rmp removed the pod: no sandbox, lease, libcni cache entry (%d were there), mount, cgroup or netns left; node state still as before", len(cached))
}

// waitNoTentative waits until no address in the node netns is still in IPv6 DAD.
func waitNoTentative(t *testing.T, h *nstest.H) {
	t.Helper()
	var out string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if out = h.Run(h.HostNS, "ip", "-o", "addr", "show", "tentative"); strings.TrimSpace(out) == "" {
			return
		}
	}
	t.Fatalf("node addresses still tentative after 10s:\n%s", out)
}

// settledSnapshot takes node snapshots until two in a row agree: the bridge's carrier
// and its routes' "linkdown" flag follow a removed veth asynchronously (linkwatch).
func settledSnapshot(t *testing.T, h *nstest.H) nodestate.Snapshot {
	t.Helper()
	prev := h.Snapshot()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		time.Sleep(300 * time.Millisecond)
		cur := h.Snapshot()
		if nodestate.Diff(prev, cur) == "" {
			return cur
		}
		prev = cur
	}
	t.Fatalf("node state keeps changing with no pod running; last change:\n%s", nodestate.Diff(h.Snapshot(), prev))
	return nil
}

// requireSettledUnchanged is h.RequireUnchanged with time for the kernel's
// asynchronous carrier updates to land.
func requireSettledUnchanged(t *testing.T, h *nstest.H, before nodestate.Snapshot) {
	t.Helper()
	var diff string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(300 * time.Millisecond) {
		if diff = nodestate.Diff(before, h.Snapshot()); diff == "" {
			return
		}
	}
	t.Fatalf("node state changed (- before, + after):\n%s", diff)
}

// kubenetConf is conf-examples/10-kubenet.conflist with the edits a test needs.
type kubenetConf struct {
	source  string
	raw     []byte
	network string
	bridge  string
	subnet  *net.IPNet
	gateway net.IP
	plugins []string
}

func (c *kubenetConf) has(plugin string) bool {
	for _, p := range c.plugins {
		if p == plugin {
			return true
		}
	}
	return false
}

// loadKubenetExample reads the kubenet conf-example and changes only the bridge name
// (the test prefix) and host-local's dataDir (the test's). Every plugin it names must
// be built: a conflist the test runs with a plugin left out proves nothing about the
// conf-example.
func loadKubenetExample(t *testing.T, h *nstest.H, repo string) *kubenetConf {
	t.Helper()
	c := &kubenetConf{source: filepath.Join(repo, "conf-examples", "10-kubenet.conflist"), bridge: h.Name("br")}
	raw, err := os.ReadFile(c.source)
	if err != nil {
		t.Fatal(err)
	}
	var list map[string]any
	if err := json.Unmarshal(raw, &list); err != nil {
		t.Fatalf("%s: %v", c.source, err)
	}
	c.network, _ = list["name"].(string)
	var kept []any
	for _, p := range list["plugins"].([]any) {
		pm := p.(map[string]any)
		typ, _ := pm["type"].(string)
		if _, err := os.Stat(filepath.Join(h.BinDir, typ)); err != nil {
			t.Fatalf("%s names plugin %s, which is missing from %s: %v", c.source, typ, h.BinDir, err)
		}
		if typ == "bridge" {
			pm["bridge"] = c.bridge
		}
		if ipam, ok := pm["ipam"].(map[string]any); ok {
			if _, err := os.Stat(filepath.Join(h.BinDir, ipam["type"].(string))); err != nil {
				t.Fatalf("%s names IPAM plugin %s, which is missing from %s: %v", c.source, ipam["type"], h.BinDir, err)
			}
			ipam["dataDir"] = h.DataDir
			c.plugins = append(c.plugins, typ+"/"+ipam["type"].(string))
			ranges := ipam["ranges"].([]any)
			subnet := ranges[0].([]any)[0].(map[string]any)["subnet"].(string)
			if _, c.subnet, err = net.ParseCIDR(subnet); err != nil {
				t.Fatal(err)
			}
			c.gateway = append(net.IP(nil), c.subnet.IP.To4()...)
			c.gateway[3]++ // host-local's default gateway: the range's first address
		} else {
			c.plugins = append(c.plugins, typ)
		}
		kept = append(kept, pm)
	}
	if _, err := os.Stat(filepath.Join(h.BinDir, "loopback")); err != nil {
		t.Fatalf("loopback plugin missing from %s: containerd needs it for every pod", h.BinDir)
	}
	list["plugins"] = kept
	if c.raw, err = json.MarshalIndent(list, "", "  "); err != nil {
		t.Fatal(err)
	}
	if c.subnet == nil {
		t.Fatalf("%s has no host-local range", c.source)
	}
	return c
}

// addUplink connects the node netns to a client netns, as the node's uplink to the
// outside world: node 192.0.2.1/24, client 192.0.2.2/24.
func addUplink(t *testing.T, h *nstest.H, client ns.NetNS) {
	t.Helper()
	err := h.HostNS.Do(func(ns.NetNS) error {
		la := netlink.NewLinkAttrs()
		la.Name = h.Name("up0")
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: h.Name("up1"), PeerNamespace: netlink.NsFd(int(client.Fd()))}); err != nil {
			return fmt.Errorf("creating uplink veth: %w", err)
		}
		return addrUp(la.Name, e2eNodeUplinkIP+"/24")
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Do(func(ns.NetNS) error {
		if err := addrUp(h.Name("up1"), e2eClientIP+"/24"); err != nil {
			return err
		}
		return addrUp("lo", "")
	}); err != nil {
		t.Fatal(err)
	}
}

func addrUp(link, cidr string) error {
	l, err := netlink.LinkByName(link)
	if err != nil {
		return err
	}
	if cidr != "" {
		a, err := netlink.ParseAddr(cidr)
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(l, a); err != nil {
			return fmt.Errorf("adding %s to %s: %w", cidr, link, err)
		}
	}
	return netlink.LinkSetUp(l)
}

func exists(path string) bool { _, err := os.Stat(path); return err == nil }

func short(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// runPod runs a sandbox with the hostPort mapping and the bandwidth annotations.
func runPod(t *testing.T, d *containerd.Daemon, name string, conf *kubenetConf) string {
	t.Helper()
	id, err := runPodErr(t, d, name, conf)
	if err != nil {
		t.Fatalf("running pod %s: %v", name, err)
	}
	return id
}

// runPodErr is runPod returning crictl's error.
func runPodErr(t *testing.T, d *containerd.Daemon, name string, _ *kubenetConf) (string, error) {
	t.Helper()
	var uid [16]byte
	if _, err := rand.Read(uid[:]); err != nil {
		t.Fatal(err)
	}
	logDir := filepath.Join(d.Dir, "logs", name)
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := map[string]any{
		"metadata":      map[string]any{"name": name, "namespace": "podwire-e2e", "uid": hex.EncodeToString(uid[:]), "attempt": 0},
		"hostname":      name,
		"log_directory": logDir,
		"port_mappings": []map[string]any{{"protocol": 0, "container_port": e2eContainerPort, "host_port": e2eHostPort}},
		"annotations": map[string]string{
			"kubernetes.io/ingress-bandwidth": e2eBandwidth,
			"kubernetes.io/egress-bandwidth":  e2eBandwidth,
		},
		"linux": map[string]any{"cgroup_parent": d.CgroupParent},
	}
	return d.RunPod(name, cfg)
}

// requireCRIReady waits for `crictl info` to report the runtime and the network ready
// (NetworkReady needs the conflist loaded, which containerd does asynchronously).
func requireCRIReady(t *testing.T, d *containerd.Daemon) {
	t.Helper()
	var last string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		out, err := d.Crictl("info")
		if err != nil {
			last = err.Error()
			continue
		}
		var info struct {
			Status struct {
				Conditions []struct {
					Type    string `json:"type"`
					Status  bool   `json:"status"`
					Message string `json:"message"`
				} `json:"conditions"`
			} `json:"status"`
		}
		if err := json.Unmarshal([]byte(out), &info); err != nil {
			t.Fatalf("parsing crictl info: %v\n%s", err, out)
		}
		ready := 0
		for _, c := range info.Status.Conditions {
			if (c.Type == "RuntimeReady" || c.Type == "NetworkReady") && c.Status {
				ready++
			}
		}
		if ready == 2 {
			return
		}
		last = out
	}
	t.Fatalf("CRI not ready after 30s: %s", last)
}

// checkPodInterfaces requires eth0 with podIP and lo up in the pod, and returns the
// index of eth0's veth peer in the node netns.
func checkPodInterfaces(t *testing.T, podNS ns.NetNS, podIP net.IP) int {
	t.Helper()
	var peer int
	err := podNS.Do(func(ns.NetNS) error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		if lo.Attrs().Flags&net.FlagUp == 0 {
			return fmt.Errorf("lo is down in the pod: containerd's loopback network did not run")
		}
		eth0, err := netlink.LinkByName("eth0")
		if err != nil {
			return fmt.Errorf("pod has no eth0: %w", err)
		}
		if eth0.Type() != "veth" {
			return fmt.Errorf("pod eth0 is a %s, want veth", eth0.Type())
		}
		addrs, err := netlink.AddrList(eth0, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			if a.IP.Equal(podIP) {
				peer = eth0.Attrs().ParentIndex
				return nil
			}
		}
		return fmt.Errorf("pod eth0 has %v, not %s", addrs, podIP)
	})
	if err != nil {
		t.Fatal(err)
	}
	return peer
}

func netlinkInHost(h *nstest.H, f func() (netlink.Link, error)) (netlink.Link, error) {
	var l netlink.Link
	err := h.HostNS.Do(func(ns.NetNS) error {
		var err error
		l, err = f()
		return err
	})
	return l, err
}

// checkHostVeth finds the pod's veth peer in the node netns and requires it to be
// enslaved to the conflist's bridge.
func checkHostVeth(t *testing.T, h *nstest.H, peerIdx int, bridge string) string {
	t.Helper()
	var name string
	err := h.HostNS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByIndex(peerIdx)
		if err != nil {
			return fmt.Errorf("pod eth0's peer (index %d) not in the node netns: %w", peerIdx, err)
		}
		br, err := netlink.LinkByName(bridge)
		if err != nil {
			return fmt.Errorf("bridge %s: %w", bridge, err)
		}
		if l.Attrs().MasterIndex != br.Attrs().Index {
			return fmt.Errorf("host veth %s is not enslaved to %s", l.Attrs().Name, bridge)
		}
		name = l.Attrs().Name
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return name
}

// checkRuntimeConfig reads what containerd handed libcni for the pod's eth0 (libcni
// caches it beside the result): the hostPort as the portMappings capability, the
// bandwidth annotations as the bandwidth capability in bit/s with burst MaxUint32,
// and the K8S_POD_* CNI_ARGS. go-cni's structs have no JSON tags, so the keys arrive
// capitalized ("HostPort", "IngressRate"); decoding here is case-insensitive, as the
// plugins' must be.
func checkRuntimeConfig(t *testing.T, network, id string) {
	t.Helper()
	path := filepath.Join(e2eLibcniCache, "results", network+"-"+id+"-eth0")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("containerd's libcni cache for the pod: %v", err)
	}
	var cache struct {
		CniArgs        [][2]string `json:"cniArgs"`
		CapabilityArgs struct {
			Bandwidth *struct {
				IngressRate, IngressBurst, EgressRate, EgressBurst uint64
			} `json:"bandwidth"`
			PortMappings []struct {
				HostPort, ContainerPort int
				Protocol                string
			} `json:"portMappings"`
		} `json:"capabilityArgs"`
	}
	if err := json.Unmarshal(b, &cache); err != nil {
		t.Fatalf("parsing %s: %v", path, err)
	}
	bw := cache.CapabilityArgs.Bandwidth
	if bw == nil || bw.IngressRate != 10_000_000 || bw.EgressRate != 10_000_000 || bw.IngressBurst != math.MaxUint32 || bw.EgressBurst != math.MaxUint32 {
		t.Errorf("bandwidth capability from the %s annotations = %+v, want rates 10000000 bit/s and bursts %d", e2eBandwidth, bw, uint64(math.MaxUint32))
	}
	pm := cache.CapabilityArgs.PortMappings
	if len(pm) != 1 || pm[0].HostPort != e2eHostPort || pm[0].ContainerPort != e2eContainerPort || pm[0].Protocol != "tcp" {
		t.Errorf("portMappings capability = %+v, want hostPort %d -> %d/tcp", pm, e2eHostPort, e2eContainerPort)
	}
	args := map[string]string{}
	for _, kv := range cache.CniArgs {
		args[kv[0]] = kv[1]
	}
	if args["K8S_POD_NAME"] != "web" || args["K8S_POD_NAMESPACE"] != "podwire-e2e" || args["K8S_POD_INFRA_CONTAINER_ID"] != id {
		t.Errorf("CNI_ARGS = %v, want the pod's K8S_POD_* names", cache.CniArgs)
	}
	t.Logf("check: containerd passed runtimeConfig bandwidth %+v and portMappings %+v, CNI_ARGS K8S_POD_NAMESPACE=%s K8S_POD_NAME=%s (libcni cache %s)",
		*bw, pm, args["K8S_POD_NAMESPACE"], args["K8S_POD_NAME"], path)
}

// libcniCacheFiles lists containerd's cached CNI results for a sandbox.
func libcniCacheFiles(id string) []string {
	m, _ := filepath.Glob(filepath.Join(e2eLibcniCache, "results", "*"+id+"*"))
	return m
}

// checkHostPort serves on the pod's containerPort from inside its netns and connects
// to the hostPort from the outside client (to the node's uplink address) and from the
// node itself (to 127.0.0.1, which needs portmap's snat).
func checkHostPort(t *testing.T, h *nstest.H, client, podNS ns.NetNS, id string) {
	t.Helper()
	l := serveIn(t, podNS, fmt.Sprintf(":%d", e2eContainerPort), "pod "+short(id))
	defer l.Close()
	for _, tc := range []struct {
		from ns.NetNS
		who  string
		addr string
	}{
		{client, "outside client " + e2eClientIP, net.JoinHostPort(e2eNodeUplinkIP, strconv.Itoa(e2eHostPort))},
		{h.HostNS, "the node itself", net.JoinHostPort("127.0.0.1", strconv.Itoa(e2eHostPort))},
	} {
		reply, err := dialIn(tc.from, tc.addr)
		if err != nil {
			t.Fatalf("hostPort: %s connecting to %s: %v", tc.who, tc.addr, err)
		}
		if !strings.HasPrefix(reply, "pod "+short(id)+" ") {
			t.Fatalf("hostPort: %s got %q from %s, not the pod", tc.who, reply, tc.addr)
		}
		t.Logf("check: hostPort %d -> pod:%d from %s via %s: %q", e2eHostPort, e2eContainerPort, tc.who, tc.addr, reply)
	}
}

// serveIn listens on addr inside netns n and answers every connection with one line:
// "<name> saw <client address>".
func serveIn(t *testing.T, n ns.NetNS, addr, name string) net.Listener {
	t.Helper()
	var l net.Listener
	if err := n.Do(func(ns.NetNS) error {
		var err error
		l, err = net.Listen("tcp4", addr)
		return err
	}); err != nil {
		t.Fatalf("listening on %s in %s: %v", addr, n.Path(), err)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "%s saw %s\n", name, c.RemoteAddr())
			c.Close()
		}
	}()
	return l
}

// checkEgress connects from the pod to a server on the outside client: the pod's
// default route must lead through the bridge gateway and the node, and ipMasq must
// hide the pod behind the node's address.
func checkEgress(t *testing.T, client, podNS ns.NetNS) {
	t.Helper()
	addr := net.JoinHostPort(e2eClientIP, "9090")
	l := serveIn(t, client, addr, "client")
	defer l.Close()
	reply, err := dialIn(podNS, addr)
	if err != nil {
		out, _ := nstest.RunIn(podNS, "ip", "route")
		t.Fatalf("pod connecting to outside client %s: %v\npod routes:\n%s", addr, err, out)
	}
	if !strings.HasPrefix(reply, "client saw "+e2eNodeUplinkIP+":") {
		t.Fatalf("outside client answered %q: want it to see the node's %s (ipMasq)", reply, e2eNodeUplinkIP)
	}
	t.Logf("check: pod reaches outside client %s through the node, masqueraded: %q", addr, reply)
}

func dialIn(from ns.NetNS, addr string) (string, error) {
	var c net.Conn
	err := from.Do(func(ns.NetNS) error {
		var err error
		c, err = net.DialTimeout("tcp4", addr, 5*time.Second)
		return err
	})
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

var tbfRate = regexp.MustCompile(`qdisc tbf \S+ root .*\brate (\S+)`)

// checkShaping requires the TBFs the bandwidth annotations ask for: on the host veth
// (traffic to the pod: its ingress), and on an IFB that the host veth's ingress is
// redirected to (traffic from the pod: its egress).
func checkShaping(t *testing.T, h *nstest.H, hostVeth string) {
	t.Helper()
	want := "10Mbit"
	q := h.Run(h.HostNS, "tc", "qdisc", "show", "dev", hostVeth)
	if m := tbfRate.FindStringSubmatch(q); m == nil || m[1] != want {
		t.Fatalf("host veth %s: want a root tbf at rate %s (kubernetes.io/ingress-bandwidth: %s), have:\n%s", hostVeth, want, e2eBandwidth, q)
	}
	t.Logf("check: ingress shaping: %s", strings.TrimSpace(tbfRate.FindString(q)))
	f := h.Run(h.HostNS, "tc", "filter", "show", "dev", hostVeth, "ingress")
	m := regexp.MustCompile(`Redirect to device (\S+)\)`).FindStringSubmatch(f)
	if m == nil {
		t.Fatalf("host veth %s: no ingress filter redirecting to an IFB (kubernetes.io/egress-bandwidth: %s):\n%s", hostVeth, e2eBandwidth, f)
	}
	ifb := m[1]
	link, err := netlinkInHost(h, func() (netlink.Link, error) { return netlink.LinkByName(ifb) })
	if err != nil || link.Type() != "ifb" {
		t.Fatalf("redirect target %s is not an IFB: %v", ifb, err)
	}
	q = h.Run(h.HostNS, "tc", "qdisc", "show", "dev", ifb)
	if m := tbfRate.FindStringSubmatch(q); m == nil || m[1] != want {
		t.Fatalf("IFB %s: want a root tbf at rate %s, have:\n%s", ifb, want, q)
	}
	t.Logf("check: egress shaping: %s ingress redirected to IFB %s with %s", hostVeth, ifb, strings.TrimSpace(tbfRate.FindString(q)))
}
