// SPDX-License-Identifier: Apache-2.0

package netfilter_test

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/nftables"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/netfilter"
	"github.com/podwire/podwire/pkg/netfilter/fake"
)

// What other programs do to the nat table, and names that must not break the rules
// they are written into (issue 14).

// flushBuiltins is a foreign `iptables -t nat -F` of the chains the layouts hang off.
const flushBuiltins = "*nat\n-F PREROUTING\n-F OUTPUT\n-F POSTROUTING\nCOMMIT\n"

const (
	entryPre  = "nat -A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT"
	entryOut  = "nat -A OUTPUT -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT"
	entryPost = `nat -A POSTROUTING -m comment --comment "CNI portfwd requiring masquerade" -j CNI-HOSTPORT-MASQ`
)

func TestHostPortsRepairFlushedEntryJumps(t *testing.T) {
	k := fake.New()
	b := netfilter.NewHostPortsOn(netfilter.KindIPTables, k, k)
	a, v4only := hpPlanA(), hpPlanB()
	dual := netfilter.HostPortPlan{Owner: Owner{Network: "podnet", ContainerID: "ghi", IfName: "eth0"}, SNAT: true, Mark: 0x2000,
		Ports: []netfilter.HostPort{
			{Proto: netfilter.TCP, HostPort: 7070, Pod: pfx("10.88.0.7/16"), ContainerPort: 70},
			{Proto: netfilter.TCP, HostPort: 7070, Pod: pfx("fd88::7/64"), ContainerPort: 70},
		}}
	if err := b.Apply(t.Context(), a); err != nil {
		t.Fatal(err)
	}
	restoreBoth(t, k, flushBuiltins)
	if err := b.Check(t.Context(), a); err == nil {
		t.Error("Check passed with PREROUTING, OUTPUT and POSTROUTING flushed")
	}
	// The next ADD of anyone puts the entry jumps back, once, in the families it
	// touches: ip6tables is not run for an IPv4-only pod.
	entries := func(fam string) (n []int) {
		for _, e := range []string{entryPre, entryOut, entryPost} {
			n = append(n, strings.Count(k.Dump(), fam+" "+e+"\n"))
		}
		return n
	}
	if err := b.Apply(t.Context(), v4only); err != nil {
		t.Fatal(err)
	}
	if got := entries("ipv4"); !slices.Equal(got, []int{1, 1, 1}) {
		t.Errorf("IPv4 entry jumps after an IPv4 ADD: %v times, want once each", got)
	}
	if err := b.Check(t.Context(), v4only); err != nil {
		t.Errorf("Check(%s) after the repairing Apply: %v", v4only.Owner, err)
	}
	if err := b.Check(t.Context(), a); err == nil {
		t.Errorf("Check(%s) passed with its IPv6 entry jumps missing", a.Owner)
	}
	if err := b.Apply(t.Context(), dual); err != nil {
		t.Fatal(err)
	}
	for _, fam := range []string{"ipv4", "ipv6"} {
		if got := entries(fam); !slices.Equal(got, []int{1, 1, 1}) {
			t.Errorf("%s entry jumps after a dual-stack ADD: %v times, want once each", fam, got)
		}
	}
	for _, p := range []netfilter.HostPortPlan{a, v4only, dual} {
		if err := b.Check(t.Context(), p); err != nil {
			t.Errorf("Check(%s) after the repairing Apply: %v", p.Owner, err)
		}
	}
	for _, p := range []netfilter.HostPortPlan{a, v4only, dual} {
		if err := b.Remove(t.Context(), p.Owner, p.Families()); err != nil {
			t.Fatal(err)
		}
	}
	requireEmpty(t, k, "removing every owner")
}

