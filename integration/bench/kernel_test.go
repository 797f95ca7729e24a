// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/podwire/podwire/integration/nstest"
	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/link"
	"github.com/podwire/podwire/pkg/netfilter"
)

// The bench binary is also section 2b's exiting process (nftExitChild).
func TestMain(m *testing.M) {
	runNFTExitChild()
	os.Exit(m.Run())
}

// benchKernel times the kernel operations a chain ADD/DEL cannot avoid, so the plugin
// rows can be read against them: in this process (no plugin, no process start),
// making and deleting a veth pair into a pod netns and an IFB, and an nftables table,
// chain and rule added and deleted; and, in a child process (this binary run again),
// what exiting costs a process whose nf_tables socket deleted something: the kernel
// frees deleted objects after an RCU grace period, and the release of that socket in
// the exit waits for it (podwire's DEL pays that wait in its own exit).
func benchKernel(e *env, t *testing.T) {
	tbl := e.rep.section("2b. Kernel operations alone", "operation", "ms (median / p95)")
	tbl.intro = "What the kernel charges for the objects a chain makes and removes, timed in the bench process itself " +
		"(netlink calls on a thread in a fresh host netns; no plugin, no process start) unless the row says otherwise. " +
		"A plugin row can be no lower than the floor plus the kernel operations its verb waits for. A link deletion returns " +
		"only after the kernel's wait to free the link, which comes after the link has left its namespace; podwire's bridge " +
		"and bandwidth pay that wait in their own process, as the reference does (nothing a plugin starts may outlive it). " +
		"A process whose nf_tables socket deleted rules waits in its exit, where the kernel releases the socket, " +
		"for the deleted objects to be freed; podwire's DEL pays that too, once per process. The exit rows time a child process (this test binary) from its last write, right after " +
		"the change, to its reaping, through podwire's nftables masquerade backend (one rule in the reference's table)."
	iters := 15
	if e.quick {
		iters = 6
	}
	h := nstest.New(t)
	pod := h.NewPod()
	k := map[string]sample{}
	links := link.NewNetlink()
	err := h.InHost(func() error {
		for i := 0; i < iters; i++ {
			la := netlink.NewLinkAttrs()
			la.Name = "kv" + fmt.Sprint(i)
			veth := &netlink.Veth{LinkAttrs: la, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(pod.Fd()))}
			t0 := time.Now()
			if err := netlink.LinkAdd(veth); err != nil {
				return fmt.Errorf("adding a veth: %w", err)
			}
			k["veth-add"] = append(k["veth-add"], time.Since(t0))
			ia := netlink.NewLinkAttrs()
			ia.Name = "ki" + fmt.Sprint(i)
			ifb := &netlink.Ifb{LinkAttrs: ia}
			t0 = time.Now()
			if err := netlink.LinkAdd(ifb); err != nil {
				return fmt.Errorf("adding an IFB: %w", err)
			}
			k["ifb-add"] = append(k["ifb-add"], time.Since(t0))
			t0 = time.Now()
			if err := netlink.LinkDel(veth); err != nil {
				return fmt.Errorf("deleting a veth: %w", err)
			}
			k["veth-del"] = append(k["veth-del"], time.Since(t0))
			t0 = time.Now()
			if err := netlink.LinkDel(ifb); err != nil {
				return fmt.Errorf("deleting an IFB: %w", err)
			}
			k["ifb-del"] = append(k["ifb-del"], time.Since(t0))

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
			k["group-del"] = append(k["group-del"], time.Since(t0))

			// The same pair once more, deleted from the pod's side as bridge's DEL
			// does (entering the pod netns by its path).
			if err := netlink.LinkAdd(veth); err != nil {
				return fmt.Errorf("adding a veth: %w", err)
			}
			t0 = time.Now()
			if err := links.Delete(context.Background(), link.Ref{Netns: pod.Path(), Name: "eth0"}); err != nil {
				return fmt.Errorf("deleting a veth from the pod's side: %w", err)
			}
			k["veth-poddel"] = append(k["veth-poddel"], time.Since(t0))

			a, d, c, err := nftRuleDelete()
			if err != nil {
				return err
			}
			k["nft-add"], k["nft-del"], k["nft-close"] = append(k["nft-add"], a), append(k["nft-del"], d), append(k["nft-close"], c)

			for _, mode := range nftExitModes {
				time.Sleep(50 * time.Millisecond) // the previous child's frees are done
				d, err := nftExit(mode)
				if err != nil {
					return err
				}
				k[mode] = append(k[mode], d)
			}

			// Right after the exit-del child, then once the kernel is done freeing:
			// `iptables --version` opens an nf_tables socket too (iptables-nft's init).
			for _, key := range []string{"proc-after", "proc"} {
				if key == "proc" {
					time.Sleep(50 * time.Millisecond)
				}
				t0 = time.Now()
				if out, err := exec.Command("iptables", "--version").CombinedOutput(); err != nil {
					return fmt.Errorf("iptables --version: %w: %s", err, out)
				}
				k[key] = append(k[key], time.Since(t0))
			}
		}
		return nil
	})
	if err != nil {
		t.Errorf("kernel costs: %v", err)
		tbl.note("failed: %s", oneLine(err))
	}
	for key, s := range k {
		e.kernel[key] = s
	}
	for _, op := range kernelOps {
		tbl.row(op.label, cell(k[op.key]))
	}
}

