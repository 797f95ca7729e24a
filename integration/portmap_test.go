// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/podwire/podwire/integration/nstest"
	"github.com/podwire/podwire/pkg/netfilter"
)

// The node's test addresses: the host end of the "uplink" veth to the external
// client, and a second node address on it (for hostIP-restricted mappings).
const (
	pmNode4    = "192.0.2.1"
	pmNode6    = "fd00:ee::1"
	pmClient4  = "192.0.2.2"
	pmClient6  = "fd00:ee::2"
	pmOther4   = "198.51.100.1"
	pmGW4      = "10.77.0.1"
	pmStateDir = "/run/podwire/portmap"
)

var pmBackends = []netfilter.Kind{netfilter.KindIPTables, netfilter.KindNFTables}

// pmConf is bridge + host-local (dual stack) + portmap with extra spliced into portmap.
func pmConf(h *nstest.H, extra string) *libcni.NetworkConfigList {
	if extra != "" {
		extra = "," + extra
	}
	return h.Conflist(`{"cniVersion":"1.1.0","name":"@PREFIX@net","plugins":[
	 {"type":"bridge","bridge":"@PREFIX@br","isGateway":true,"isDefaultGateway":true,"hairpinMode":true,
	  "ipam":{"type":"host-local","ranges":[[{"subnet":"10.77.0.0/24"}],[{"subnet":"fd77::/64"}]],"dataDir":"@DATADIR@"}},
	 {"type":"portmap","capabilities":{"portMappings":true}` + extra + `}]}`)
}

func pmBackend(k netfilter.Kind) string { return `"backend":"` + string(k) + `"` }

// pmMap builds a portMappings capability from "proto:hostPort:containerPort[:hostIP]".
func pmMap(specs ...string) func(*libcni.RuntimeConf) {
	var list []map[string]any
	for _, s := range specs {
		f := strings.SplitN(s, ":", 4)
		var hp, cp int
		fmt.Sscan(f[1], &hp)
		fmt.Sscan(f[2], &cp)
		m := map[string]any{"protocol": f[0], "hostPort": hp, "containerPort": cp}
		if len(f) == 4 {
			m["hostIP"] = f[3]
		}
		list = append(list, m)
	}
	return nstest.WithCaps(map[string]any{"portMappings": list})
}

// pmNode gives the host netns an uplink to a fresh "external client" netns, with a
// second node address; both go away with the namespaces.
func pmNode(t *testing.T, h *nstest.H) (client ns.NetNS) {
	t.Helper()
	client = h.NewPod()
	up := h.Name("up")
	h.Run(h.HostNS, "ip", "link", "add", up, "type", "veth", "peer", "name", "eth0", "netns", client.Path())
	// No DAD on the uplink: its link-local address must not change under a snapshot.
	h.Run(h.HostNS, "sysctl", "-qw", "net.ipv6.conf."+up+".accept_dad=0")
	h.Run(client, "sysctl", "-qw", "net.ipv6.conf.eth0.accept_dad=0")
	h.Run(h.HostNS, "ip", "addr", "add", pmNode4+"/24", "dev", up)
	h.Run(h.HostNS, "ip", "-6", "addr", "add", pmNode6+"/64", "dev", up, "nodad")
	h.Run(h.HostNS, "ip", "link", "set", up, "up")
	h.Run(h.HostNS, "ip", "addr", "add", pmOther4+"/32", "dev", up)
	h.Run(client, "ip", "link", "set", "lo", "up")
	h.Run(client, "ip", "addr", "add", pmClient4+"/24", "dev", "eth0")
	h.Run(client, "ip", "-6", "addr", "add", pmClient6+"/64", "dev", "eth0", "nodad")
	h.Run(client, "ip", "link", "set", "eth0", "up")
	h.Run(client, "ip", "route", "add", "default", "via", pmNode4)
	h.Run(client, "ip", "-6", "route", "add", "default", "via", pmNode6)
	return client
}

