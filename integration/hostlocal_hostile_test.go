// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/podwire/podwire/integration/nstest"
)

// TestHostLocalLockFileRemoved runs hundreds of concurrent ADD, repeated ADD, DEL and
// GC calls of the built host-local through libcni while another goroutine keeps
// deleting <dataDir>/<network>/lock (someone clearing a lease directory on a live
// node). It requires that an address is never handed to an attachment while another
// live attachment holds it, that a repeated ADD returns exactly the first ADD's
// address, that every lease file names the attachment holding it, and that DEL of
// every attachment leaves no lease. PODWIRE_STRESS=1 runs ten times as many calls.
func TestHostLocalLockFileRemoved(t *testing.T) {
	h := nstest.New(t)
	// A /26 (61 usable addresses) for 40 attachments: addresses are reused quickly,
	// so a lease that names the wrong owner soon gives a live address away.
	list := hostLocalList(h, "nolock", `"ranges":[[{"subnet":"10.86.0.0/26"}]]`)
	lockPath := filepath.Join(h.DataDir, list.Name, "lock")
	pod := h.NewPod()
	const attachments, workers = 40, 8
	ops := 400
	if os.Getenv("PODWIRE_STRESS") != "" {
		ops = 4000
	}

	type att struct {
		mu   sync.Mutex // one call per attachment at a time, as a runtime does
		rt   *libcni.RuntimeConf
		ip   string // from the last successful ADD; "" when not live
		busy bool   // an ADD is running (for the GC's valid list)
	}
	atts := make([]*att, attachments)
	for i := range atts {
		atts[i] = &att{rt: h.RT(pod, "eth0", nstest.WithContainerID(fmt.Sprintf("hostile%02d", i)))}
	}
	var (
		mu       sync.Mutex              // guards holders, failures and att.ip/busy
		holders  = map[string]int{}      // address -> live attachment
		failures = map[string][]string{} // kind -> messages
		// gcMu: a GC's valid list includes every ADD already running; an ADD starting
		// during a GC waits, as it would not be in the runtime's list either.
		gcMu                    sync.RWMutex
		nAdd, nAgain, nDel, nGC atomic.Int64
		removed                 atomic.Int64
		stop                    = make(chan struct{})
		removerDone, gcDone     = make(chan struct{}), make(chan struct{})
	)
	failLocked := func(kind, format string, a ...any) {
		failures[kind] = append(failures[kind], fmt.Sprintf(format, a...))
	}
	fail := func(kind, format string, a ...any) {
		mu.Lock()
		defer mu.Unlock()
		failLocked(kind, format, a...)
	}

	// The first ADD creates the directory and lock; from then on, remove the lock file
	// every few milliseconds.
	h.MustAdd(list, atts[0].rt)
	atts[0].ip = leaseIPOf(t, h, list, atts[0].rt.ContainerID)
	holders[atts[0].ip] = 0
	go func() {
		defer close(removerDone)
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(1+rand.IntN(4)) * time.Millisecond):
			}
			if os.Remove(lockPath) == nil {
				removed.Add(1)
			}
		}
	}()
	go func() {
		defer close(gcDone)
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(20+rand.IntN(30)) * time.Millisecond):
			}
			gcMu.Lock()
			var valid []types.GCAttachment
			mu.Lock()
			for _, a := range atts {
				if a.ip != "" || a.busy {
					valid = append(valid, types.GCAttachment{ContainerID: a.rt.ContainerID, IfName: a.rt.IfName})
				}
			}
			mu.Unlock()
			if err := h.GC(list, valid); err != nil {
				fail("GC failed", "GC: %v", err)
			}
			gcMu.Unlock()
			nGC.Add(1)
		}
	}()

	jobs := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range jobs {
				i := rand.IntN(attachments)
				a := atts[i]
				a.mu.Lock()
				mu.Lock()
				live := a.ip != ""
				mu.Unlock()
				if !live || rand.IntN(3) > 0 {
					// ADD, or ADD again of a live attachment.
					gcMu.RLock()
					mu.Lock()
					a.busy = true
					mu.Unlock()
					gcMu.RUnlock()
					res, err := h.Add(list, a.rt)
					failedAdd := false
					mu.Lock()
					a.busy = false
					switch {
					case err != nil:
						failLocked("ADD failed", "ADD %s (live=%v): %v", a.rt.ContainerID, live, err)
						if j, held := holders[a.ip]; held && j == i {
							delete(holders, a.ip)
						}
						a.ip, failedAdd = "", true
					case len(res.IPs) != 1:
						failLocked("wrong result", "ADD %s: %d addresses", a.rt.ContainerID, len(res.IPs))
					default:
						ip := res.IPs[0].Address.IP.String()
						if live && ip != a.ip {
							failLocked("repeated ADD got another address", "repeated ADD %s returned %s, its first ADD %s", a.rt.ContainerID, ip, a.ip)
						}
						if j, held := holders[ip]; held && j != i {
							failLocked("address of a live attachment handed out", "ADD %s got %s, which live %s holds", a.rt.ContainerID, ip, atts[j].rt.ContainerID)
						}
						if j, held := holders[a.ip]; live && ip != a.ip && held && j == i {
							delete(holders, a.ip)
						}
						holders[ip] = i
						a.ip = ip
					}
					mu.Unlock()
					if failedAdd {
						// A runtime follows a failed ADD with DEL.
						if err := h.Del(list, a.rt); err != nil {
							fail("DEL failed", "DEL %s after its failed ADD: %v", a.rt.ContainerID, err)
						}
					}
					if live {
						nAgain.Add(1)
					} else {
						nAdd.Add(1)
					}
				} else {
					// DEL: the address counts as free from the moment DEL starts.
					mu.Lock()
					if j, held := holders[a.ip]; held && j == i {
						delete(holders, a.ip)
					}
					a.ip = ""
					mu.Unlock()
					if err := h.Del(list, a.rt); err != nil {
						fail("DEL failed", "DEL %s: %v", a.rt.ContainerID, err)
					}
					nDel.Add(1)
				}
				a.mu.Unlock()
			}
		}()
	}
	for k := 0; k < ops; k++ {
		jobs <- k
	}
	close(jobs)
	wg.Wait()
	close(stop)
	<-removerDone
	<-gcDone
	t.Logf("%d ADDs, %d repeated ADDs, %d DELs, %d GCs; the lock file was removed %d times",
		nAdd.Load(), nAgain.Load(), nDel.Load(), nGC.Load(), removed.Load())
	if removed.Load() < 10 {
		t.Errorf("the lock file was removed only %d times: the test did not exercise anything", removed.Load())
	}

	// Every lease file names the live attachment holding its address, and every live
	// attachment's address has its lease.
	want := map[string]string{}
	for _, a := range atts {
		if a.ip != "" {
			want[a.ip] = a.rt.ContainerID + `\r\neth0`
		}
	}
	got := leaseFiles(t, h, list)
	for ip, content := range got {
		if want[ip] != content {
			failLocked("lease names the wrong attachment", "lease %s names %q, want %q", ip, content, want[ip])
		}
	}
	for ip, content := range want {
		if _, ok := got[ip]; !ok {
			failLocked("live attachment without lease", "live %s holds %s but has no lease file", content, ip)
		}
	}
	for _, a := range atts {
		if err := h.Del(list, a.rt); err != nil {
			failLocked("DEL failed", "final DEL %s: %v", a.rt.ContainerID, err)
		}
	}
	if left := leaseFiles(t, h, list); len(left) != 0 {
		failLocked("leases left after DEL of everything", "%v", left)
	}
	if len(failures) > 0 {
		var kinds []string
		for k := range failures {
			kinds = append(kinds, k)
		}
		sort.Strings(kinds)
		var report []string
		for _, k := range kinds {
			msgs := failures[k]
			report = append(report, fmt.Sprintf("%s: %d times, e.g.", k, len(msgs)))
			for _, m := range msgs[:min(len(msgs), 3)] {
				report = append(report, "    "+m)
			}
		}
		t.Fatalf("failures:\n%s", strings.Join(report, "\n"))
	}
}

