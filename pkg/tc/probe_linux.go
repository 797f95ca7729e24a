// SPDX-License-Identifier: Apache-2.0

package tc

import (
	"context"
	"fmt"
	"runtime"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Probe reports whether the kernel can do what Apply needs: create an IFB device, put a
// TBF (with a peak bucket) on it, add a clsact qdisc and a u32 filter with a mirred
// redirect. It tries each in a scratch network namespace that disappears with the
// thread that made it, so it leaves nothing behind on the node. The error names the
// missing piece and the kernel option behind it.
func Probe(ctx context.Context) error {
	done := make(chan error, 1)
	go func() {
		// Never unlocked: when this goroutine returns, the runtime ends the thread, and
		// with its last user the scratch namespace goes away.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			done <- fmt.Errorf("creating a scratch network namespace to probe tc support: %w", err)
			return
		}
		done <- probeHere()
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func probeHere() error {
	h := &netlink.Handle{}
	attrs := netlink.NewLinkAttrs()
	attrs.Name = "pwprobe0"
	if err := h.LinkAdd(&netlink.Ifb{LinkAttrs: attrs}); err != nil {
		return fmt.Errorf("the kernel cannot create IFB devices (CONFIG_IFB, module ifb): %w", err)
	}
	ifb, err := h.LinkByName(attrs.Name)
	if err != nil {
		return fmt.Errorf("reading back the probe IFB: %w", err)
	}
	t, err := SizeTBF(10_000_000, 0, 1500)
	if err != nil {
		return err
	}
	if err := h.QdiscReplace(tbfQdisc(ifb.Attrs().Index, t)); err != nil {
		return fmt.Errorf("the kernel cannot create TBF qdiscs (CONFIG_NET_SCH_TBF, module sch_tbf): %w", err)
	}
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("finding lo in the probe namespace: %w", err)
	}
	hook := &netlink.Clsact{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: lo.Attrs().Index, Handle: ingressHook, Parent: netlink.HANDLE_CLSACT}}
	if err := h.QdiscAdd(hook); err != nil {
		return fmt.Errorf("the kernel cannot create clsact qdiscs (CONFIG_NET_SCH_INGRESS, module sch_ingress): %w", err)
	}
	if err := h.FilterAdd(redirectFilter(lo.Attrs().Index, ifb.Attrs().Index)); err != nil {
		return fmt.Errorf("the kernel cannot add u32 filters with mirred redirects (CONFIG_NET_CLS_U32, CONFIG_NET_ACT_MIRRED): %w", err)
	}
	return nil
}