// pmServe runs a TCP and a UDP echo server on port inside netns n (dual stack). Each
// answers "<name> <peer address>", so tests see where a connection landed and with
// which source address it arrived.
func pmServe(t *testing.T, n ns.NetNS, name string, port int) {
	t.Helper()
	var tl net.Listener
	var ul net.PacketConn
	err := n.Do(func(ns.NetNS) error {
		var err error
		if tl, err = net.Listen("tcp", fmt.Sprintf("[::]:%d", port)); err != nil {
			return err
		}
		ul, err = net.ListenPacket("udp", fmt.Sprintf("[::]:%d", port))
		return err
	})
	if err != nil {
		t.Fatalf("starting servers in %s: %v", n.Path(), err)
	}
	t.Cleanup(func() { tl.Close(); ul.Close() })
	go func() {
		for {
			c, err := tl.Accept()
			if err != nil {
				return
			}
			ip := c.RemoteAddr().(*net.TCPAddr).IP
			fmt.Fprintf(c, "%s %s", name, ip)
			c.Close()
		}
	}()
	go func() {
		buf := make([]byte, 512)
		for {
			_, from, err := ul.ReadFrom(buf)
			if err != nil {
				return
			}
			ip := from.(*net.UDPAddr).IP
			_, _ = ul.WriteTo([]byte(fmt.Sprintf("%s %s", name, ip)), from)
		}
	}()
}