// firewalld's reload flushes every chain of the nat table: the next ADD puts back
// what everyone needs, and DEL still finds the emptied per-container chains.
func TestHostPortsRepairFlushedNATTable(t *testing.T) {
	k := fake.New()
	b := netfilter.NewHostPortsOn(netfilter.KindIPTables, k, k)
	a, bb := hpPlanA(), hpPlanB()
	if err := b.Apply(t.Context(), a); err != nil {
		t.Fatal(err)
	}
	chainA := netfilter.HostPortChain(a.Owner.Network, a.Owner.ContainerID)
	restoreBoth(t, k, "*nat\n-F PREROUTING\n-F OUTPUT\n-F POSTROUTING\n-F CNI-HOSTPORT-DNAT\n-F CNI-HOSTPORT-MASQ\n-F "+chainA+"\nCOMMIT\n")
	if err := b.Check(t.Context(), a); !netfilter.IsNotFound(err) {
		t.Errorf("Check of a flushed pod = %v, want IsNotFound", err)
	}
	if err := b.Apply(t.Context(), bb); err != nil {
		t.Fatal(err)
	}
	if err := b.Check(t.Context(), bb); err != nil {
		t.Errorf("Check(%s) after the repairing Apply: %v", bb.Owner, err)
	}
	if n := len(dumpLines(k.Dump(), "ipv4 nat -A CNI-HOSTPORT-MASQ ")); n != 1 {
		t.Errorf("%d masquerade rules in CNI-HOSTPORT-MASQ, want 1", n)
	}
	for _, p := range []netfilter.HostPortPlan{a, bb} {
		if err := b.Remove(t.Context(), p.Owner, p.Families()); err != nil {
			t.Fatal(err)
		}
	}
	requireEmpty(t, k, "removing both owners")
}

func TestMasqRepairFlushedPostrouting(t *testing.T) {
	for _, readd := range []bool{true, false} {
		t.Run(fmt.Sprintf("re-ADD %v", readd), func(t *testing.T) {
			k := fake.New()
			b := netfilter.NewMasqOn(netfilter.KindIPTables, k, k)
			p := masqPlan1()
			if err := b.Apply(t.Context(), p); err != nil {
				t.Fatal(err)
			}
			restoreBoth(t, k, flushBuiltins)
			if err := b.Check(t.Context(), p); err == nil {
				t.Error("Check passed without the POSTROUTING jumps")
			}
			if readd {
				if err := b.Apply(t.Context(), p); err != nil {
					t.Fatal(err)
				}
				if err := b.Check(t.Context(), p); err != nil {
					t.Errorf("Check after the repairing Apply: %v", err)
				}
			}
			// The chain goes although no jump leads to it any more.
			if err := b.Remove(t.Context(), p.Owner, nil); err != nil {
				t.Fatal(err)
			}
			requireEmpty(t, k, "Remove")
		})
	}
}

// The reference's masquerade table with its postrouting chain flushed (by nft or a
// reference ADD that failed half way): CHECK says so, the next ADD refills it.
func TestMasqNFTRepairFlushedPostrouting(t *testing.T) {
	k := fake.New()
	b := netfilter.NewMasqOn(netfilter.KindNFTables, k, k)
	p1, p2 := masqPlan1(), masqPlan2()
	if err := b.Apply(t.Context(), p1); err != nil {
		t.Fatal(err)
	}
	tab := &nftables.Table{Name: "cni_plugins_masquerade", Family: nftables.TableFamilyINet}
	k.FlushChain(&nftables.Chain{Name: "postrouting", Table: tab})
	if err := k.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := b.Check(t.Context(), p1); err == nil {
		t.Error("Check passed with postrouting flushed")
	}
	if err := b.Apply(t.Context(), p2); err != nil {
		t.Fatal(err)
	}
	for _, p := range []netfilter.MasqPlan{p1, p2} {
		if err := b.Check(t.Context(), p); err != nil {
			t.Errorf("Check(%s) after the repairing Apply: %v", p.Owner, err)
		}
	}
	if d := cmp.Diff(sortedLines(masqNFTablesGolden), sortedLines(k.Dump())); d != "" {
		t.Errorf("repaired table (-want +got):\n%s", d)
	}
	for _, p := range []netfilter.MasqPlan{p1, p2} {
		if err := b.Remove(t.Context(), p.Owner, nil); err != nil {
			t.Fatal(err)
		}
	}
	requireEmpty(t, k, "removing both owners")
}

