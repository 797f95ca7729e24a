// SPDX-License-Identifier: Apache-2.0

package netfilter_test

import (
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/podwire/podwire/pkg/netfilter"
	"github.com/podwire/podwire/pkg/netfilter/fake"
)

// The fixtures of the tests that run the backends on fake.Kernel. Network and
// container names are those whose kernel names the reference plugins were seen to
// write (see names_test.go), so the goldens show literal reference chain names.

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func addr(s string) netip.Addr  { return netip.MustParseAddr(s) }

type Owner = netfilter.Owner

// hostport owners: podnet/abc is CNI-DN-0830037e596fec4874866, podnet/def
// CNI-DN-98c6379f8ca6ff2d2cb98 (sha512 of network+containerID, as the reference).
var (
	hpOwnerA = Owner{Network: "podnet", ContainerID: "abc", IfName: "eth0"}
	hpOwnerB = Owner{Network: "podnet", ContainerID: "def", IfName: "eth0"}
)

// hpPlanA is a dual-stack pod with two TCP ports, one UDP port bound to a host
// address (IPv4 only), snat on and portmap's default mark bit 13.
func hpPlanA() netfilter.HostPortPlan {
	return netfilter.HostPortPlan{Owner: hpOwnerA, SNAT: true, Mark: 0x2000, Ports: []netfilter.HostPort{
		{Proto: netfilter.TCP, HostPort: 8080, Pod: pfx("10.88.0.5/16"), ContainerPort: 80},
		{Proto: netfilter.TCP, HostPort: 8443, Pod: pfx("10.88.0.5/16"), ContainerPort: 443},
		{Proto: netfilter.UDP, HostPort: 5353, HostIP: addr("192.0.2.1"), Pod: pfx("10.88.0.5/16"), ContainerPort: 53},
		{Proto: netfilter.TCP, HostPort: 8080, Pod: pfx("fd88::5/64"), ContainerPort: 80},
	}}
}

// hpPlanB is an IPv4-only pod of the same network with one port.
func hpPlanB() netfilter.HostPortPlan {
	return netfilter.HostPortPlan{Owner: hpOwnerB, SNAT: true, Mark: 0x2000, Ports: []netfilter.HostPort{
		{Proto: netfilter.TCP, HostPort: 9090, Pod: pfx("10.88.0.6/16"), ContainerPort: 8080},
	}}
}

// masq owners: expnet/ctr1 is CNI-cc94bae7a43faa95404efc2e, expnet/ctr2
// CNI-a0ec8203b259decb5a4b55ee.
var (
	masqOwner1 = Owner{Network: "expnet", ContainerID: "ctr1", IfName: "eth0"}
	masqOwner2 = Owner{Network: "expnet", ContainerID: "ctr2", IfName: "eth0"}
)

func masqPlan1() netfilter.MasqPlan {
	return netfilter.MasqPlan{Owner: masqOwner1, Addrs: []netip.Prefix{pfx("10.77.0.2/24"), pfx("fd77::2/64")}}
}

func masqPlan2() netfilter.MasqPlan {
	return netfilter.MasqPlan{Owner: masqOwner2, Addrs: []netip.Prefix{pfx("10.77.0.3/24")}}
}

func mac(last byte) net.HardwareAddr { return net.HardwareAddr{0x02, 0, 0, 0, 0, last} }

// foreignNAT is what kube-proxy keeps in the nat table of both families: the layouts
// must append after it, insert before it (CNI-HOSTPORT-MASQ) and leave it alone.
const foreignNAT = `*nat
:KUBE-SERVICES - [0:0]
:KUBE-POSTROUTING - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
COMMIT
`

// restoreBoth applies an iptables-restore script to both families of k.
func restoreBoth(t *testing.T, k *fake.Kernel, script string) {
	t.Helper()
	for _, fam := range []netfilter.Family{netfilter.IPv4, netfilter.IPv6} {
		if err := k.Restore(t.Context(), fam, script); err != nil {
			t.Fatalf("%s: %v", fam, err)
		}
	}
}

var tagRE = regexp.MustCompile(`pw:[0-9a-f]{8}:[0-9a-f]{16}:[0-9a-f]{8}`)

// readable replaces the hashes of podwire's tags (network, owner, rule fingerprint)
// by "pw:<tag>", keeping the owner key after them. Which owner a tag names is tested
// by requireTags; the exact text of one tag by TestTagText.
func readable(dump string) string { return tagRE.ReplaceAllString(dump, "pw:<tag>") }

// requireTags fails unless every podwire tag in dump parses and names one of owners.
func requireTags(t *testing.T, dump string, owners ...Owner) {
	t.Helper()
	for _, s := range tagRE.FindAllString(dump, -1) {
		tag, ok := netfilter.ParseTag(s)
		if !ok {
			t.Errorf("tag %q does not parse", s)
			continue
		}
		if !slices.ContainsFunc(owners, func(o netfilter.Owner) bool { return tag.ID == netfilter.IDOf(o) }) {
			t.Errorf("tag %q names none of %v", s, owners)
		}
	}
}

// requireEmpty fails when k holds anything.
func requireEmpty(t *testing.T, k *fake.Kernel, after string) {
	t.Helper()
	if d := k.Dump(); d != "" {
		t.Fatalf("after %s the kernel still holds:\n%s", after, d)
	}
}

// dumpLines returns the lines of dump that start with prefix.
func dumpLines(dump, prefix string) []string {
	var out []string
	for _, l := range strings.Split(dump, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return out
}

// sortedLines is dump's lines in sorted order: the state without the order of rules
// within a chain, for comparisons where only that may change.
func sortedLines(dump string) []string {
	l := strings.Split(dump, "\n")
	slices.Sort(l)
	return l
}
