// SPDX-License-Identifier: Apache-2.0

package netfilter_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/netfilter"
	"github.com/podwire/podwire/pkg/netfilter/fake"
)

// The state walk (in the spirit of tailscale's TestRouterStates): every layout runs a
// few hundred random ADD, repeated ADD, CHECK, DEL, repeated DEL and GC calls, some of
// them with an injected kernel failure, against a model of which attachments are
// installed. After every step CHECK must pass for exactly the installed ones; at the
// end, DEL of everyone must leave the kernel empty.

var walkSeed = flag.Uint64("walk.seed", 0, "seed of TestStateWalk (0: from the clock)")

// walker is one layout's backend with the plans of the walk's owners.
type walker struct {
	owners       []Owner
	apply, check func(ctx context.Context, i int) error
	// remove is DEL; known says whether DEL knows the attachment's addresses
	// (prevResult), which only the iptables layouts use.
	remove func(ctx context.Context, i int, known bool) error
	gc     func(ctx context.Context, network string, keep cniplumb.Owners) error
}

func hostPortWalker(b netfilter.HostPortBackend, plans []netfilter.HostPortPlan) walker {
	w := walker{
		apply: func(ctx context.Context, i int) error { return b.Apply(ctx, plans[i]) },
		check: func(ctx context.Context, i int) error { return b.Check(ctx, plans[i]) },
		remove: func(ctx context.Context, i int, known bool) error {
			fams := netfilter.All
			if known {
				fams = plans[i].Families()
			}
			return b.Remove(ctx, plans[i].Owner, fams)
		},
		gc: b.GC,
	}
	for _, p := range plans {
		w.owners = append(w.owners, p.Owner)
	}
	return w
}

func masqWalker(b netfilter.MasqBackend, plans []netfilter.MasqPlan) walker {
	w := walker{
		apply: func(ctx context.Context, i int) error { return b.Apply(ctx, plans[i]) },
		check: func(ctx context.Context, i int) error { return b.Check(ctx, plans[i]) },
		remove: func(ctx context.Context, i int, known bool) error {
			var addrs []netip.Prefix
			if known {
				addrs = plans[i].Addrs
			}
			return b.Remove(ctx, plans[i].Owner, addrs)
		},
		gc: b.GC,
	}
	for _, p := range plans {
		w.owners = append(w.owners, p.Owner)
	}
	return w
}

func featureWalker(b *netfilter.NFTables, plans []netfilter.Plan) walker {
	f := plans[0].Feature
	w := walker{
		apply:  func(ctx context.Context, i int) error { return b.Apply(ctx, plans[i]) },
		check:  func(ctx context.Context, i int) error { return b.Check(ctx, plans[i]) },
		remove: func(ctx context.Context, i int, _ bool) error { return b.Remove(ctx, f, plans[i].Owner) },
		gc: func(ctx context.Context, n string, keep cniplumb.Owners) error {
			return b.GC(ctx, f, n, keep)
		},
	}
	for _, p := range plans {
		w.owners = append(w.owners, p.Owner)
	}
	return w
}

// The walk's attachments: two interfaces of one container in one network, the same
// container in a second network, IPv4-only, IPv6-only and dual-stack pods.
var (
	walkA0 = Owner{Network: "podnet", ContainerID: "ctr-a", IfName: "eth0"}
	walkA1 = Owner{Network: "podnet", ContainerID: "ctr-a", IfName: "net1"}
	walkB0 = Owner{Network: "podnet", ContainerID: "ctr-b", IfName: "eth0"}
	walkA2 = Owner{Network: "othernet", ContainerID: "ctr-a", IfName: "eth0"}
	walkC0 = Owner{Network: "othernet", ContainerID: "ctr-c", IfName: "eth0"}
)