// pmDial connects from netns n to addr over network (tcp or udp) and returns the
// server's answer. It retries for up to wait (IPv6 gateways may still be in DAD).
func pmDial(n ns.NetNS, network, addr string, wait time.Duration) (string, error) {
	deadline := time.Now().Add(wait)
	for {
		got, err := pmDialOnce(n, network, addr, nil)
		if err == nil || time.Now().After(deadline) {
			return got, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func pmDialOnce(n ns.NetNS, network, addr string, laddr net.Addr) (string, error) {
	var c net.Conn
	err := n.Do(func(ns.NetNS) error {
		d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: laddr}
		var err error
		c, err = d.Dial(network, addr)
		return err
	})
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if network == "udp" {
		if _, err := c.Write([]byte("ping")); err != nil {
			return "", err
		}
		buf := make([]byte, 512)
		k, err := c.Read(buf)
		return string(buf[:k]), err
	}
	b, err := io.ReadAll(c)
	return string(b), err
}

// pmExpect requires that a connection from n to addr lands on server want and that
// the server saw source src ("" to skip that check).
func pmExpect(t *testing.T, what string, n ns.NetNS, network, addr, want, src string) {
	t.Helper()
	got, err := pmDial(n, network, addr, 5*time.Second)
	if err != nil {
		t.Errorf("%s: %s %s: %v", what, network, addr, err)
		return
	}
	f := strings.Fields(got)
	if len(f) != 2 || f[0] != want || (src != "" && f[1] != src) {
		t.Errorf("%s: %s %s answered %q, want server %s seeing source %s", what, network, addr, got, want, src)
	}
}

// pmRules returns what the node's netfilter shows of portmap, both backends, as text.
func pmRules(t *testing.T, h *nstest.H) string {
	t.Helper()
	out, _ := nstest.RunIn(h.HostNS, "sh", "-c",
		"iptables-save -t nat 2>/dev/null | grep -E 'CNI-|pw:'; ip6tables-save -t nat 2>/dev/null | grep -E 'CNI-|pw:'; nft list table inet podwire_hostport 2>/dev/null; true")
	return out
}

// pmWarmUp runs one ADD with a mapping and one DEL, so the bridge and its sysctls
// exist before the test's snapshot (route_localnet is back to 0 after the DEL).
func pmWarmUp(t *testing.T, h *nstest.H, list *libcni.NetworkConfigList) {
	t.Helper()
	p := h.NewPod()
	rt := h.RT(p, "eth0", pmMap("tcp:1:1"))
	h.MustAdd(list, rt)
	waitLinkLocal(t, h, h.Name("br")) // bridge_test.go: the link-local address comes late
	h.MustDel(list, rt)
	h.DeletePod(p)
	pmSettle(t, h)
}

// pmSettle waits until the bridge without ports shows no carrier and no tentative
// address, so snapshots do not race the kernel.
func pmSettle(t *testing.T, h *nstest.H) {
	t.Helper()
	br := h.Name("br")
	for i := 0; i < 100; i++ {
		l, _ := nstest.RunIn(h.HostNS, "ip", "-o", "link", "show", br)
		a, _ := nstest.RunIn(h.HostNS, "ip", "-o", "addr", "show", "dev", br)
		if strings.Contains(l, "NO-CARRIER") && !strings.Contains(a, "tentative") {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("bridge %s did not settle", br)
}

func pmAddr(t *testing.T, r *current.Result, v6 bool) string {
	t.Helper()
	for _, ip := range r.IPs {
		if (ip.Address.IP.To4() == nil) == v6 {
			return ip.Address.IP.String()
		}
	}
	t.Fatalf("no IPv6=%v address in %v", v6, r)
	return ""
}

func pmMarkers(t *testing.T, network string) []string {
	t.Helper()
	ents, _ := os.ReadDir(pmStateDir)
	var out []string
	for _, e := range ents {
		b, _ := os.ReadFile(filepath.Join(pmStateDir, e.Name()))
		if strings.Contains(string(b), `"owner":"`+network+"/") {
			out = append(out, e.Name())
		}
	}
	return out
}

// TestPortmapTraffic forwards TCP and UDP host ports to a pod on both backends and
// checks every path a client takes: an external host, the node itself by its address
// and by 127.0.0.1, the pod to its own host port (hairpin), a hostIP-restricted
// mapping, IPv6; then CHECK, STATUS and a DEL that leaves no rule.
func TestPortmapTraffic(t *testing.T) {
	for _, kind := range pmBackends {
		t.Run(string(kind), func(t *testing.T) { pmTraffic(t, kind) })
	}
}

func pmTraffic(t *testing.T, kind netfilter.Kind) {
	h := nstest.New(t)
	client := pmNode(t, h)
	list := pmConf(h, pmBackend(kind))
	pmWarmUp(t, h, list)
	before := h.Snapshot()

	pod := h.NewPod()
	pmServe(t, pod, "pod", 80)
	pmServe(t, pod, "pod9", 90)
	rt := h.RT(pod, "eth0", pmMap("tcp:8080:80", "udp:8080:80", "tcp:9090:90:"+pmNode4))
	res := h.MustAdd(list, rt)
	pod4, pod6 := pmAddr(t, res, false), pmAddr(t, res, true)
	rules := pmRules(t, h)
	if !strings.Contains(rules, pod4) || !strings.Contains(rules, pod6) {
		t.Errorf("rules do not forward to %s and %s:\n%s", pod4, pod6, rules)
	}
	if kind == netfilter.KindIPTables && !strings.Contains(rules, netfilter.HostPortChain(list.Name, rt.ContainerID)) {
		t.Errorf("no per-container chain %s:\n%s", netfilter.HostPortChain(list.Name, rt.ContainerID), rules)
	}
	if got := len(pmMarkers(t, list.Name)); got != 1 {
		t.Errorf("%d markers for the attachment, want 1", got)
	}
	if got := strings.TrimSpace(h.Run(h.HostNS, "cat", "/proc/sys/net/ipv4/conf/"+h.Name("br")+"/route_localnet")); got != "1" {
		t.Errorf("route_localnet on the bridge = %s while a pod has host ports, want 1", got)
	}

	// External client: the pod sees the client's own address.
	pmExpect(t, "external tcp", client, "tcp", pmNode4+":8080", "pod", pmClient4)
	pmExpect(t, "external udp", client, "udp", pmNode4+":8080", "pod", pmClient4)
	pmExpect(t, "external tcp ipv6", client, "tcp", "["+pmNode6+"]:8080", "pod", pmClient6)
	pmExpect(t, "external udp ipv6", client, "udp", "["+pmNode6+"]:8080", "pod", pmClient6)
	// The node itself, by its address and through 127.0.0.1 (masqueraded to
	// the bridge address, since 127.0.0.1 cannot be answered from the pod).
	pmExpect(t, "node tcp", h.HostNS, "tcp", pmNode4+":8080", "pod", "")
	pmExpect(t, "node udp", h.HostNS, "udp", pmNode4+":8080", "pod", "")
	pmExpect(t, "localhost tcp", h.HostNS, "tcp", "127.0.0.1:8080", "pod", pmGW4)
	pmExpect(t, "localhost udp", h.HostNS, "udp", "127.0.0.1:8080", "pod", pmGW4)
	pmExpect(t, "node tcp ipv6", h.HostNS, "tcp", "["+pmNode6+"]:8080", "pod", "")
	// Hairpin: the pod reaches itself through the node; the masquerade makes
	// the answer come back through the node.
	pmExpect(t, "hairpin tcp", pod, "tcp", pmNode4+":8080", "pod", pmGW4)
	pmExpect(t, "hairpin udp", pod, "udp", pmNode4+":8080", "pod", pmGW4)
	pmExpect(t, "hairpin tcp ipv6", pod, "tcp", "["+pmNode6+"]:8080", "pod", "fd77::1")
	// hostIP: only that address answers.
	pmExpect(t, "hostIP tcp", client, "tcp", pmNode4+":9090", "pod9", pmClient4)
	if got, err := pmDialOnce(client, "tcp", pmOther4+":9090", nil); err == nil {
		t.Errorf("hostIP %s mapping answered on %s: %q", pmNode4, pmOther4, got)
	}
	if got, err := pmDialOnce(client, "tcp", "["+pmNode6+"]:9090", nil); err == nil {
		t.Errorf("IPv4 hostIP mapping answered on IPv6: %q", got)
	}
	// A port nobody mapped is not forwarded.
	if got, err := pmDialOnce(client, "tcp", pmNode4+":8081", nil); err == nil {
		t.Errorf("unmapped port answered: %q", got)
	}

	if err := h.Check(list, rt); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	if err := h.Status(list); err != nil {
		t.Errorf("STATUS: %v", err)
	}
	h.MustDel(list, rt)
	if rules := pmRules(t, h); rules != "" {
		t.Errorf("rules left after DEL:\n%s", rules)
	}
	if _, err := pmDialOnce(client, "tcp", pmNode4+":8080", nil); err == nil {
		t.Error("host port still forwarded after DEL")
	}
	h.MustDel(list, rt) // DEL is idempotent
	if got := len(pmMarkers(t, list.Name)); got != 0 {
		t.Errorf("%d markers left after DEL", got)
	}
	pmSettle(t, h)
	h.RequireUnchanged(before)
}

// TestPortmapExternalSetMarkChain shares kube-proxy's masquerade mark: hairpin and
// localhost connections jump to a pre-created KUBE-MARK-MASQ, and kube-proxy's own
// POSTROUTING rule masquerades them.
func TestPortmapExternalSetMarkChain(t *testing.T) {
	h := nstest.New(t)
	client := pmNode(t, h)
	// kube-proxy (dual stack) creates these in both families.
	for _, restore := range []string{"iptables-restore", "ip6tables-restore"} {
		h.Run(h.HostNS, "sh", "-c", restore+` --noflush <<'EOF'
*nat
:KUBE-MARK-MASQ - [0:0]
:KUBE-POSTROUTING - [0:0]
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A KUBE-POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE
COMMIT
EOF`)
	}
	list := pmConf(h, `"externalSetMarkChain":"KUBE-MARK-MASQ"`)
	pmWarmUp(t, h, list)
	before := h.Snapshot()

	pod := h.NewPod()
	pmServe(t, pod, "pod", 80)
	rt := h.RT(pod, "eth0", pmMap("tcp:8080:80"))
	h.MustAdd(list, rt)
	rules := pmRules(t, h)
	if !strings.Contains(rules, "-j KUBE-MARK-MASQ") || strings.Contains(rules, "CNI-HOSTPORT-MASQ") {
		t.Errorf("marking does not go through KUBE-MARK-MASQ alone:\n%s", rules)
	}
	pmExpect(t, "external", client, "tcp", pmNode4+":8080", "pod", pmClient4)
	pmExpect(t, "localhost", h.HostNS, "tcp", "127.0.0.1:8080", "pod", pmGW4)
	pmExpect(t, "hairpin", pod, "tcp", pmNode4+":8080", "pod", pmGW4)
	pmExpect(t, "hairpin ipv6", pod, "tcp", "["+pmNode6+"]:8080", "pod", "fd77::1")
	if err := h.Check(list, rt); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	h.MustDel(list, rt)
	pmSettle(t, h)
	h.RequireUnchanged(before)

	// Without the chain, ADD fails with a code-7 error saying what to do, and leaves
	// nothing behind.
	for _, ipt := range []string{"iptables", "ip6tables"} {
		h.Run(h.HostNS, "sh", "-c", strings.ReplaceAll("IPT -t nat -D POSTROUTING -m comment --comment 'kubernetes postrouting rules' -j KUBE-POSTROUTING && IPT -t nat -F KUBE-POSTROUTING && IPT -t nat -X KUBE-POSTROUTING && IPT -t nat -F KUBE-MARK-MASQ && IPT -t nat -X KUBE-MARK-MASQ", "IPT", ipt))
	}
	bare := h.Snapshot()
	pod2 := h.NewPod()
	rt2 := h.RT(pod2, "eth0", pmMap("tcp:8080:80"))
	_, err := h.Add(list, rt2)
	var cerr *types.Error
	if !errors.As(err, &cerr) || cerr.Code != 7 || !strings.Contains(cerr.Error(), "KUBE-MARK-MASQ") {
		t.Errorf("ADD without KUBE-MARK-MASQ = %v, want a code-7 error naming it", err)
	}
	if rules := pmRules(t, h); rules != "" || len(pmMarkers(t, list.Name)) != 0 {
		t.Errorf("the failed ADD left portmap state: markers %v, rules:\n%s", pmMarkers(t, list.Name), rules)
	}
	h.MustDel(list, rt2) // as the runtime does after a failed ADD (removes bridge's veth)
	pmSettle(t, h)
	h.RequireUnchanged(bare)
}

// TestPortmapGC attaches three pods, runs GC listing only the second, and requires the
// first and third to lose their host ports while the second keeps working.
func TestPortmapGC(t *testing.T) {
	for _, kind := range pmBackends {
		t.Run(string(kind), func(t *testing.T) {
			h := nstest.New(t)
			client := pmNode(t, h)
			list := pmConf(h, pmBackend(kind))
			pmWarmUp(t, h, list)
			before := h.Snapshot()
			var rts []*libcni.RuntimeConf
			var pods []ns.NetNS
			for i := 0; i < 3; i++ {
				p := h.NewPod()
				pmServe(t, p, fmt.Sprintf("pod%d", i), 80)
				rt := h.RT(p, "eth0", pmMap(fmt.Sprintf("tcp:%d:80", 8000+i), fmt.Sprintf("udp:%d:80", 8000+i)))
				h.MustAdd(list, rt)
				rts, pods = append(rts, rt), append(pods, p)
			}
			for i := range rts {
				pmExpect(t, "before GC", client, "tcp", fmt.Sprintf("%s:%d", pmNode4, 8000+i), fmt.Sprintf("pod%d", i), pmClient4)
			}
			valid := []types.GCAttachment{{ContainerID: rts[1].ContainerID, IfName: "eth0"}}
			if err := h.GC(list, valid); err != nil {
				t.Fatalf("GC: %v", err)
			}
			for _, i := range []int{0, 2} {
				if got, err := pmDialOnce(client, "tcp", fmt.Sprintf("%s:%d", pmNode4, 8000+i), nil); err == nil {
					t.Errorf("pod%d's host port still answers after GC: %q", i, got)
				}
			}
			pmExpect(t, "kept by GC", client, "tcp", fmt.Sprintf("%s:8001", pmNode4), "pod1", pmClient4)
			if got := len(pmMarkers(t, list.Name)); got != 1 {
				t.Errorf("%d markers after GC, want 1", got)
			}
			if err := h.Check(list, rts[1]); err != nil {
				t.Errorf("CHECK of the kept pod: %v", err)
			}
			// GC does not touch another network's attachments: the bridge plugin's GC
			// ran too and removed the veths of pods 0 and 2, so DEL them now.
			for i, rt := range rts {
				h.MustDel(list, rt)
				h.DeletePod(pods[i])
			}
			pmSettle(t, h)
			h.RequireUnchanged(before)
		})
	}
}

// TestPortmapUDPConntrack shows the UDP conntrack flush on ADD and DEL: a client flow
// to a host service that conntrack remembers must reach the pod once the port is
// mapped, and the host service again once it is unmapped, from the same source port.
func TestPortmapUDPConntrack(t *testing.T) {
	for _, kind := range pmBackends {
		t.Run(string(kind), func(t *testing.T) {
			h := nstest.New(t)
			client := pmNode(t, h)
			list := pmConf(h, pmBackend(kind))
			pmWarmUp(t, h, list)
			// A first pod with a TCP mapping keeps NAT (and so connection tracking) on.
			keep := h.NewPod()
			keepRT := h.RT(keep, "eth0", pmMap("tcp:7000:80"))
			h.MustAdd(list, keepRT)
			pmServe(t, h.HostNS, "host", 5353)
			laddr := &net.UDPAddr{IP: net.ParseIP(pmClient4), Port: 40555}
			send := func() string {
				got, err := pmDialOnce(client, "udp", pmNode4+":5353", laddr)
				if err != nil {
					return "error: " + err.Error()
				}
				return strings.Fields(got)[0]
			}
			if got := send(); got != "host" {
				t.Fatalf("before ADD the host service answers; got %s", got)
			}
			pod := h.NewPod()
			pmServe(t, pod, "pod", 53)
			rt := h.RT(pod, "eth0", pmMap("udp:5353:53"))
			h.MustAdd(list, rt)
			if got := send(); got != "pod" {
				t.Errorf("after ADD the same UDP flow reaches %s, want the pod (stale conntrack entry not flushed)", got)
			}
			h.MustDel(list, rt)
			if got := send(); got != "host" {
				t.Errorf("after DEL the same UDP flow reaches %s, want the host service (stale conntrack entry not flushed)", got)
			}
			h.MustDel(list, keepRT)
		})
	}
}

// TestPortmapConcurrentAdds starts 32 ADDs with distinct host ports at once on the
// iptables backend: all must succeed (the xtables lock is waited for, not failed on).
func TestPortmapConcurrentAdds(t *testing.T) {
	h := nstest.New(t)
	list := pmConf(h, pmBackend(netfilter.KindIPTables))
	pmWarmUp(t, h, list)
	before := h.Snapshot()
	const n = 32
	rts := make([]*libcni.RuntimeConf, n)
	for i := range rts {
		rts[i] = h.RT(h.NewPod(), "eth0", pmMap(fmt.Sprintf("tcp:%d:80", 10000+i)))
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range rts {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			_, errs[i] = h.Add(list, rts[i])
		}(i)
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("ADD %d: %v", i, err)
		}
	}
	rules := pmRules(t, h)
	if got := strings.Count(rules, "-A CNI-HOSTPORT-DNAT "); got != 2*n {
		t.Errorf("%d jumps in CNI-HOSTPORT-DNAT (IPv4 and IPv6), want %d", got, 2*n)
	}
	for i := range rts {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			errs[i] = h.Del(list, rts[i])
		}(i)
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("DEL %d: %v", i, err)
		}
	}
	pmSettle(t, h)
	h.RequireUnchanged(before)
}

// TestPortmapBadInput runs the binary directly with input ADD must refuse: a clear
// code-7 error, and nothing created.
func TestPortmapBadInput(t *testing.T) {
	h := nstest.New(t)
	pod := h.NewPod()
	before := h.Snapshot()
	prev := `"prevResult":{"cniVersion":"1.1.0","interfaces":[{"name":"eth0","sandbox":"` + pod.Path() + `"}],"ips":[{"interface":0,"address":"10.77.0.5/24"}]}`
	for _, tc := range []struct {
		name, conf, want string
	}{
		{"host port 0", prev + `,"runtimeConfig":{"portMappings":[{"hostPort":0,"containerPort":80,"protocol":"tcp"}]}`, "hostPort"},
		{"host port above 65535", prev + `,"runtimeConfig":{"portMappings":[{"hostPort":65536,"containerPort":80,"protocol":"tcp"}]}`, "1-65535"},
		{"container port above 65535", prev + `,"runtimeConfig":{"portMappings":[{"hostPort":80,"containerPort":99999,"protocol":"tcp"}]}`, "containerPort"},
		{"unknown protocol", prev + `,"runtimeConfig":{"portMappings":[{"hostPort":80,"containerPort":80,"protocol":"icmp"}]}`, "icmp"},
		{"invalid hostIP", prev + `,"runtimeConfig":{"portMappings":[{"hostPort":80,"containerPort":80,"hostIP":"999.1.1.1"}]}`, "999.1.1.1"},
		{"missing prevResult", `"runtimeConfig":{"portMappings":[{"hostPort":80,"containerPort":80}]}`, "prevResult"},
		{"condition injection", prev + `,"conditionsV4":["-j","ACCEPT"],"runtimeConfig":{"portMappings":[{"hostPort":80,"containerPort":80}]}`, "conditionsV4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conf := `{"cniVersion":"1.1.0","name":"` + h.Prefix + `bad","type":"portmap",` + tc.conf + `}`
			out, code := h.Exec("portmap", map[string]string{"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "ctr1",
				"CNI_NETNS": pod.Path(), "CNI_IFNAME": "eth0"}, conf)
			e, err := nstest.CNIError(out)
			if err != nil || code == 0 {
				t.Fatalf("exit %d: %v", code, err)
			}
			if e.Code != 7 || !strings.Contains(e.Msg+e.Details, tc.want) {
				t.Errorf("error %d %q %q; want code 7 mentioning %q", e.Code, e.Msg, e.Details, tc.want)
			}
		})
	}
	if got := len(pmMarkers(t, h.Prefix+"bad")); got != 0 {
		t.Errorf("%d markers written for refused ADDs", got)
	}
	h.RequireUnchanged(before)
}