// leaseIPOf returns the address whose lease file names containerID.
func leaseIPOf(t *testing.T, h *nstest.H, list *libcni.NetworkConfigList, containerID string) string {
	t.Helper()
	for ip, c := range leaseFiles(t, h, list) {
		if strings.HasPrefix(c, containerID+`\r\n`) {
			return ip
		}
	}
	t.Fatalf("no lease names %s", containerID)
	return ""
}

// TestHostLocalSymlinksInDataDir runs the built host-local through libcni on a lease
// directory with symlinks planted in it: in place of a pod's lease file (its DEL must
// succeed and remove the link, not its target), in place of podwire's index directory
// and of the lock file (dangling). Nothing outside the data dir may be created or
// changed, and nothing may be left behind but the network's own files.
func TestHostLocalSymlinksInDataDir(t *testing.T) {
	h := nstest.New(t)
	list := hostLocalList(h, "links", `"ranges":[[{"subnet":"10.87.0.0/24"}]]`)
	dir := filepath.Join(h.DataDir, list.Name)
	pod := h.NewPod()
	outside := t.TempDir()
	victim := filepath.Join(outside, "victim")
	if err := os.WriteFile(victim, []byte("victim\r\neth0"), 0o600); err != nil {
		t.Fatal(err)
	}
	rt := func(id string) *libcni.RuntimeConf { return h.RT(pod, "eth0", nstest.WithContainerID(id)) }

	// A pod's lease file replaced by a symlink.
	a := h.MustAdd(list, rt("a")).IPs[0].Address.IP.String()
	if err := os.Remove(filepath.Join(dir, a)); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(dir, a)); err != nil {
		t.Fatal(err)
	}
	if b := h.MustAdd(list, rt("b")).IPs[0].Address.IP.String(); b == a {
		t.Errorf("ADD of b got a's address %s, whose lease file is a symlink", a)
	}
	if err := h.Del(list, rt("a")); err != nil {
		code := uint(0)
		if e, ok := cniErr(err); ok {
			code = e.Code
		}
		t.Errorf("DEL of the pod whose lease file is a symlink: %v (code %d)", err, code)
	}
	if _, err := os.Lstat(filepath.Join(dir, a)); !os.IsNotExist(err) {
		t.Errorf("DEL left the symlink in place of the lease: %v", err)
	}
	h.MustDel(list, rt("b"))

	// The index directory and the lock file replaced by symlinks out of the data dir.
	if err := os.RemoveAll(filepath.Join(dir, ".podwire")); err != nil {
		t.Fatal(err)
	}
	for _, l := range [][2]string{{outside, ".podwire"}, {filepath.Join(outside, "created-lock"), "lock"}} {
		os.Remove(filepath.Join(dir, l[1]))
		if err := os.Symlink(l[0], filepath.Join(dir, l[1])); err != nil {
			t.Fatal(err)
		}
	}
	c := h.MustAdd(list, rt("c"))
	if err := h.Check(list, rt("c")); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	h.MustAdd(list, rt("d"))
	h.MustDel(list, rt("c"))
	if err := h.GC(list, nil); err != nil {
		t.Errorf("GC: %v", err)
	}
	if err := h.Status(list); err != nil {
		t.Errorf("STATUS: %v", err)
	}
	t.Logf("ADD with .podwire and lock symlinked out of the data dir: %s", resultIPs(c))

	ents, _ := os.ReadDir(outside)
	if len(ents) != 1 || ents[0].Name() != "victim" {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("files were created outside the data dir: %v", names)
	}
	if b, _ := os.ReadFile(victim); string(b) != "victim\r\neth0" {
		t.Errorf("the symlink's target was changed to %q", b)
	}
	for _, name := range []string{".podwire", "lock"} {
		if fi, err := os.Lstat(filepath.Join(dir, name)); err != nil || fi.Mode()&os.ModeSymlink != 0 {
			t.Errorf("%s is still a symlink (%v)", name, err)
		}
	}
	if got := leaseFiles(t, h, list); len(got) != 0 {
		t.Errorf("leases left after DEL and GC: %v", got)
	}
}