func walkHostPorts() []netfilter.HostPortPlan {
	tcp, udp := netfilter.TCP, netfilter.UDP
	return []netfilter.HostPortPlan{
		{Owner: walkA0, SNAT: true, Mark: 0x2000, Ports: []netfilter.HostPort{
			{Proto: tcp, HostPort: 8080, Pod: pfx("10.88.0.5/16"), ContainerPort: 80},
			{Proto: udp, HostPort: 5353, HostIP: addr("192.0.2.1"), Pod: pfx("10.88.0.5/16"), ContainerPort: 53},
			{Proto: tcp, HostPort: 8080, Pod: pfx("fd88::5/64"), ContainerPort: 80},
		}},
		{Owner: walkA1, SNAT: true, Mark: 0x2000, Ports: []netfilter.HostPort{
			{Proto: tcp, HostPort: 7070, Pod: pfx("10.89.0.5/16"), ContainerPort: 70},
		}},
		{Owner: walkB0, SNAT: false, Ports: []netfilter.HostPort{
			{Proto: tcp, HostPort: 9090, Pod: pfx("10.88.0.6/16"), ContainerPort: 8080},
		}},
		{Owner: walkA2, SNAT: true, Mark: 0x4000, Ports: []netfilter.HostPort{
			{Proto: tcp, HostPort: 6060, Pod: pfx("10.99.0.5/16"), ContainerPort: 60},
			{Proto: udp, HostPort: 6060, Pod: pfx("fd99::5/64"), ContainerPort: 60},
		}},
		{Owner: walkC0, SNAT: true, MasqAll: true, Mark: 0x2000, Ports: []netfilter.HostPort{
			{Proto: tcp, HostPort: 5050, Pod: pfx("fd99::7/64"), ContainerPort: 50},
		}},
	}
}

func walkMasqs() []netfilter.MasqPlan {
	return []netfilter.MasqPlan{
		{Owner: walkA0, Addrs: []netip.Prefix{pfx("10.88.0.5/16"), pfx("fd88::5/64")}},
		{Owner: walkA1, Addrs: []netip.Prefix{pfx("10.89.0.5/16")}},
		{Owner: walkB0, Addrs: []netip.Prefix{pfx("10.88.0.6/16")}},
		{Owner: walkA2, Addrs: []netip.Prefix{pfx("10.99.0.5/16"), pfx("fd99::5/64")}},
		{Owner: walkC0, Addrs: []netip.Prefix{pfx("fd99::7/64")}},
	}
}

// walkFeature is a table of podwire's own (the agent's kind): masquerade from each
// owner's address, without the pod subnet.
var walkFeature = netfilter.Feature{Name: "walk", Hooks: []netfilter.Hook{netfilter.NATPostrouting}}

func walkFeaturePlans() []netfilter.Plan {
	var out []netfilter.Plan
	for i, o := range []Owner{walkA0, walkA1, walkB0, walkA2, walkC0} {
		src := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 66, 0, byte(i + 2)}), 32)
		out = append(out, netfilter.Plan{Feature: walkFeature, Owner: o, Rules: []netfilter.Rule{
			{Hook: netfilter.NATPostrouting, Family: netfilter.IPv4, Match: netfilter.Match{Src: src, Dst: pfx("10.66.0.0/16")}, Action: netfilter.Action{Kind: netfilter.Return}},
			{Hook: netfilter.NATPostrouting, Family: netfilter.IPv4, Match: netfilter.Match{Src: src}, Action: netfilter.Action{Kind: netfilter.Masquerade}},
		}})
	}
	return out
}

// walkMacSpoofs leaves out walkA2: the reference's macspoofchk layout names an
// attachment by container and interface only, and one container (one netns) cannot
// have two interfaces of one name.
func walkMacSpoofs() []netfilter.MacSpoofPlan {
	var out []netfilter.MacSpoofPlan
	for i, o := range []Owner{walkA0, walkA1, walkB0, walkC0} {
		out = append(out, netfilter.MacSpoofPlan{Owner: o, HostIf: fmt.Sprintf("veth%08x", i), MAC: mac(byte(i + 1))})
	}
	return out
}