// TestPortmapOwnership attaches one container to two networks (as Multus does), each
// with a host port, and removes one attachment with a DEL that carries no
// portMappings (runtimes need not pass them again): only that attachment's forward
// goes, on both backends.
func TestPortmapOwnership(t *testing.T) {
	for _, kind := range pmBackends {
		t.Run(string(kind), func(t *testing.T) {
			h := nstest.New(t)
			client := pmNode(t, h)
			netA := pmConf(h, pmBackend(kind))
			netB := h.Conflist(`{"cniVersion":"1.1.0","name":"@PREFIX@netb","plugins":[
			 {"type":"bridge","bridge":"@PREFIX@bb","isGateway":true,"hairpinMode":true,
			  "ipam":{"type":"host-local","ranges":[[{"subnet":"10.79.0.0/24"}]],"dataDir":"@DATADIR@"}},
			 {"type":"portmap","capabilities":{"portMappings":true},` + pmBackend(kind) + `}]}`)
			pmWarmUp(t, h, netA)
			pod := h.NewPod()
			pmServe(t, pod, "pod", 80)
			rtA := h.RT(pod, "eth0", pmMap("tcp:8080:80"))
			rtB := h.RT(pod, "net1", pmMap("tcp:8081:80"))
			h.MustAdd(netA, rtA)
			h.MustAdd(netB, rtB)
			// The pod's default route goes through network A; let it answer the client
			// through network B too, so B keeps working when A goes.
			h.Run(pod, "ip", "route", "add", "192.0.2.0/24", "via", "10.79.0.1", "dev", "net1")
			pmExpect(t, "network A", client, "tcp", pmNode4+":8080", "pod", pmClient4)
			pmExpect(t, "network B", client, "tcp", pmNode4+":8081", "pod", pmClient4)

			h.MustDel(netA, h.RT(pod, "eth0")) // no portMappings in this DEL
			if got, err := pmDialOnce(client, "tcp", pmNode4+":8080", nil); err == nil {
				t.Errorf("network A's host port still answers after its DEL: %q", got)
			}
			pmExpect(t, "network B after A's DEL", client, "tcp", pmNode4+":8081", "pod", pmClient4)
			if err := h.Check(netB, rtB); err != nil {
				t.Errorf("CHECK of network B: %v", err)
			}
			if rules := pmRules(t, h); strings.Contains(rules, netA.Name+"/") || !strings.Contains(rules, netB.Name+"/") {
				t.Errorf("rules after A's DEL:\n%s", rules)
			}
			h.MustDel(netB, h.RT(pod, "net1"))
			if rules := pmRules(t, h); rules != "" {
				t.Errorf("rules left:\n%s", rules)
			}
		})
	}
}

