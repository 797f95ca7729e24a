// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/podwire/podwire/integration/nodestate"
)

var intstr8080 = intstr.FromInt32(8080)

// proxyModes are the kube-proxy modes the checks run in (LAB_MODES=iptables narrows it).
func proxyModes() []string {
	if v := os.Getenv("LAB_MODES"); v != "" {
		return strings.Split(v, ",")
	}
	return []string{"iptables", "nftables"}
}

// TestLab runs podwire's checks against the lab in each kube-proxy mode: kube-proxy is
// restarted in the mode, the pods and Services are made afresh, and at the end every
// node must be back to its snapshot from before the pods.
func TestLab(t *testing.T) {
	p := needLab(t)
	for _, mode := range proxyModes() {
		t.Run(mode, func(t *testing.T) {
			p, err := SetProxyMode(p.Dir, mode)
			if err != nil {
				t.Fatal(err)
			}
			checks(t, p)
		})
	}
}

func checks(t *testing.T, p Plan) {
	n1, n2 := p.Nodes[0], p.Nodes[len(p.Nodes)-1]
	before := map[string]nodestate.Snapshot{}
	for _, n := range p.Nodes {
		before[n.Name] = settledSnapshot(t, n)
	}
	f := newFixture(t, p)
	f.run(agnhost("srv1", n1.Name, map[string]string{"app": "srv1"}),
		agnhost("cli1", n1.Name, nil), agnhost("cli2", n2.Name, nil))
	svc := f.service("srv1", corev1.ServiceTypeNodePort)
	ip := func(pod string) string { return f.pods[pod].Status.PodIP }
	curl := "curl -sS --max-time 3 "
	clientIP := func(want string) func(string) bool {
		return func(out string) bool { h, _, err := net.SplitHostPort(out); return err == nil && h == want }
	}
	is := func(want string) func(string) bool { return func(out string) bool { return out == want } }

	t.Run("PodToPodNoNAT", func(t *testing.T) {
		f.t = t
		// Across nodes the server sees the client pod's own address.
		f.expect("cli2", curl+"http://"+ip("srv1")+":8080/clientip", clientIP(ip("cli2")), "cross-node /clientip")
		f.expect("cli1", curl+"http://"+ip("srv1")+":8080/clientip", clientIP(ip("cli1")), "same-node /clientip")
	})
	t.Run("EgressMasqueraded", func(t *testing.T) {
		f.t = t
		// Outside the cluster CIDR (the machine's side of the segment) a pod's traffic
		// arrives from its node's address.
		addr, stop := remoteAddrServer(t, p.HostIP.String())
		defer stop()
		f.expect("cli1", curl+"http://"+addr+"/", is(n1.IP.String()), "masqueraded source")
	})
	t.Run("ClusterIP", func(t *testing.T) {
		f.t = t
		url := fmt.Sprintf("http://%s:80/hostname", svc.Spec.ClusterIP)
		f.expect("cli1", curl+url, is("srv1"), "ClusterIP from the same node")
		f.expect("cli2", curl+url, is("srv1"), "ClusterIP from the other node")
		f.expect("srv1", curl+url, is("srv1"), "hairpin: a pod to its own Service")
	})
	t.Run("NodePort", func(t *testing.T) {
		f.t = t
		port := svc.Spec.Ports[0].NodePort
		for _, n := range p.Nodes {
			eventuallyHTTP(t, fmt.Sprintf("http://%s:%d/hostname", n.IP, port), "srv1")
		}
	})
	t.Run("DNS", func(t *testing.T) {
		f.t = t
		f.expect("cli2", "dig +short +search kubernetes.default", is(p.ServiceAPI.String()), "kubernetes.default")
		f.expect("cli2", "dig +short +search srv1", is(svc.Spec.ClusterIP), "a Service name in the pod's namespace")
		f.expect("cli1", fmt.Sprintf("dig +short srv1.%s.svc.cluster.local", f.ns), is(svc.Spec.ClusterIP), "a Service's FQDN")
	})
	// On every node: a containerd node's hostPorts are podwire's portmap, a CRI-O
	// node's are CRI-O's own nftables table (it never passes portMappings to CNI).
	t.Run("HostPort", func(t *testing.T) {
		for i, n := range p.Nodes {
			other := "cli2"
			if n.Name != n1.Name {
				other = "cli1"
			}
			t.Run(n.Name+"-"+n.Runtime, func(t *testing.T) {
				f.t = t
				name := func(s string) string { return fmt.Sprintf("%s%d", s, i+1) }
				hp := agnhost(name("hp"), n.Name, nil)
				hp.Spec.Containers[0].Ports[0].HostPort = 31080
				hp.Spec.Containers[0].Ports[1].HostPort = 31081
				lo := agnhost(name("hplo"), n.Name, nil)
				lo.Spec.Containers[0].Ports[0].HostPort, lo.Spec.Containers[0].Ports[0].HostIP = 31090, "127.0.0.1"
				lo.Spec.Containers[0].Ports[1].HostPort, lo.Spec.Containers[0].Ports[1].HostIP = 31091, "127.0.0.1"
				hn := agnhost(name("hostnet"), n.Name, nil)
				hn.Spec.HostNetwork = true
				hn.Spec.Containers[0].Args = []string{"netexec", "--http-port=18080", "--udp-port=18081"}
				hn.Spec.Containers[0].Ports = nil
				hn.Spec.Containers[0].ReadinessProbe.HTTPGet.Port = intstr.FromInt32(18080)
				f.run(hp, lo, hn)
				if n.Runtime == RuntimeCRIO {
					elems := strings.Join(crioHostPorts(t, n), "\n")
					for _, port := range []string{"31080", "31081", "31090", "31091"} {
						if !strings.Contains(elems, port) {
							t.Errorf("node %s (CRI-O): no element for hostPort %s in CRI-O's crio-hostports maps:\n%s", n.Name, port, elems)
						}
					}
				}
				eventuallyHTTP(t, fmt.Sprintf("http://%s:31080/hostname", n.IP), name("hp"))
				eventuallyUDP(t, fmt.Sprintf("%s:31081", n.IP), name("hp"))
				f.expect(other, fmt.Sprintf(curl+"http://%s:31080/hostname", n.IP), is(name("hp")), "hostPort from a pod on the other node")
				f.expect(name("hostnet"), curl+"http://127.0.0.1:31090/hostname", is(name("hplo")), "tcp hostPort on 127.0.0.1")
				f.expect(name("hostnet"), "echo hostname | nc -u -w 2 127.0.0.1 31091", is(name("hplo")), "udp hostPort on 127.0.0.1")
			})
		}
	})
	t.Run("Bandwidth", func(t *testing.T) {
		for _, n := range p.Nodes {
			t.Run(n.Name+"-"+n.Runtime, func(t *testing.T) {
				f.t = t
				testBandwidth(t, f, p, n)
			})
		}
	})
	t.Run("Cleanup", func(t *testing.T) {
		f.t = t
		f.deleteNamespace()
		for _, n := range p.Nodes {
			var d string
			deadline := time.Now().Add(time.Minute)
			for {
				if d = nodestate.Diff(before[n.Name], nodeSnapshot(t, n)); d == "" || time.Now().After(deadline) {
					break
				}
				time.Sleep(2 * time.Second)
			}
			if d != "" {
				t.Errorf("node %s after deleting every pod differs from before them:\n%s", n.Name, d)
			}
			if n.Runtime == RuntimeCRIO {
				if left := crioHostPorts(t, n); len(left) > 0 {
					t.Errorf("node %s (CRI-O): hostPort elements left in crio-hostports after deleting every pod:\n%s", n.Name, strings.Join(left, "\n"))
				}
			}
		}
	})
}

