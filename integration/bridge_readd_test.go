// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/podwire/podwire/integration/nstest"
)

// leaseHolders reads host-local's lease files of network: address -> "containerID/ifname".
func leaseHolders(t *testing.T, h *nstest.H, network string) map[string]string {
	t.Helper()
	dir := filepath.Join(h.DataDir, network)
	ents, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range ents {
		name := e.Name()
		if e.IsDir() || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "last_reserved_ip") || name == "lock" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			continue // being replaced by a concurrent call
		}
		id, ifname, _ := strings.Cut(strings.TrimSpace(string(b)), "\r\n")
		out[name] = id + "/" + strings.TrimSpace(ifname)
	}
	return out
}

// podAddr is the IPv4 address on eth0 in pod p, "" when there is none.
func podAddr(t *testing.T, p ns.NetNS) string {
	t.Helper()
	out, err := nstest.RunIn(p, "ip", "-o", "-4", "addr", "show", "dev", "eth0")
	if err != nil {
		return ""
	}
	f := strings.Fields(out)
	for i, w := range f {
		if w == "inet" && i+1 < len(f) {
			a, _, _ := strings.Cut(f[i+1], "/")
			return a
		}
	}
	return ""
}

// TestBridgeRepeatedAddKeepsLease: a second ADD of a live attachment fails (the pod
// already has eth0) without touching what the first ADD made: the pod keeps its
// address and lease, and the next pod gets another address.
func TestBridgeRepeatedAddKeepsLease(t *testing.T) {
	h := nstest.New(t)
	list := bridgeConf(h, `"isGateway":true,"ipMasq":true`, `[[{"subnet":"10.31.0.0/24"}]]`)
	warmUp(t, h, list)
	before := h.Snapshot()

	p1 := h.NewPod()
	rt1 := h.RT(p1, "eth0")
	a1 := addrOf(t, h.MustAdd(list, rt1), false)
	if r, err := h.Add(list, rt1); err == nil && addrOf(t, r, false) != a1 {
		t.Errorf("repeated ADD succeeded with another address %s, want %s", addrOf(t, r, false), a1)
	}
	if got := leaseHolders(t, h, list.Name)[a1]; got != rt1.ContainerID+"/eth0" {
		t.Errorf("after the repeated ADD, lease %s is held by %q, want %s/eth0", a1, got, rt1.ContainerID)
	}
	if got := podAddr(t, p1); got != a1 {
		t.Errorf("after the repeated ADD, pod 1 has address %q, want %s", got, a1)
	}
	if err := h.Check(list, rt1); err != nil {
		t.Errorf("CHECK after the repeated ADD: %v", err)
	}
	p2 := h.NewPod()
	rt2 := h.RT(p2, "eth0")
	if a2 := addrOf(t, h.MustAdd(list, rt2), false); a2 == a1 {
		t.Errorf("pod 2 got %s, the address live pod 1 holds", a2)
	}
	h.MustDel(list, rt1)
	h.MustDel(list, rt2)
	settleBridge(t, h, h.Name("br"))
	h.RequireUnchanged(before)
}