// kernelOps are section 2b's rows, by the key of their samples.
var kernelOps = []struct{ key, label string }{
	{"veth-add", "create a veth pair, peer into a pod netns (RTM_NEWLINK)"},
	{"veth-del", "delete that veth pair (RTM_DELLINK)"},
	{"ifb-add", "create an IFB"},
	{"ifb-del", "delete an IFB"},
	{"group-del", "delete a veth pair and an IFB in one request (link group)"},
	{"veth-poddel", "delete a veth pair from the pod's netns by its path, as bridge's DEL does (link.Netlink.Delete)"},
	{"nft-add", "nftables: add a table, chain and rule (one batch)"},
	{"nft-del", "nftables: delete that rule, chain and table (one batch)"},
	{"nft-close", "nftables: then close that netlink socket, in this process (the close can wait for the kernel to free the deleted objects)"},
	{"exit-bare", "a child process exits having changed nothing (the baseline of the exit rows)"},
	{"exit-add", "a child process exits right after adding a masquerade rule (its nf_tables socket is released in the exit)"},
	{"exit-del", "a child process exits right after deleting that rule and table, holding the socket (released in the exit)"},
	{"proc", "start `iptables --version` and wait for it (one process of the iptables tools, as go-iptables' probe)"},
	{"proc-after", "the same, started right after the exit-del row's child (on iptables-nft it opens an nf_tables socket, whose release can wait for frees still pending)"},
}

// nftExitEnv makes the bench binary a section 2b exit child (runNFTExitChild); its
// value is one of nftExitModes.
const nftExitEnv = "PODWIRE_BENCH_NFT_EXIT"

// nftExitModes are the exit children, each a key of section 2b's samples. They run in
// this order, so exit-add leaves its rule for exit-del to replace and delete.
var nftExitModes = []string{"exit-bare", "exit-add", "exit-del"}

// nftExit runs one exit child in the calling thread's network namespace and returns
// the time from its one-byte write on stdout, right after its change, to its reaping.
func nftExit(mode string) (time.Duration, error) {
	cmd := exec.Command("/proc/self/exe")
	cmd.Env = []string{nftExitEnv + "=" + mode}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("starting the %s child: %w", mode, err)
	}
	b := make([]byte, 1)
	_, rerr := io.ReadFull(out, b)
	t0 := time.Now()
	werr := cmd.Wait()
	d := time.Since(t0)
	if rerr != nil || werr != nil {
		return 0, fmt.Errorf("the %s child: %v %v: %s", mode, rerr, werr, strings.TrimSpace(stderr.String()))
	}
	return d, nil
}

// runNFTExitChild is the exit child, when this process is one: it makes its change
// through podwire's nftables masquerade backend, writes one byte and exits. Otherwise
// it returns at once.
func runNFTExitChild() {
	mode, ok := os.LookupEnv(nftExitEnv)
	if !ok {
		return
	}
	if err := nftExitChild(mode); err != nil {
		fmt.Fprintf(os.Stderr, "bench exit child %s: %v\n", mode, err)
		os.Exit(1)
	}
	os.Exit(0)
}

func nftExitChild(mode string) error {
	ctx := context.Background()
	b, _, err := netfilter.OpenMasq(netfilter.KindNFTables)
	if err != nil {
		return err
	}
	o := cniplumb.Owner{Network: "benchkernel", ContainerID: "exit-child", IfName: "eth0"}
	p := netfilter.MasqPlan{Owner: o, Addrs: []netip.Prefix{netip.MustParsePrefix("10.95.0.2/24")}}
	switch mode {
	case "exit-bare":
	case "exit-add":
		if err := b.Apply(ctx, p); err != nil {
			return err
		}
	case "exit-del":
		if err := b.Apply(ctx, p); err != nil {
			return err
		}
		time.Sleep(50 * time.Millisecond) // only the deletion's frees are pending at exit
		if err := b.Remove(ctx, o, p.Addrs); err != nil {
			return err
		}
	default:
		return fmt.Errorf("unknown mode")
	}
	if _, err := os.Stdout.Write([]byte{'x'}); err != nil {
		return err
	}
	return nil
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

// nftRuleDelete times making a table, chain and rule on one connection (one batch),
// then, on another, deleting them (one batch) and closing the socket that did it.
func nftRuleDelete() (add, del, closeSock time.Duration, err error) {
	c, err := nftables.New(nftables.AsLasting())
	if err != nil {
		return 0, 0, 0, fmt.Errorf("opening nftables: %w", err)
	}
	t0 := time.Now()
	tab := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "benchkernel"})
	ch := c.AddChain(&nftables.Chain{Name: "c", Table: tab})
	c.AddRule(&nftables.Rule{Table: tab, Chain: ch, Exprs: []expr.Any{&expr.Counter{}}})
	if err := c.Flush(); err != nil {
		_ = c.CloseLasting()
		return 0, 0, 0, fmt.Errorf("adding an nftables rule: %w", err)
	}
	add = time.Since(t0)
	// The kernel assigns the handle; list to learn it.
	rules, err := c.GetRules(tab, ch)
	if err != nil || len(rules) != 1 {
		_ = c.CloseLasting()
		return 0, 0, 0, fmt.Errorf("listing the rule: %v (%d rules)", err, len(rules))
	}
	// Let the additions' own cleanup finish so only the deletion is measured.
	if err := c.CloseLasting(); err != nil {
		return 0, 0, 0, err
	}
	time.Sleep(50 * time.Millisecond)
	c, err = nftables.New(nftables.AsLasting())
	if err != nil {
		return 0, 0, 0, err
	}
	t0 = time.Now()
	if err := c.DelRule(rules[0]); err != nil {
		_ = c.CloseLasting()
		return 0, 0, 0, err
	}
	c.DelTable(tab)
	if err := c.Flush(); err != nil {
		_ = c.CloseLasting()
		return 0, 0, 0, fmt.Errorf("deleting the rule: %w", err)
	}
	del = time.Since(t0)
	t0 = time.Now()
	err = c.CloseLasting()
	return add, del, time.Since(t0), err
}
