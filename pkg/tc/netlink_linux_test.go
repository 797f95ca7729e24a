// SPDX-License-Identifier: Apache-2.0

package tc

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"

	"github.com/podwire/podwire/internal/testenv"
)

// kernelNS gives a test a fresh network namespace with a veth pair (dev "h0", peer
// "p0", both up, MTU 1500) and removes it at the end. Without root it is testenv.Missing.
func kernelNS(t *testing.T) ns.NetNS {
	t.Helper()
	testenv.RequireRoot(t)
	n, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		n.Close()
		testutils.UnmountNS(n)
	})
	in(t, n, func() error {
		attrs := netlink.NewLinkAttrs()
		attrs.Name = "h0"
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: "p0"}); err != nil {
			return err
		}
		for _, name := range []string{"h0", "p0", "lo"} {
			l, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
		}
		// The kernel turns the carrier on a moment later (linkwatch); tests that
		// compare snapshots of the links must not see that happen.
		for i := 0; i < 200; i++ {
			h, herr := netlink.LinkByName("h0")
			p, perr := netlink.LinkByName("p0")
			if herr == nil && perr == nil && h.Attrs().OperState == netlink.OperUp && p.Attrs().OperState == netlink.OperUp {
				return nil
			}
			time.Sleep(10 * time.Millisecond)
		}
		return fmt.Errorf("veth h0/p0 did not come up within 2 s")
	})
	return n
}

func in(t *testing.T, n ns.NetNS, f func() error) {
	t.Helper()
	if err := n.Do(func(ns.NetNS) error { return f() }); err != nil {
		t.Fatal(err)
	}
}