// spoofWalker runs macspoofchk's backend, whose layout names no network: GC's ours
// claims the host veths of the network's owners, as bridge's does through its bridge.
func spoofWalker(b *netfilter.MacSpoof, plans []netfilter.MacSpoofPlan) walker {
	w := walker{
		apply:  func(ctx context.Context, i int) error { return b.Apply(ctx, plans[i]) },
		check:  func(ctx context.Context, i int) error { return b.Check(ctx, plans[i]) },
		remove: func(ctx context.Context, i int, _ bool) error { return b.Remove(ctx, plans[i].Owner) },
		gc: func(ctx context.Context, n string, keep cniplumb.Owners) error {
			return b.GC(ctx, keep, func(hostIf string) bool {
				return slices.ContainsFunc(plans, func(p netfilter.MacSpoofPlan) bool { return p.HostIf == hostIf && p.Owner.Network == n })
			})
		},
	}
	for _, p := range plans {
		w.owners = append(w.owners, p.Owner)
	}
	return w
}

type walkLayout struct {
	name string
	open func(k *fake.Kernel) walker
	// byContainer is the reference iptables masquerade's identity: network and
	// container, not the interface. Two interfaces of one container share a chain,
	// DEL without addresses removes both, GC keeps both while keep names either, and
	// CHECK of one that was removed while the other stays fails without IsNotFound
	// (the shared chain is there).
	byContainer bool
}

var walkLayouts = []walkLayout{
	{name: "hostport/iptables", open: func(k *fake.Kernel) walker {
		return hostPortWalker(netfilter.NewHostPortsOn(netfilter.KindIPTables, k, k), walkHostPorts())
	}},
	{name: "hostport/nftables", open: func(k *fake.Kernel) walker {
		return hostPortWalker(netfilter.NewHostPortsOn(netfilter.KindNFTables, k, k), walkHostPorts())
	}},
	{name: "masq/iptables", byContainer: true, open: func(k *fake.Kernel) walker {
		return masqWalker(netfilter.NewMasqOn(netfilter.KindIPTables, k, k), walkMasqs())
	}},
	{name: "masq/nftables", open: func(k *fake.Kernel) walker {
		return masqWalker(netfilter.NewMasqOn(netfilter.KindNFTables, k, k), walkMasqs())
	}},
	{name: "feature/nftables", open: func(k *fake.Kernel) walker {
		return featureWalker(netfilter.NewNFTablesOn(k), walkFeaturePlans())
	}},
	{name: "macspoof/nftables", open: func(k *fake.Kernel) walker {
		return spoofWalker(netfilter.NewMacSpoofOn(k), walkMacSpoofs())
	}},
}

// walkModel is which owners are installed, by the layout's rules of identity.
type walkModel struct {
	owners      []Owner
	byContainer bool
	installed   []bool
}

func sameContainer(a, b Owner) bool { return a.Network == b.Network && a.ContainerID == b.ContainerID }

func (m *walkModel) remove(i int, known bool) {
	for j, o := range m.owners {
		if j == i || (m.byContainer && !known && sameContainer(o, m.owners[i])) {
			m.installed[j] = false
		}
	}
}

func (m *walkModel) gc(network string, keep cniplumb.Owners) {
	for j, o := range m.owners {
		if o.Network != network {
			continue
		}
		kept := keep[o]
		for k := range keep {
			kept = kept || (m.byContainer && sameContainer(k, o))
		}
		if !kept {
			m.installed[j] = false
		}
	}
}

// siblingInstalled reports whether, in a layout by container, another interface of
// owner i's container is installed.
func (m *walkModel) siblingInstalled(i int) bool {
	for j, o := range m.owners {
		if m.byContainer && j != i && m.installed[j] && sameContainer(o, m.owners[i]) {
			return true
		}
	}
	return false
}

