// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/podwire/podwire/integration/nstest"
)

const loopbackConf = `{"cniVersion":"1.1.0","name":"@PREFIX@-lo","plugins":[{"type":"loopback"}]}`

func loState(t *testing.T, pod ns.NetNS) (up bool, addrs []string) {
	t.Helper()
	err := pod.Do(func(ns.NetNS) error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		up = lo.Attrs().Flags&net.FlagUp != 0
		al, err := netlink.AddrList(lo, netlink.FAMILY_ALL)
		for _, a := range al {
			addrs = append(addrs, a.IPNet.String())
		}
		return err
	})
	if err != nil {
		t.Fatalf("reading lo in pod: %v", err)
	}
	return up, addrs
}

func TestLoopbackLifecycle(t *testing.T) {
	h := nstest.New(t)
	before := h.Snapshot()
	conf := h.Conflist(loopbackConf)
	pod := h.NewPod()
	rt := h.RT(pod, "lo")

	res := h.MustAdd(conf, rt)
	if up, addrs := loState(t, pod); !up || !strings.Contains(strings.Join(addrs, " "), "127.0.0.1/8") {
		t.Fatalf("after ADD: lo up=%v addrs=%v", up, addrs)
	}
	var got []string
	for _, ip := range res.IPs {
		got = append(got, ip.Address.String())
	}
	if strings.Join(got, " ") != "127.0.0.1/8 ::1/128" {
		t.Errorf("ADD result IPs = %v, want 127.0.0.1/8 and ::1/128", got)
	}
	if len(res.Interfaces) != 1 || res.Interfaces[0].Name != "lo" || res.Interfaces[0].Sandbox != pod.Path() {
		t.Errorf("ADD result interfaces = %+v", res.Interfaces)
	}
	t.Log("ADD: lo is up with 127.0.0.1/8 and ::1/128")

	if err := h.Check(conf, rt); err != nil {
		t.Fatalf("CHECK after ADD: %v", err)
	}
	t.Log("CHECK passes")

	h.MustDel(conf, rt)
	if up, _ := loState(t, pod); up {
		t.Fatal("after DEL: lo is still up")
	}
	if err := h.Check(conf, rt); err == nil {
		t.Error("CHECK after DEL (lo down) passed; want failure")
	}
	t.Log("DEL: lo is down")

	h.MustDel(conf, rt)
	t.Log("DEL again succeeds")

	h.DeletePod(pod)
	h.MustDel(conf, rt)
	t.Log("DEL with the netns deleted succeeds")

	// What containerd 2.x leaves of a sandbox shut down without DEL: the netns file,
	// unmounted. DEL succeeds there too (the reference fails), or GC could never drop
	// the attachment's cache entry.
	stale := filepath.Join(t.TempDir(), "cni-unmounted")
	if err := os.WriteFile(stale, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	staleRT := *rt
	staleRT.NetNS = stale
	h.MustDel(conf, &staleRT)
	t.Log("DEL with a netns path that is no longer a netns succeeds")

	if err := h.Status(conf); err != nil {
		t.Errorf("STATUS: %v", err)
	}
	if err := h.GC(conf, nil); err != nil {
		t.Errorf("GC: %v", err)
	}
	h.RequireUnchanged(before)
}

// TestLoopbackBadInput feeds the built binary bad input the way a runtime would and
// requires a JSON CNI error with the right code, a non-zero exit and no change on the
// node.
func TestLoopbackBadInput(t *testing.T) {
	h := nstest.New(t)
	pod := h.NewPod()
	good := `{"cniVersion":"1.0.0","name":"lo","type":"loopback"}`
	env := func(over map[string]string) map[string]string {
		e := map[string]string{"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_IFNAME": "lo", "CNI_NETNS": pod.Path()}
		for k, v := range over {
			if v == "" {
				delete(e, k)
			} else {
				e[k] = v
			}
		}
		return e
	}
	before := h.Snapshot()
	podBefore := snapshotPod(t, pod)
	for _, tc := range []struct {
		name  string
		env   map[string]string
		stdin string
		code  uint
	}{
		{"malformed JSON", nil, `{"cniVersion":"1.0.0",`, 6},
		{"cniVersion not a string", nil, `{"cniVersion":1,"name":"lo","type":"loopback"}`, 6},
		{"unsupported version", nil, `{"cniVersion":"0.5.0","name":"lo","type":"loopback"}`, 1},
		{"container ID with slash", map[string]string{"CNI_CONTAINERID": "../etc"}, good, 4},
		{"container ID dotdot", map[string]string{"CNI_CONTAINERID": ".."}, good, 4},
		{"ifname too long", map[string]string{"CNI_IFNAME": "a234567890123456"}, good, 4},
		{"ifname with slash", map[string]string{"CNI_IFNAME": "x/y"}, good, 4},
		{"missing netns", map[string]string{"CNI_NETNS": ""}, good, 4},
		{"netns does not exist", map[string]string{"CNI_NETNS": "/var/run/netns/podwire-nope"}, good, 4},
		{"hostile network name", nil, `{"cniVersion":"1.0.0","name":"../../etc","type":"loopback"}`, 7},
		{"NUL in network name", nil, `{"cniVersion":"1.0.0","name":"a\u0000b","type":"loopback"}`, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, exit := h.Exec("loopback", env(tc.env), tc.stdin)
			if exit == 0 {
				t.Fatalf("exit 0; stdout %s", out)
			}
			e, err := nstest.CNIError(out)
			if err != nil {
				t.Fatal(err)
			}
			if e.Code != tc.code {
				t.Errorf("code %d (%s), want %d", e.Code, e.Error(), tc.code)
			}
		})
	}
	h.RequireUnchanged(before)
	if after := snapshotPod(t, pod); after != podBefore {
		t.Fatalf("pod netns changed:\n%s\n--\n%s", podBefore, after)
	}
}

