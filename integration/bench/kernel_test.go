package bench

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/podwire/podwire/integration/nstest"
	"github.com/podwire/podwire/pkg/link"
)

// The bench binary is also link.DeleteOffExit's child (section 2b).
func TestMain(m *testing.M) {
	link.RunDeleteChild()
	os.Exit(m.Run())
}

// benchKernel times, in this process (no plugin, no process start), the kernel
// operations a chain ADD/DEL cannot avoid, so the plugin rows can be read against
// them: making and deleting a veth pair into a pod netns and an IFB, and an nftables
// rule deletion whose netlink socket is then closed (closing a netfilter socket
// waits for the deleted rules to be freed after an RCU grace period).
func benchKernel(e *env, t *testing.T) {
	tbl := e.rep.section("2b. Kernel operations alone", "operation", "ms (median / p95)")
	tbl.intro = "What the kernel charges for the objects a chain makes and removes, timed in the bench process itself " +
		"(netlink calls on a thread in a fresh host netns; no plugin, no process start). A plugin row can be no lower " +
		"than the floor plus the kernel operations its verb waits for. A link deletion returns only after the kernel's wait " +
		"to free the link, which comes after the link has left its namespace; podwire's bridge and bandwidth leave that " +
		"wait to a re-executed child (link.DeleteOffExit, timed here with this test binary as the child)."
	iters := 15
	if e.quick {
		iters = 6
	}
	h := nstest.New(t)
	pod := h.NewPod()
	var vethAdd, vethDel, ifbAdd, ifbDel, nftDel, nftClose, linkGroupDel, vethOffExit sample
	err := h.InHost(func() error {
		for i := 0; i < iters; i++ {
			la := netlink.NewLinkAttrs()
			la.Name = "kv" + fmt.Sprint(i)
			veth := &netlink.Veth{LinkAttrs: la, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(pod.Fd()))}
			t0 := time.Now()
			if err := netlink.LinkAdd(veth); err != nil {
				return fmt.Errorf("adding a veth: %w", err)
			}
			vethAdd = append(vethAdd, time.Since(t0))
			ia := netlink.NewLinkAttrs()
			ia.Name = "ki" + fmt.Sprint(i)
			ifb := &netlink.Ifb{LinkAttrs: ia}
			t0 = time.Now()
			if err := netlink.LinkAdd(ifb); err != nil {
				return fmt.Errorf("adding an IFB: %w", err)
			}
			ifbAdd = append(ifbAdd, time.Since(t0))
			t0 = time.Now()
			if err := netlink.LinkDel(veth); err != nil {
				return fmt.Errorf("deleting a veth: %w", err)
			}
			vethDel = append(vethDel, time.Since(t0))
			t0 = time.Now()
			if err := netlink.LinkDel(ifb); err != nil {
				return fmt.Errorf("deleting an IFB: %w", err)
			}
			ifbDel = append(ifbDel, time.Since(t0))

			// Both links in one request: the kernel unregisters them as a batch.
			if err := netlink.LinkAdd(veth); err != nil {
				return fmt.Errorf("adding a veth: %w", err)
			}
			if err := netlink.LinkAdd(ifb); err != nil {
				return fmt.Errorf("adding an IFB: %w", err)
			}
			for _, l := range []netlink.Link{veth, ifb} {
				if err := netlink.LinkSetGroup(l, 77); err != nil {
					return fmt.Errorf("setting a link group: %w", err)
				}
			}
			t0 = time.Now()
			if err := linkDelGroup(77); err != nil {
				return err
			}
			linkGroupDel = append(linkGroupDel, time.Since(t0))

			// The same pair once more, deleted from the pod's side as bridge does.
			if err := netlink.LinkAdd(veth); err != nil {
				return fmt.Errorf("adding a veth: %w", err)
			}
			t0 = time.Now()
			if err := link.DeleteOffExit(pod.Path(), "eth0"); err != nil {
				return fmt.Errorf("deleting a veth off exit: %w", err)
			}
			vethOffExit = append(vethOffExit, time.Since(t0))

			d, c, err := nftRuleDelete()
			if err != nil {
				return err
			}
			nftDel, nftClose = append(nftDel, d), append(nftClose, c)
		}
		return nil
	})
	if err != nil {
		t.Errorf("kernel costs: %v", err)
		tbl.note("failed: %s", oneLine(err))
	}
	tbl.row("create a veth pair, peer into a pod netns (RTM_NEWLINK)", cell(vethAdd))
	tbl.row("delete that veth pair (RTM_DELLINK)", cell(vethDel))
	tbl.row("create an IFB", cell(ifbAdd))
	tbl.row("delete an IFB", cell(ifbDel))
	tbl.row("delete a veth pair and an IFB in one request (link group)", cell(linkGroupDel))
	tbl.row("delete a veth pair through a re-executed child, until its RTM_DELLINK (link.DeleteOffExit)", cell(vethOffExit))
	tbl.row("nftables: delete a rule, its chain and table (one batch)", cell(nftDel))
	tbl.row("nftables: then close that netlink socket (waits for the deleted objects to be freed)", cell(nftClose))
}

// linkDelGroup deletes every link in group g with one RTM_DELLINK (ifindex 0 and
// IFLA_GROUP), which the kernel unregisters as one batch; vishvananda/netlink has no
// call for it.
func linkDelGroup(g uint32) error {
	req := nl.NewNetlinkRequest(unix.RTM_DELLINK, unix.NLM_F_ACK)
	req.AddData(nl.NewIfInfomsg(unix.AF_UNSPEC))
	req.AddData(nl.NewRtAttr(unix.IFLA_GROUP, nl.Uint32Attr(g)))
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil {
		return fmt.Errorf("deleting link group %d: %w", g, err)
	}
	return nil
}

// nftRuleDelete makes a table, chain and rule on one connection, then times deleting
// the rule (one batch) and closing the socket that did it.
func nftRuleDelete() (del, closeSock time.Duration, err error) {
	c, err := nftables.New(nftables.AsLasting())
	if err != nil {
		return 0, 0, fmt.Errorf("opening nftables: %w", err)
	}
	tab := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "benchkernel"})
	ch := c.AddChain(&nftables.Chain{Name: "c", Table: tab})
	r := c.AddRule(&nftables.Rule{Table: tab, Chain: ch, Exprs: []expr.Any{&expr.Counter{}}})
	if err := c.Flush(); err != nil {
		_ = c.CloseLasting()
		return 0, 0, fmt.Errorf("adding an nftables rule: %w", err)
	}
	_ = r // the kernel assigns the handle; list to learn it
	rules, err := c.GetRules(tab, ch)
	if err != nil || len(rules) != 1 {
		_ = c.CloseLasting()
		return 0, 0, fmt.Errorf("listing the rule: %v (%d rules)", err, len(rules))
	}
	// Let the additions' own cleanup finish so only the deletion is measured.
	if err := c.CloseLasting(); err != nil {
		return 0, 0, err
	}
	time.Sleep(50 * time.Millisecond)
	c, err = nftables.New(nftables.AsLasting())
	if err != nil {
		return 0, 0, err
	}
	t0 := time.Now()
	if err := c.DelRule(rules[0]); err != nil {
		_ = c.CloseLasting()
		return 0, 0, err
	}
	c.DelTable(tab)
	if err := c.Flush(); err != nil {
		_ = c.CloseLasting()
		return 0, 0, fmt.Errorf("deleting the rule: %w", err)
	}
	del = time.Since(t0)
	t0 = time.Now()
	err = c.CloseLasting()
	return del, time.Since(t0), err
}