// TestBridgeChurnNoDuplicateAddress runs hundreds of ADD, ADD-again, DEL, CHECK and GC
// calls at once on a few dozen attachments, serialized per attachment as a runtime
// does (and GC against everything, since its valid list must be exact), then requires
// that no address is held by two live attachments, on the pods and in the lease files.
func TestBridgeChurnNoDuplicateAddress(t *testing.T) {
	h := nstest.New(t)
	// A small subnet, so a released live address is soon handed out again.
	list := bridgeConf(h, `"isGateway":true,"ipMasq":true`, `[[{"subnet":"10.32.0.0/26"}]]`)
	warmUp(t, h, list)
	before := h.Snapshot()

	const pods, workers, ops = 24, 8, 400
	type att struct {
		mu   sync.Mutex
		p    ns.NetNS
		rt   *libcni.RuntimeConf
		live bool
		addr string
	}
	atts := make([]*att, pods)
	for i := range atts {
		p := h.NewPod()
		atts[i] = &att{p: p, rt: h.RT(p, "eth0")}
	}
	var gcMu sync.RWMutex // GC excludes every other call: its valid list must be exact
	var errMu sync.Mutex
	var errs []string
	fail := func(format string, a ...any) {
		errMu.Lock()
		defer errMu.Unlock()
		errs = append(errs, fmt.Sprintf(format, a...))
	}
	// holder finds another live attachment holding addr (callers hold a.mu only).
	holder := func(self *att, addr string) int {
		for i, o := range atts {
			if o == self {
				continue
			}
			o.mu.Lock()
			same := o.live && o.addr == addr
			o.mu.Unlock()
			if same {
				return i
			}
		}
		return -1
	}
	var wg sync.WaitGroup
	counts := make([]map[string]int, workers)
	for w := 0; w < workers; w++ {
		counts[w] = map[string]int{}
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 15))
			for n := 0; n < ops/workers; n++ {
				if rng.IntN(20) == 0 {
					gcMu.Lock()
					var valid []types.GCAttachment
					for _, a := range atts {
						if a.live {
							valid = append(valid, types.GCAttachment{ContainerID: a.rt.ContainerID, IfName: "eth0"})
						}
					}
					if err := h.GC(list, valid); err != nil {
						fail("GC: %v", err)
					}
					gcMu.Unlock()
					counts[w]["GC"]++
					continue
				}
				i := rng.IntN(pods)
				a := atts[i]
				gcMu.RLock()
				a.mu.Lock()
				switch {
				case !a.live:
					r, err := h.Add(list, a.rt)
					if err != nil {
						fail("ADD of pod %d: %v", i, err)
						break
					}
					a.live, a.addr = true, addrOf(t, r, false)
					a.mu.Unlock()
					if j := holder(a, a.addr); j >= 0 {
						fail("pod %d got %s, which live pod %d holds", i, a.addr, j)
					}
					a.mu.Lock()
					counts[w]["ADD"]++
				case rng.IntN(3) == 0:
					// ADD again: may fail (the pod has eth0) but must change nothing.
					if r, err := h.Add(list, a.rt); err == nil && addrOf(t, r, false) != a.addr {
						fail("repeated ADD of pod %d returned %s, want %s", i, addrOf(t, r, false), a.addr)
					}
					counts[w]["ADD-again"]++
				case rng.IntN(4) == 0:
					if err := h.Check(list, a.rt); err != nil {
						out, _ := exec.Command("nsenter", "--net="+h.HostNS.Path(), "sh", "-c", "nft list table inet cni_plugins_masquerade; iptables-save -t nat | grep -c CNI-").CombinedOutput()
						fail("CHECK of live pod %d: %v\n%s", i, err, out)
					}
					counts[w]["CHECK"]++
				default:
					if err := h.Del(list, a.rt); err != nil {
						fail("DEL of pod %d: %v", i, err)
					}
					a.live, a.addr = false, ""
					counts[w]["DEL"]++
				}
				a.mu.Unlock()
				gcMu.RUnlock()
			}
		}(w)
	}
	wg.Wait()
	total := map[string]int{}
	for _, c := range counts {
		for k, v := range c {
			total[k] += v
		}
	}
	t.Logf("calls: %v", total)
	for _, e := range errs {
		t.Error(e)
	}
	// The end state: every live pod has its own address on eth0, and its lease.
	leases := leaseHolders(t, h, list.Name)
	seen := map[string]int{}
	for i, a := range atts {
		if !a.live {
			continue
		}
		got := podAddr(t, a.p)
		if got != a.addr {
			t.Errorf("live pod %d has %q on eth0, its ADD returned %s", i, got, a.addr)
		}
		if j, dup := seen[got]; dup {
			t.Errorf("live pods %d and %d both hold %s", j, i, got)
		}
		seen[got] = i
		if holder := leases[a.addr]; holder != a.rt.ContainerID+"/eth0" {
			t.Errorf("the lease of live pod %d's address %s is held by %q", i, a.addr, holder)
		}
	}
	for _, a := range atts {
		if a.live {
			h.MustDel(list, a.rt)
		}
	}
	settleBridge(t, h, h.Name("br"))
	h.RequireUnchanged(before)
}