func tcShow(t *testing.T, n ns.NetNS, args ...string) string {
	t.Helper()
	out, err := exec.Command("nsenter", append([]string{"--net=" + n.Path(), "tc"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("tc %v: %v\n%s", args, err, out)
	}
	return string(out)
}

func mustTBF(t *testing.T, rate, burst uint64) *TBF {
	t.Helper()
	tbf, err := SizeTBF(rate, burst, 1500)
	if err != nil {
		t.Fatal(err)
	}
	return &tbf
}

func testPlan(t *testing.T, ingress, egress uint64) Plan {
	p := Plan{Dev: "h0", MTU: 1500, IFB: "pwbtest0", Alias: "podwire:net/c1/eth0"}
	if ingress != 0 {
		p.Ingress = mustTBF(t, ingress, containerdBurst)
	}
	if egress != 0 {
		p.Egress = mustTBF(t, egress, 0)
	}
	return p
}

// requireMatch applies nothing; it observes and requires Diff to be empty.
func requireMatch(t *testing.T, b *Netlink, p Plan) {
	t.Helper()
	s, err := b.Observe(context.Background(), p.Dev, p.IFB)
	if err != nil {
		t.Fatal(err)
	}
	if d := Diff(p, s); d != nil {
		t.Fatalf("kernel state differs from plan:\n%s\nplan:\n%s", strings.Join(d, "\n"), p)
	}
}

func TestNetlinkLifecycle(t *testing.T) {
	n := kernelNS(t)
	ctx := context.Background()
	before := tcShow(t, n, "qdisc", "show")
	in(t, n, func() error {
		b := NewNetlink(nil)
		defer b.Close()
		p := testPlan(t, 10_000_000, 20_000_000)
		if err := b.Apply(ctx, p); err != nil {
			return err
		}
		requireMatch(t, b, p)
		// Idempotent: a second Apply changes nothing and still matches.
		if err := b.Apply(ctx, p); err != nil {
			return err
		}
		requireMatch(t, b, p)

		// The kernel reports exactly what we set.
		q := tcShow(t, n, "qdisc", "show", "dev", "h0")
		for _, w := range []string{"qdisc tbf 1: root", "rate 10Mbit", "burst 62500b", "peakrate 20Mbit", "qdisc clsact ffff: parent ffff:fff1"} {
			if !strings.Contains(q, w) {
				t.Errorf("tc qdisc show dev h0 lacks %q:\n%s", w, q)
			}
		}
		f := tcShow(t, n, "filter", "show", "dev", "h0", "ingress")
		if !strings.Contains(f, "pref 65000 u32") || !strings.Contains(f, "Egress Redirect to device pwbtest0") {
			t.Errorf("redirect filter missing:\n%s", f)
		}
		q = tcShow(t, n, "qdisc", "show", "dev", "pwbtest0")
		if !strings.Contains(q, "qdisc tbf 1: root") || !strings.Contains(q, "rate 20Mbit") {
			t.Errorf("IFB TBF missing:\n%s", q)
		}
		// The reference's IFB has txqueuelen 0 (the kernel's IFB default is 32).
		if l, err := netlink.LinkByName("pwbtest0"); err != nil || l.Attrs().TxQLen != 0 {
			t.Errorf("IFB txqueuelen: %v, %v; want 0, as the reference's", l, err)
		}

		// A changed request updates in place.
		p2 := testPlan(t, 50_000_000, 5_000_000)
		if err := b.Apply(ctx, p2); err != nil {
			return err
		}
		requireMatch(t, b, p2)
		s, _ := b.Observe(ctx, p.Dev, p.IFB)
		if d := Diff(p, s); len(d) == 0 {
			t.Error("Diff against the old plan is empty; CHECK would not notice a changed rate")
		}

		// Dropping egress removes the redirect, the clsact qdisc and the IFB.
		p3 := testPlan(t, 50_000_000, 0)
		if err := b.Apply(ctx, p3); err != nil {
			return err
		}
		requireMatch(t, b, p3)
		if _, err := netlink.LinkByName("pwbtest0"); err == nil {
			t.Error("IFB still exists after a plan without egress")
		}
		// And back to both, then Remove: nothing left, and Remove again succeeds.
		if err := b.Apply(ctx, p); err != nil {
			return err
		}
		requireMatch(t, b, p)
		r := Removal{Dev: "h0", IFBs: []string{"pwbtest0"}}
		if err := b.Remove(ctx, r); err != nil {
			return err
		}
		if err := b.Remove(ctx, r); err != nil {
			t.Errorf("second Remove: %v", err)
		}
		requireMatch(t, b, Plan{Dev: "h0", MTU: 1500, IFB: "pwbtest0"})
		return nil
	})
	if after := tcShow(t, n, "qdisc", "show"); after != before {
		t.Errorf("qdiscs not restored:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if links := showLinks(t, n); strings.Contains(links, "ifb") {
		t.Errorf("IFB left:\n%s", links)
	}
}

func showLinks(t *testing.T, n ns.NetNS) string {
	t.Helper()
	o, err := exec.Command("nsenter", "--net="+n.Path(), "ip", "-d", "link").CombinedOutput()
	if err != nil {
		t.Fatal(err)
	}
	return string(o)
}

// TestNetlinkCoexist: another tc user's clsact and filter on the veth stay untouched;
// podwire's redirect goes beside theirs and only podwire's is removed.
func TestNetlinkCoexist(t *testing.T) {
	for _, hook := range []string{"clsact", "ingress"} {
		t.Run(hook, func(t *testing.T) {
			n := kernelNS(t)
			ctx := context.Background()
			run := func(args ...string) {
				t.Helper()
				if out, err := exec.Command("nsenter", append([]string{"--net=" + n.Path()}, args...)...).CombinedOutput(); err != nil {
					t.Fatalf("%v: %v\n%s", args, err, out)
				}
			}
			run("tc", "qdisc", "add", "dev", "h0", hook)
			run("tc", "filter", "add", "dev", "h0", "ingress", "pref", "1", "protocol", "ip", "u32", "match", "ip", "dst", "10.9.9.9/32", "flowid", "1:1")
			theirs := tcShow(t, n, "filter", "show", "dev", "h0", "ingress")
			in(t, n, func() error {
				b := NewNetlink(nil)
				defer b.Close()
				p := testPlan(t, 0, 10_000_000)
				if err := b.Apply(ctx, p); err != nil {
					return err
				}
				requireMatch(t, b, p)
				s, _ := b.Observe(ctx, "h0", p.IFB)
				if s.Dev.Hook != hook || s.Dev.OtherFilters == 0 {
					t.Errorf("observed hook %q with %d other filters, want their %s kept", s.Dev.Hook, s.Dev.OtherFilters, hook)
				}
				return b.Remove(ctx, Removal{Dev: "h0", IFBs: []string{p.IFB}})
			})
			if got := tcShow(t, n, "qdisc", "show", "dev", "h0"); !strings.Contains(got, "qdisc "+hook+" ffff:") {
				t.Errorf("their %s qdisc was removed:\n%s", hook, got)
			}
			if got := tcShow(t, n, "filter", "show", "dev", "h0", "ingress"); got != theirs {
				t.Errorf("their filters changed:\nbefore:\n%s\nafter:\n%s", theirs, got)
			}
		})
	}
}

// TestNetlinkForeignRoot: a root qdisc podwire did not create is an error naming it,
// and the failed Apply leaves nothing behind (the IFB it made is undone).
func TestNetlinkForeignRoot(t *testing.T) {
	n := kernelNS(t)
	if out, err := exec.Command("nsenter", "--net="+n.Path(), "tc", "qdisc", "add", "dev", "h0", "root", "handle", "5:", "pfifo").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	before := tcShow(t, n, "qdisc", "show")
	in(t, n, func() error {
		b := NewNetlink(nil)
		defer b.Close()
		err := b.Apply(context.Background(), testPlan(t, 10_000_000, 10_000_000))
		if err == nil || !strings.Contains(err.Error(), "pfifo 5:") || !strings.Contains(err.Error(), "did not create") {
			t.Errorf("Apply over a foreign root: %v", err)
		}
		return nil
	})
	if after := tcShow(t, n, "qdisc", "show"); after != before {
		t.Errorf("failed Apply changed qdiscs:\n%s\n--\n%s", before, after)
	}
	if strings.Contains(showLinks(t, n), "pwbtest0") {
		t.Error("failed Apply left the IFB")
	}
}

// TestNetlinkRate64: rates whose bytes/s do not fit 32 bits go through
// TCA_TBF_RATE64 and read back exactly.
func TestNetlinkRate64(t *testing.T) {
	n := kernelNS(t)
	in(t, n, func() error {
		b := NewNetlink(nil)
		defer b.Close()
		for _, rate := range []uint64{4_000_000_000, 40_000_000_000, 400_000_000_000, MaxRate} {
			p := testPlan(t, rate, rate)
			if err := b.Apply(context.Background(), p); err != nil {
				return err
			}
			requireMatch(t, b, p)
		}
		return nil
	})
	if q := tcShow(t, n, "qdisc", "show", "dev", "h0"); !strings.Contains(q, "rate 1Tbit") {
		t.Errorf("1 Tbit/s TBF not visible:\n%s", q)
	}
}

// TestNetlinkRemoveGone: Remove with the veth gone deletes the IFB and succeeds.
func TestNetlinkRemoveGone(t *testing.T) {
	n := kernelNS(t)
	in(t, n, func() error {
		b := NewNetlink(nil)
		defer b.Close()
		p := testPlan(t, 10_000_000, 10_000_000)
		if err := b.Apply(context.Background(), p); err != nil {
			return err
		}
		l, _ := netlink.LinkByName("h0")
		if err := netlink.LinkDel(l); err != nil {
			return err
		}
		if err := b.Remove(context.Background(), Removal{Dev: "h0", IFBs: []string{p.IFB, "bwpnotthere"}}); err != nil {
			return err
		}
		if _, err := netlink.LinkByName(p.IFB); err == nil {
			t.Error("IFB left")
		}
		ifbs, err := b.IFBs(context.Background())
		if err != nil || len(ifbs) != 0 {
			t.Errorf("IFBs() = %v, %v; want none", ifbs, err)
		}
		return nil
	})
}

func TestProbe(t *testing.T) {
	n := kernelNS(t)
	before := showLinks(t, n)
	in(t, n, func() error { return Probe(context.Background()) })
	if after := showLinks(t, n); after != before {
		t.Errorf("Probe changed the namespace:\n%s\n--\n%s", before, after)
	}
}

// TestNetlinkRemoveReferenceRedirect: the reference plugin's redirect (ingress qdisc,
// u32 at pref 1 to its "bwp..." IFB) is recognised by its target and removed whole.
func TestNetlinkRemoveReferenceRedirect(t *testing.T) {
	n := kernelNS(t)
	before := tcShow(t, n, "qdisc", "show")
	for _, args := range [][]string{
		{"ip", "link", "add", "bwp0123456789a", "type", "ifb"},
		{"tc", "qdisc", "add", "dev", "h0", "ingress"},
		{"tc", "filter", "add", "dev", "h0", "parent", "ffff:", "protocol", "all", "prio", "1", "u32", "match", "u32", "0", "0", "action", "mirred", "egress", "redirect", "dev", "bwp0123456789a"},
	} {
		if out, err := exec.Command("nsenter", append([]string{"--net=" + n.Path()}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	in(t, n, func() error {
		b := NewNetlink(nil)
		defer b.Close()
		return b.Remove(context.Background(), Removal{Dev: "h0", IFBs: []string{"pwbtest0", "bwp0123456789a"}})
	})
	if after := tcShow(t, n, "qdisc", "show"); after != before {
		t.Errorf("qdiscs not restored:\n%s\n--\n%s", before, after)
	}
	if strings.Contains(showLinks(t, n), "bwp0123456789a") {
		t.Error("reference IFB left")
	}
}

// TestNetlinkRemoveHint: with OnlyIfRedirected, a veth whose redirect goes to another
// IFB (the name now belongs to another pod) keeps everything; the IFB still goes.
func TestNetlinkRemoveHint(t *testing.T) {
	n := kernelNS(t)
	ctx := context.Background()
	in(t, n, func() error {
		b := NewNetlink(nil)
		defer b.Close()
		p := testPlan(t, 10_000_000, 10_000_000)
		if err := b.Apply(ctx, p); err != nil {
			return err
		}
		attrs := netlink.NewLinkAttrs()
		attrs.Name = "pwbstale"
		if err := netlink.LinkAdd(&netlink.Ifb{LinkAttrs: attrs}); err != nil {
			return err
		}
		if err := b.Remove(ctx, Removal{Dev: "h0", IFBs: []string{"pwbstale"}, OnlyIfRedirected: true}); err != nil {
			return err
		}
		requireMatch(t, b, p)
		if _, err := netlink.LinkByName("pwbstale"); err == nil {
			t.Error("stale IFB left")
		}
		// Now the hint is right: everything goes.
		if err := b.Remove(ctx, Removal{Dev: "h0", IFBs: []string{p.IFB}, OnlyIfRedirected: true}); err != nil {
			return err
		}
		requireMatch(t, b, Plan{Dev: "h0", MTU: 1500, IFB: p.IFB})
		return nil
	})
}