// settledSnapshot is nodeSnapshot once two taken 3 s apart agree: a kube-proxy just
// restarted in another mode is still replacing the other mode's rules.
func settledSnapshot(t *testing.T, n Node) nodestate.Snapshot {
	t.Helper()
	prev := nodeSnapshot(t, n)
	for i := 0; i < 20; i++ {
		time.Sleep(3 * time.Second)
		cur := nodeSnapshot(t, n)
		if nodestate.Diff(prev, cur) == "" {
			return cur
		}
		prev = cur
	}
	t.Fatalf("node %s's rules did not settle within a minute", n.Name)
	return nil
}

// nodeSnapshot is the node's network state and its host-local leases, without
// kube-proxy's own objects (its nftables tables, its KUBE- iptables chains): podwire
// never writes there, and kube-proxy in nftables mode deletes a deleted Service's
// emptied chains only in a later sync, after the minute the check waits.
func nodeSnapshot(t *testing.T, n Node) nodestate.Snapshot {
	t.Helper()
	s, err := nodestate.Take(n.NetNS, n.Path("fs", "/var/lib/cni", "networks"))
	if err != nil {
		t.Fatal(err)
	}
	for _, sec := range []string{"nft", "iptables-save", "ip6tables-save"} {
		var keep []string
		for _, l := range strings.Split(s[sec], "\n") {
			if !strings.Contains(l, " kube-proxy ") && !strings.Contains(l, "KUBE-") {
				keep = append(keep, l)
			}
		}
		s[sec] = strings.Join(keep, "\n")
	}
	if n.Runtime == RuntimeCRIO {
		// CRI-O makes its hostPort table (chains, static rules, empty maps) at its first
		// hostPort pod and keeps it: its skeleton is not a pod's state. What a pod adds
		// there are map elements, which Cleanup requires gone (crioHostPorts).
		var keep []string
		for _, l := range strings.Split(s["nft"], "\n") {
			if !strings.Contains(l, " "+crioHostPortsTable) && !crioHostPortsObjects[l] {
				keep = append(keep, l)
			}
		}
		s["nft"] = strings.Join(keep, "\n")
	}
	return s
}