func TestHostPortsRemoveAfterFlushedDNATChain(t *testing.T) {
	for _, last := range []bool{true, false} {
		t.Run(fmt.Sprintf("last %v", last), func(t *testing.T) {
			k := fake.New()
			b := netfilter.NewHostPortsOn(netfilter.KindIPTables, k, k)
			a, other := hpPlanA(), hpPlanB()
			plans := []netfilter.HostPortPlan{a}
			if !last {
				plans = append(plans, other)
			}
			for _, p := range plans {
				if err := b.Apply(t.Context(), p); err != nil {
					t.Fatal(err)
				}
			}
			restoreBoth(t, k, "*nat\n-F CNI-HOSTPORT-DNAT\nCOMMIT\n")
			if err := b.Remove(t.Context(), a.Owner, a.Families()); err != nil {
				t.Fatal(err)
			}
			chainA := netfilter.HostPortChain(a.Owner.Network, a.Owner.ContainerID)
			if d := k.Dump(); strings.Contains(d, chainA) {
				t.Errorf("%s is left after Remove:\n%s", chainA, d)
			}
			if last {
				requireEmpty(t, k, "removing the last owner")
				return
			}
			// The other pod lost its jump to the flush: CHECK says so, ADD repairs it.
			if err := b.Check(t.Context(), other); err == nil {
				t.Error("Check passed for a pod whose jump was flushed")
			}
			if err := b.Apply(t.Context(), other); err != nil {
				t.Fatal(err)
			}
			if err := b.Check(t.Context(), other); err != nil {
				t.Errorf("Check after the repairing Apply: %v", err)
			}
			if err := b.Remove(t.Context(), other.Owner, other.Families()); err != nil {
				t.Fatal(err)
			}
			requireEmpty(t, k, "removing the last owner")
		})
	}
}

// longID is a container ID of n characters of those CNI allows.
func longID(n int) string {
	const chars = "abcdefghijklmnopqrstuvwxyz0123456789._-"
	b := make([]byte, n)
	for i := range b {
		b[i] = chars[i%len(chars)]
	}
	return string(b)
}

// hostileOwners are attachments whose names end up in comments: an interface name
// with a quote, one ending in a backslash, one of 15 bytes with both, and a
// container ID far beyond every comment limit.
var hostileOwners = []Owner{
	{Network: "podnet", ContainerID: "c1", IfName: `e"th0`},
	{Network: "podnet", ContainerID: "c2", IfName: `eth0\`},
	{Network: "podnet", ContainerID: "c3", IfName: `ab"cd\efghijklm`},
	{Network: "podnet", ContainerID: longID(1000), IfName: "eth0"},
}

// attached is one applied attachment of a test: its CHECK and its DEL.
type attached struct{ check, remove func() error }

// attachFunc applies the i-th attachment, owned by o, on k.
type attachFunc func(k *fake.Kernel, i int, o Owner) (attached, error)

func TestHostileNames(t *testing.T) {
	hostPorts := func(kind netfilter.Kind) attachFunc {
		return func(k *fake.Kernel, i int, o Owner) (attached, error) {
			b := netfilter.NewHostPortsOn(kind, k, k)
			p := netfilter.HostPortPlan{Owner: o, SNAT: true, Mark: 0x2000, Ports: []netfilter.HostPort{
				{Proto: netfilter.TCP, HostPort: uint16(8000 + i), Pod: pfx(fmt.Sprintf("10.88.0.%d/16", 10+i)), ContainerPort: 80},
				{Proto: netfilter.TCP, HostPort: uint16(8000 + i), Pod: pfx(fmt.Sprintf("fd88::%d/64", 10+i)), ContainerPort: 80},
			}}
			return attached{func() error { return b.Check(t.Context(), p) },
				func() error { return b.Remove(t.Context(), o, netfilter.All) }}, b.Apply(t.Context(), p)
		}
	}
	masq := func(kind netfilter.Kind) attachFunc {
		return func(k *fake.Kernel, i int, o Owner) (attached, error) {
			b := netfilter.NewMasqOn(kind, k, k)
			p := netfilter.MasqPlan{Owner: o, Addrs: []netip.Prefix{pfx(fmt.Sprintf("10.88.0.%d/16", 10+i)), pfx(fmt.Sprintf("fd88::%d/64", 10+i))}}
			return attached{func() error { return b.Check(t.Context(), p) },
				func() error { return b.Remove(t.Context(), o, p.Addrs) }}, b.Apply(t.Context(), p)
		}
	}
	isTag := func(c string) bool {
		if c == "CNI portfwd requiring masquerade" {
			return true // the reference's entry jump into CNI-HOSTPORT-MASQ
		}
		tag, ok := netfilter.ParseTag(c)
		for _, o := range hostileOwners {
			if ok && tag.ID == netfilter.IDOf(o) && (tag.Owner == Owner{} || strings.HasSuffix(c, " "+o.Key())) {
				return true
			}
		}
		return false
	}
	masqXTComments := map[string]bool{}
	for _, o := range hostileOwners {
		id := o.ContainerID[:min(len(o.ContainerID), 255-len(`name: "podnet" id: ""`))]
		masqXTComments["name: "+strconv.Quote(o.Network)+" id: "+strconv.Quote(id)] = true
	}
	for _, lay := range []struct {
		name   string
		attach attachFunc
		isOurs func(comment string) bool
	}{
		{"hostport/iptables", hostPorts(netfilter.KindIPTables), isTag},
		{"hostport/nftables", hostPorts(netfilter.KindNFTables), isTag},
		{"masq/iptables", masq(netfilter.KindIPTables), func(c string) bool { return masqXTComments[c] }},
		{"masq/nftables", masq(netfilter.KindNFTables), func(c string) bool {
			return len(c) <= 128 && !strings.Contains(c, `"`) && strings.Contains(c, ", net: podnet, if: ")
		}},
		{"macspoof/nftables", func(k *fake.Kernel, i int, o Owner) (attached, error) {
			b := netfilter.NewMacSpoofOn(k)
			p := netfilter.MacSpoofPlan{Owner: o, HostIf: fmt.Sprintf("veth%011d", i), MAC: mac(byte(i + 1))}
			// The reference's comment "macspoofchk-<cid>-<ifname>" holds at most 128
			// bytes: a longer container ID is refused before anything changes.
			if max := 128 - len("macspoofchk--"+o.IfName); len(o.ContainerID) > max {
				if err := b.Apply(t.Context(), p); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("at most %d bytes, not %d", max, len(o.ContainerID))) {
					return attached{}, fmt.Errorf("Apply of a %d-byte container ID = %v, want refused", len(o.ContainerID), err)
				}
				return attached{func() error { return nil }, func() error { return b.Remove(t.Context(), o) }}, nil
			}
			return attached{func() error { return b.Check(t.Context(), p) },
				func() error { return b.Remove(t.Context(), o) }}, b.Apply(t.Context(), p)
		}, func(c string) bool { return strings.HasPrefix(c, "macspoofchk-") }},
	} {
		t.Run(lay.name, func(t *testing.T) {
			k := fake.New()
			var all []attached
			for i, o := range hostileOwners {
				a, err := lay.attach(k, i, o)
				if err != nil {
					t.Fatalf("Apply(%.40s): %v", o, err)
				}
				all = append(all, a)
			}
			d := k.Dump()
			n := 0
			for _, line := range strings.Split(strings.TrimSpace(d), "\n") {
				if c, ok := ruleComment(t, line); ok {
					n++
					if !lay.isOurs(c) {
						t.Errorf("comment %q is none the layout writes for its owners, in\n%s", c, line)
					}
				}
			}
			if n == 0 {
				t.Fatalf("no commented rule in\n%s", d)
			}
			for i, a := range all {
				if err := a.check(); err != nil {
					t.Errorf("Check(%.40s): %v", hostileOwners[i], err)
				}
			}
			for _, a := range all {
				if err := a.remove(); err != nil {
					t.Fatal(err)
				}
			}
			requireEmpty(t, k, "removing every owner")
		})
	}
}