// verify checks every owner against the model.
func (m *walkModel) verify(ctx context.Context, w walker) error {
	for i, o := range m.owners {
		err := w.check(ctx, i)
		switch {
		case m.installed[i]:
			if err != nil {
				return fmt.Errorf("Check(%s) of an installed owner: %w", o, err)
			}
		case m.siblingInstalled(i):
			if err == nil {
				return fmt.Errorf("Check(%s) passed, but only another interface of its container is installed", o)
			}
		case !netfilter.IsNotFound(err):
			return fmt.Errorf("Check(%s) of a removed owner = %v, want IsNotFound", o, err)
		}
	}
	return nil
}

var errInjected = errors.New("injected failure")

// consumeFailure disarms a FailNext the last call did not reach.
func consumeFailure(ctx context.Context, k *fake.Kernel) {
	_, _, _ = k.List(ctx, netfilter.IPv4, "nat", "PREROUTING")
	_ = k.Restore(ctx, netfilter.IPv4, "*nat\nCOMMIT\n")
	_ = k.Flush()
}

// familySections splits a dump into its ipv4, ipv6 and nft parts.
func familySections(dump string) map[string]string {
	out := map[string]string{}
	for _, l := range strings.SplitAfter(dump, "\n") {
		if f, _, ok := strings.Cut(l, " "); ok {
			out[f] += l
		}
	}
	return out
}

func TestStateWalk(t *testing.T) {
	seed := *walkSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -walk.seed=%d)", seed, seed)
	for li, lay := range walkLayouts {
		t.Run(lay.name, func(t *testing.T) {
			for round := range 3 {
				rng := rand.New(rand.NewPCG(seed, uint64(li*16+round)))
				walk(t, lay, rng, 300)
			}
		})
	}
}

func walk(t *testing.T, lay walkLayout, rng *rand.Rand, steps int) {
	ctx := t.Context()
	k := fake.New()
	w := lay.open(k)
	m := &walkModel{owners: w.owners, byContainer: lay.byContainer, installed: make([]bool, len(w.owners))}
	networks := []string{"podnet", "othernet"}
	var log []string
	fail := func(format string, a ...any) {
		t.Helper()
		t.Fatalf("after steps\n  %s\n%s\nkernel:\n%s", strings.Join(log, "\n  "), fmt.Sprintf(format, a...), k.Dump())
	}
	for range steps {
		i := rng.IntN(len(m.owners))
		o := m.owners[i]
		known := rng.IntN(2) == 0
		network := networks[rng.IntN(len(networks))]
		keep := cniplumb.Owners{}
		for _, ko := range m.owners {
			if rng.IntN(2) == 0 {
				keep[ko] = true
			}
		}
		// call and effect are one step: the backend call and what it does to the model.
		var call func() error
		var effect func()
		var what string
		switch op := rng.IntN(10); {
		case op < 4:
			what = "Apply " + o.String()
			call, effect = func() error { return w.apply(ctx, i) }, func() { m.installed[i] = true }
		case op < 7:
			what = fmt.Sprintf("Remove %s (addresses known: %v)", o, known)
			call, effect = func() error { return w.remove(ctx, i, known) }, func() { m.remove(i, known) }
		case op < 9:
			what = fmt.Sprintf("GC %s keeping %v", network, keepList(keep))
			call, effect = func() error { return w.gc(ctx, network, keep) }, func() { m.gc(network, keep) }
		default:
			what = "Check only"
			call, effect = func() error { return nil }, func() {}
		}
		if rng.IntN(4) == 0 {
			failOp := []string{"restore", "list", "flush"}[rng.IntN(3)]
			what += " with " + failOp + " failing"
			log = append(log, what)
			before := k.Dump()
			k.FailNext(failOp, errInjected)
			err := call()
			consumeFailure(ctx, k)
			if err != nil {
				mid := k.Dump()
				if strings.HasPrefix(what, "Apply") {
					// An ADD that fails changes nothing.
					if d := cmp.Diff(before, mid); d != "" {
						fail("a failed %s changed the kernel (-before +after):\n%s", what, d)
					}
				}
				// DEL and GC carry on past a failed family (teardown gathers errors), and
				// a repeated call finishes the job. Each family changes all or nothing.
				if err := call(); err != nil {
					fail("repeating %s: %v", what, err)
				}
				if strings.HasPrefix(what, "Remove") {
					after, b, md := familySections(k.Dump()), familySections(before), familySections(mid)
					for f, s := range md {
						if s != b[f] && s != after[f] {
							fail("a failed %s left family %s half changed:\n%s", what, f, s)
						}
					}
				}
			}
		} else {
			log = append(log, what)
			if err := call(); err != nil {
				fail("%s: %v", what, err)
			}
		}
		effect()
		if err := m.verify(ctx, w); err != nil {
			fail("%v", err)
		}
	}
	for i := range m.owners {
		if err := w.remove(ctx, i, rng.IntN(2) == 0); err != nil {
			fail("final Remove(%s): %v", m.owners[i], err)
		}
	}
	if d := k.Dump(); d != "" {
		fail("removing every owner left the kernel non-empty")
	}
}