// CRI-O's hostPort table and its maps and set (cri-o internal/hostport/hostport_nftables.go).
const crioHostPortsTable = "crio-hostports"

var crioHostPortsObjects = map[string]bool{"map hostports": true, "map hostipports": true, "set hairpins": true}

// crioHostPorts lists the elements of CRI-O's hostPort maps and set in n's netns, both
// families: one per hostPort of a running pod (and its hairpin entry).
func crioHostPorts(t *testing.T, n Node) []string {
	t.Helper()
	var out []string
	for _, fam := range []string{"ip", "ip6"} {
		js, err := run(inNode(n, "nft", "-j", "list", "table", fam, crioHostPortsTable)...)
		if err != nil {
			if strings.Contains(err.Error(), "No such file or directory") {
				continue // no hostPort pod yet: CRI-O has not made the table
			}
			t.Fatal(err)
		}
		var doc struct {
			Nftables []map[string]struct {
				Name string            `json:"name"`
				Elem []json.RawMessage `json:"elem"`
			} `json:"nftables"`
		}
		if err := json.Unmarshal([]byte(js), &doc); err != nil {
			t.Fatalf("node %s: nft -j list table %s %s: %v", n.Name, fam, crioHostPortsTable, err)
		}
		for _, o := range doc.Nftables {
			for _, kind := range []string{"map", "set"} {
				for _, e := range o[kind].Elem {
					out = append(out, fam+" "+kind+" "+o[kind].Name+": "+string(e))
				}
			}
		}
	}
	return out
}

// service makes a Service in front of the pods labelled app=name, port 80 → 8080.
func (f *fixture) service(name string, typ corev1.ServiceType) *corev1.Service {
	f.t.Helper()
	svc, err := f.c.CoreV1().Services(f.ns).Create(context.Background(), &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{Type: typ, Selector: map[string]string{"app": name},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr8080, Protocol: corev1.ProtocolTCP}}},
	}, metav1.CreateOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	return svc
}

// remoteAddrServer answers every HTTP request with the caller's IP, on host.
func remoteAddrServer(t *testing.T, host string) (string, func()) {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, _, _ := net.SplitHostPort(r.RemoteAddr)
		fmt.Fprint(w, h)
	})}
	go func() { _ = srv.Serve(l) }()
	return l.Addr().String(), func() { _ = srv.Close() }
}

func eventuallyHTTP(t *testing.T, url, want string) {
	t.Helper()
	c := &http.Client{Timeout: 3 * time.Second}
	eventually(t, 30*time.Second, func() error {
		resp, err := c.Get(url)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if strings.TrimSpace(string(b)) != want {
			return fmt.Errorf("GET %s: %q, want %q", url, b, want)
		}
		return nil
	})
}

// eventuallyUDP sends agnhost's "hostname" command to addr until the answer is want.
func eventuallyUDP(t *testing.T, addr, want string) {
	t.Helper()
	eventually(t, 30*time.Second, func() error {
		conn, err := net.Dial("udp", addr)
		if err != nil {
			return err
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := conn.Write([]byte("hostname\n")); err != nil {
			return err
		}
		buf := make([]byte, 512)
		n, err := conn.Read(buf)
		if err != nil {
			return fmt.Errorf("udp %s: %w", addr, err)
		}
		line := string(buf[:n])
		if strings.TrimSpace(line) != want {
			return fmt.Errorf("udp %s: %q, want %q", addr, line, want)
		}
		return nil
	})
}
