// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/podwire/podwire/integration/nstest"
)

func sysctlIn(t *testing.T, h *nstest.H, n ns.NetNS, key string) string {
	t.Helper()
	return strings.TrimSpace(h.Run(n, "cat", "/proc/sys/"+key))
}

// TestBridgeIPv6Sysctls: the IPv6 knobs the reference sets, where it sets them. A pod
// namespace with IPv6 disabled gets it enabled on lo and the pod interface when the
// pod gets an IPv6 address; the pod interface keeps its addresses across a link flap
// (keep_addr_on_down); the host veth and the bridge, even one podwire did not create,
// ignore router advertisements (accept_ra=0, CVE-2020-10749).
func TestBridgeIPv6Sysctls(t *testing.T) {
	h := nstest.New(t)
	br := h.Name("br")
	// A bridge someone else made, with the kernel's default accept_ra=1.
	h.Run(h.HostNS, "ip", "link", "add", br, "type", "bridge")
	if got := sysctlIn(t, h, h.HostNS, "net/ipv6/conf/"+br+"/accept_ra"); got != "1" {
		t.Fatalf("a new bridge has accept_ra=%s, want the kernel default 1", got)
	}
	list := bridgeConf(h, `"isGateway":true`, `[[{"subnet":"10.35.0.0/24"}],[{"subnet":"fd00:35::/64"}]]`)

	p := h.NewPod()
	h.Run(p, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1", "net.ipv6.conf.lo.disable_ipv6=1")
	rt := h.RT(p, "eth0")
	r, err := h.Add(list, rt)
	if err != nil {
		t.Fatalf("dual-stack ADD into a pod with IPv6 disabled: %v", err)
	}
	a6 := addrOf(t, r, true)
	for key, want := range map[string]string{
		"net/ipv6/conf/eth0/disable_ipv6":      "0",
		"net/ipv6/conf/lo/disable_ipv6":        "0",
		"net/ipv6/conf/eth0/keep_addr_on_down": "1",
	} {
		if got := sysctlIn(t, h, p, key); got != want {
			t.Errorf("pod %s = %s, want %s", key, got, want)
		}
	}
	h.Run(p, "ip", "link", "set", "eth0", "down")
	h.Run(p, "ip", "link", "set", "eth0", "up")
	// The veth's carrier comes back asynchronously (linkwatch, up to a second on a busy
	// machine), and until it does the kernel has no usable IPv6 source address on eth0:
	// wait for it before the ping below.
	waitCarrier(t, h, p, "eth0")
	if out := h.Run(p, "ip", "-6", "-o", "addr", "show", "dev", "eth0"); !strings.Contains(out, a6+"/64") {
		t.Errorf("eth0 lost %s across a link flap:\n%s", a6, out)
	}
	for _, dev := range []string{r.Interfaces[1].Name, br} {
		if got := sysctlIn(t, h, h.HostNS, "net/ipv6/conf/"+dev+"/accept_ra"); got != "0" {
			t.Errorf("%s accept_ra = %s, want 0", dev, got)
		}
	}
	h.MustPing(p, "fd00:35::1")
	if err := h.Check(list, rt); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	h.MustDel(list, rt)
}

// waitCarrier waits until dev in n is up with its carrier and no address of it is
// tentative.
func waitCarrier(t *testing.T, h *nstest.H, n ns.NetNS, dev string) {
	t.Helper()
	var out string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		link := h.Run(n, "ip", "-o", "link", "show", "dev", dev)
		out = link + h.Run(n, "ip", "-o", "addr", "show", "dev", dev, "tentative")
		if strings.Contains(link, "LOWER_UP") && !strings.Contains(out, "tentative") {
			return
		}
	}
	t.Fatalf("%s not up with its carrier after 10s:\n%s", dev, out)
}