func snapshotPod(t *testing.T, pod ns.NetNS) string {
	up, addrs := loState(t, pod)
	return strings.Join(append(addrs, map[bool]string{true: "up", false: "down"}[up]), " ")
}

// TestLoopbackResultShape: loopback prints what the reference's prints at each
// cniVersion. The reference builds a 1.x result labelled with the configuration's
// version and prints it as such, so at 0.3.x and 0.4.0 its IP configs carry no
// "version" (a 0.4.0 reader sees ""), and "dns" is left out; without cniVersion the
// result is converted to 0.1.0 (ip4/ip6). Chained, it passes prevResult on as received.
func TestLoopbackResultShape(t *testing.T) {
	h := nstest.New(t)
	pod := h.NewPod()
	env := map[string]string{"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_IFNAME": "lo", "CNI_NETNS": pod.Path()}
	ips := `"ips":[{"address":"127.0.0.1/8","interface":0},{"address":"::1/128","interface":0}]`
	iface := `"interfaces":[{"mac":"00:00:00:00:00:00","name":"lo","sandbox":"` + pod.Path() + `"}]`
	for _, tc := range []struct{ name, conf, want string }{
		{"0.3.1", `{"cniVersion":"0.3.1","name":"lo","type":"loopback"}`, `{"cniVersion":"0.3.1",` + iface + `,` + ips + `}`},
		{"0.4.0", `{"cniVersion":"0.4.0","name":"lo","type":"loopback"}`, `{"cniVersion":"0.4.0",` + iface + `,` + ips + `}`},
		{"0.2.0", `{"cniVersion":"0.2.0","name":"lo","type":"loopback"}`, `{"cniVersion":"0.2.0",` + iface + `,` + ips + `}`},
		{"1.1.0", `{"cniVersion":"1.1.0","name":"lo","type":"loopback"}`, `{"cniVersion":"1.1.0",` + iface + `,` + ips + `}`},
		{"no cniVersion", `{"name":"lo","type":"loopback"}`, `{"cniVersion":"0.1.0","dns":{},"ip4":{"ip":"127.0.0.1/8"},"ip6":{"ip":"::1/128"}}`},
		{"chained at 0.4.0", `{"cniVersion":"0.4.0","name":"lo","type":"loopback","prevResult":{"cniVersion":"0.4.0","ips":[{"version":"4","address":"10.1.2.3/24"}]}}`,
			`{"cniVersion":"0.4.0","dns":{},"ips":[{"version":"4","address":"10.1.2.3/24"}]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, exit := h.Exec("loopback", env, tc.conf)
			if exit != 0 {
				t.Fatalf("exit %d: %s", exit, out)
			}
			var got, want any
			if err := json.Unmarshal([]byte(out), &got); err != nil {
				t.Fatalf("stdout is not JSON: %v: %s", err, out)
			}
			if err := json.Unmarshal([]byte(tc.want), &want); err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(want, got); d != "" {
				t.Errorf("result (-want +got):\n%s", d)
			}
		})
	}
}

// TestLoopbackExtraAddresses: as the reference, the result holds lo's first address of
// each family, and a non-loopback address on lo fails ADD.
func TestLoopbackExtraAddresses(t *testing.T) {
	h := nstest.New(t)
	pod := h.NewPod()
	env := map[string]string{"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_IFNAME": "lo", "CNI_NETNS": pod.Path()}
	conf := `{"cniVersion":"1.0.0","name":"lo","type":"loopback"}`
	h.Run(pod, "ip", "link", "set", "lo", "up") // the kernel adds 127.0.0.1/8 first
	h.Run(pod, "ip", "addr", "add", "127.0.0.2/8", "dev", "lo")
	out, exit := h.Exec("loopback", env, conf)
	if exit != 0 || strings.Contains(out, "127.0.0.2") || !strings.Contains(out, "127.0.0.1/8") {
		t.Fatalf("with 127.0.0.2 on lo: exit %d, result %s; want 127.0.0.1/8 only", exit, out)
	}
	h.Run(pod, "ip", "addr", "add", "192.0.2.1/32", "dev", "lo")
	out, exit = h.Exec("loopback", env, conf)
	if exit == 0 || !strings.Contains(out, "non-loopback address 192.0.2.1/32") {
		t.Fatalf("with 192.0.2.1 on lo: exit %d, stdout %s; want a failure naming the address", exit, out)
	}
}