// TestPortmapConditions restricts a host port to one client address with
// conditionsV4 (iptables syntax, accepted by both backends): the external client gets
// through, the node itself does not.
func TestPortmapConditions(t *testing.T) {
	for _, kind := range pmBackends {
		t.Run(string(kind), func(t *testing.T) {
			h := nstest.New(t)
			client := pmNode(t, h)
			list := pmConf(h, pmBackend(kind)+`,"conditionsV4":["-s","`+pmClient4+`/32"]`)
			pod := h.NewPod()
			pmServe(t, pod, "pod", 80)
			rt := h.RT(pod, "eth0", pmMap("tcp:8080:80"))
			h.MustAdd(list, rt)
			pmExpect(t, "allowed client", client, "tcp", pmNode4+":8080", "pod", pmClient4)
			if got, err := pmDialOnce(h.HostNS, "tcp", pmNode4+":8080", nil); err == nil {
				t.Errorf("the node got through a condition that only allows %s: %q", pmClient4, got)
			}
			pmExpect(t, "IPv6 has no condition", client, "tcp", "["+pmNode6+"]:8080", "pod", pmClient6)
			if err := h.Check(list, rt); err != nil {
				t.Errorf("CHECK: %v", err)
			}
			h.MustDel(list, rt)
			if rules := pmRules(t, h); rules != "" {
				t.Errorf("rules left:\n%s", rules)
			}
		})
	}
}