// ruleComment returns the comment of a rule line of a Dump. An iptables rule must
// hold exactly one comment, as one argument, and end in its target: "-j" once, after
// the comment, followed by the target and at most one option with its value.
func ruleComment(t *testing.T, line string) (string, bool) {
	t.Helper()
	if c, ok := strings.CutPrefix(line, "nft     "); ok {
		_, comment, found := strings.Cut(c, " # ")
		return comment, found
	}
	_, rule, _ := strings.Cut(line, " nat ")
	a := netfilter.SplitRuleArgs(rule)
	if len(a) < 2 || a[0] != "-A" {
		return "", false
	}
	ci, ji := -1, -1
	for i, s := range a {
		switch s {
		case "--comment":
			if ci >= 0 {
				t.Errorf("two comments in %s", line)
			}
			ci = i + 1
		case "-j":
			if ji >= 0 {
				t.Errorf("two targets in %s", line)
			}
			ji = i
		}
	}
	if ji < 0 || ci >= ji || (len(a)-ji != 2 && len(a)-ji != 4) {
		t.Errorf("rule does not end in its target: %q", a)
	}
	if ci < 0 {
		return "", false
	}
	return a[ci], true
}

func TestLongContainerIDMasq(t *testing.T) {
	o := Owner{Network: "expnet", ContainerID: longID(1000), IfName: "eth0"}
	p := netfilter.MasqPlan{Owner: o, Addrs: []netip.Prefix{pfx("10.77.0.9/24"), pfx("fd77::9/64")}}
	for _, kind := range []netfilter.Kind{netfilter.KindIPTables, netfilter.KindNFTables} {
		t.Run(string(kind), func(t *testing.T) {
			k := fake.New()
			b := netfilter.NewMasqOn(kind, k, k)
			for _, del := range []struct {
				name string
				fn   func() error
			}{
				{"Remove with addresses", func() error { return b.Remove(t.Context(), o, p.Addrs) }},
				{"Remove without addresses", func() error { return b.Remove(t.Context(), o, nil) }},
				{"GC", func() error {
					// Keeping it keeps it; another network's GC leaves it alone.
					if err := b.GC(t.Context(), "expnet", cniplumb.Owners{o: true}); err != nil {
						return err
					}
					if err := b.GC(t.Context(), "other", nil); err != nil {
						return err
					}
					if err := b.Check(t.Context(), p); err != nil {
						return fmt.Errorf("after GCs that keep it: %w", err)
					}
					return b.GC(t.Context(), "expnet", cniplumb.Owners{masqOwner1: true})
				}},
			} {
				if err := b.Apply(t.Context(), p); err != nil {
					t.Fatalf("Apply: %v", err)
				}
				for _, line := range strings.Split(strings.TrimSpace(k.Dump()), "\n") {
					if c, ok := ruleComment(t, line); ok && len(c) > 255 {
						t.Errorf("comment of %d bytes: %s", len(c), line)
					}
				}
				if err := b.Check(t.Context(), p); err != nil {
					t.Errorf("Check: %v", err)
				}
				if err := del.fn(); err != nil {
					t.Fatalf("%s: %v", del.name, err)
				}
				requireEmpty(t, k, del.name)
			}
		})
	}
}