func keepList(keep cniplumb.Owners) []string {
	var out []string
	for o := range keep {
		out = append(out, o.Key())
	}
	slices.Sort(out)
	return out
}

// failAt passes everything to the fake kernel but fails its n-th write (an
// iptables-restore or an nftables batch), which FailNext cannot aim at.
type failAt struct {
	*fake.Kernel
	n int
}

func (f *failAt) fail() bool { f.n--; return f.n == 0 }

func (f *failAt) Restore(ctx context.Context, fam netfilter.Family, script string) error {
	if f.fail() {
		return errInjected
	}
	return f.Kernel.Restore(ctx, fam, script)
}

func (f *failAt) Flush() error {
	if f.fail() {
		f.Kernel.FailNext("flush", errInjected) // drops the batch
	}
	return f.Kernel.Flush()
}

// A dual-stack ADD or DEL on iptables is atomic per family only: when the IPv6
// transaction fails after the IPv4 one went through, CHECK must say so, and repeating
// the call must converge. (A DEL whose teardown of the shared chains fails retries
// without it, and the next DEL finishes; nftables layouts are one batch.)
func TestSecondFamilyFailureConverges(t *testing.T) {
	k := &failAt{Kernel: fake.New()}
	hp := netfilter.NewHostPortsOn(netfilter.KindIPTables, k, k)
	mq := netfilter.NewMasqOn(netfilter.KindIPTables, k, k)
	hpA, mq1 := hpPlanA(), masqPlan1()
	removed := func(check func() error) func() error {
		return func() error {
			if err := check(); !netfilter.IsNotFound(err) {
				return fmt.Errorf("Check after Remove = %v, want IsNotFound", err)
			}
			return nil
		}
	}
	for _, step := range []struct {
		name        string
		call, check func() error
	}{
		{"hostport Apply", func() error { return hp.Apply(t.Context(), hpA) }, func() error { return hp.Check(t.Context(), hpA) }},
		{"hostport Remove", func() error { return hp.Remove(t.Context(), hpA.Owner, netfilter.All) }, removed(func() error { return hp.Check(t.Context(), hpA) })},
		{"masq Apply", func() error { return mq.Apply(t.Context(), mq1) }, func() error { return mq.Check(t.Context(), mq1) }},
		{"masq Remove", func() error { return mq.Remove(t.Context(), mq1.Owner, mq1.Addrs) }, removed(func() error { return mq.Check(t.Context(), mq1) })},
	} {
		k.n = 2
		err := step.call()
		switch {
		case err == nil && step.name != "hostport Remove":
			t.Errorf("%s with its IPv6 transaction failing succeeded", step.name)
		case err != nil && strings.HasSuffix(step.name, "Apply") && step.check() == nil:
			t.Errorf("Check passed after a failed %s", step.name)
		}
		k.n = 0
		if err := step.call(); err != nil {
			t.Fatalf("repeating %s: %v", step.name, err)
		}
		if err := step.check(); err != nil {
			t.Errorf("after repeating %s: %v", step.name, err)
		}
	}
	requireEmpty(t, k.Kernel, "every Remove")
}