// The iptables comment of a very long container ID is cut, so GC cannot compare the
// network it names with its own in full. That must not let the GC of a network whose
// name merely starts with another network's name collect that network's pods.
func TestMasqGCOfAnotherNetworkSparesLongIDs(t *testing.T) {
	o := Owner{Network: "expnet", ContainerID: longID(1000), IfName: "eth0"}
	p := netfilter.MasqPlan{Owner: o, Addrs: []netip.Prefix{pfx("10.77.0.9/24")}}
	for _, kind := range []netfilter.Kind{netfilter.KindIPTables, netfilter.KindNFTables} {
		t.Run(string(kind), func(t *testing.T) {
			k := fake.New()
			b := netfilter.NewMasqOn(kind, k, k)
			for _, other := range []string{"expnet2", "expnet-v6", "exp", "other"} {
				if err := b.Apply(t.Context(), p); err != nil {
					t.Fatal(err)
				}
				if err := b.GC(t.Context(), other, nil); err != nil {
					t.Fatal(err)
				}
				if err := b.Check(t.Context(), p); err != nil {
					t.Errorf("GC of network %q removed a pod of network %q: %v", other, o.Network, err)
				}
			}
		})
	}
}

func TestThousandHostPorts(t *testing.T) {
	p := netfilter.HostPortPlan{Owner: hpOwnerA, SNAT: true, Mark: 0x2000}
	for i := range 1000 {
		proto, pod := netfilter.TCP, pfx("10.88.0.5/16")
		if i%2 == 1 {
			proto = netfilter.UDP
		}
		if i%4 >= 2 {
			pod = pfx("fd88::5/64")
		}
		p.Ports = append(p.Ports, netfilter.HostPort{Proto: proto, HostPort: uint16(20000 + i), Pod: pod, ContainerPort: uint16(1 + i)})
	}
	for _, kind := range []netfilter.Kind{netfilter.KindIPTables, netfilter.KindNFTables} {
		t.Run(string(kind), func(t *testing.T) {
			k := fake.New()
			b := netfilter.NewHostPortsOn(kind, k, k)
			if err := b.Apply(t.Context(), p); err != nil {
				t.Fatal(err)
			}
			if err := b.Check(t.Context(), p); err != nil {
				t.Error(err)
			}
			if kind == netfilter.KindIPTables {
				// 250 ports per protocol and family: 17 multiport jumps of at most 15.
				if n := len(dumpLines(k.Dump(), "ipv4 nat -A CNI-HOSTPORT-DNAT -p tcp -m multiport")); n != 17 {
					t.Errorf("%d IPv4 TCP multiport jumps, want 17", n)
				}
			}
			if err := b.Remove(t.Context(), p.Owner, p.Families()); err != nil {
				t.Fatal(err)
			}
			requireEmpty(t, k, "Remove")
		})
	}
}
