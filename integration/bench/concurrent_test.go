// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/podwire/podwire/integration/nstest"
)

// burst is one round of n concurrent pods for one runner: wall times of all ADDs and
// then all DELs, and how many of each failed.
type burst struct {
	add, del         time.Duration
	addCPU, delCPU   time.Duration // user+system time of the plugin processes
	addFail, delFail int
	addEach, delEach []time.Duration // each pod's own call, start to return
	leasesLeft       int             // lease files in the network's data dir after the DELs
}

// runBurst creates n pod netns (before timing), starts n full-chain ADDs at once and
// waits for the last, then the same for their DELs, then removes the pods.
func (e *env) runBurst(r *runner, list *libcni.NetworkConfigList, n, round int) (burst, []error) {
	pods := make([]ns.NetNS, n)
	rts := make([]*libcni.RuntimeConf, n)
	for i := range pods {
		pods[i] = r.h.NewPod()
		rts[i] = &libcni.RuntimeConf{
			ContainerID:    fmt.Sprintf("conc-%s-%d-%d-%d", strings.ReplaceAll(r.label, " ", "-"), n, round, i),
			NetNS:          pods[i].Path(),
			IfName:         "eth0",
			CapabilityArgs: chainCaps(10_000 + i),
		}
	}
	defer func() {
		for _, p := range pods {
			r.h.DeletePod(p)
		}
	}()
	c := e.cni(r.set)
	var errs []error
	all := func(op func(rt *libcni.RuntimeConf) error) (time.Duration, time.Duration, int, []time.Duration) {
		start := make(chan struct{})
		res := make([]error, n)
		each := make([]time.Duration, n)
		var wg sync.WaitGroup
		for i := range rts {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				<-start
				t0 := time.Now()
				res[i] = r.h.InHost(func() error { return op(rts[i]) })
				each[i] = time.Since(t0)
			}(i)
		}
		time.Sleep(50 * time.Millisecond) // let every goroutine reach the gate
		var ru0, ru1 syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru0)
		t0 := time.Now()
		close(start)
		wg.Wait()
		wall := time.Since(t0)
		_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru1)
		cpu := time.Duration(syscall.TimevalToNsec(ru1.Utime) - syscall.TimevalToNsec(ru0.Utime) +
			syscall.TimevalToNsec(ru1.Stime) - syscall.TimevalToNsec(ru0.Stime))
		failed := 0
		for _, err := range res {
			if err != nil {
				failed++
				if len(errs) < 3 {
					errs = append(errs, err)
				}
			}
		}
		return wall, cpu, failed, each
	}
	var b burst
	b.add, b.addCPU, b.addFail, b.addEach = all(func(rt *libcni.RuntimeConf) error {
		_, err := c.AddNetworkList(ctxBG(), list, rt)
		return err
	})
	b.del, b.delCPU, b.delFail, b.delEach = all(func(rt *libcni.RuntimeConf) error { return c.DelNetworkList(ctxBG(), list, rt) })
	b.leasesLeft = leaseFiles(filepath.Join(r.h.DataDir, list.Name))
	return b, errs
}

// leaseFiles counts host-local's lease files (one per address, named by it) in dir.
func leaseFiles(dir string) int {
	ents, _ := os.ReadDir(dir)
	n := 0
	for _, e := range ents {
		if net.ParseIP(e.Name()) != nil {
			n++
		}
	}
	return n
}

func benchConcurrent(e *env, t *testing.T) {
	tbl := e.rep.section("4. Concurrent pods",
		"pods at once", "op", "floor wall s", "reference wall s", "podwire wall s (default backends)", "podwire nftables wall s",
		"podwire / reference wall", "per pod p50 / p99 ms: reference | podwire | podwire nftables", "leases left: reference / podwire / podwire nftables",
		"plugin CPU s: floor / reference / podwire / podwire nftables")
	tbl.intro = "n full-chain ADDs started at once (distinct container IDs and hostPorts, a fresh pod netns each, " +
		"made before timing), wall time until the last returns; then their n DELs the same way. " +
		"Seconds, median over the rounds (max in parentheses), and failed calls out of all calls in those rounds. " +
		"Per pod: each pod's own call through libcni, start to return, p50 / p99 over every pod of every round (the figure " +
		"other CNIs are compared by at this concurrency). Leases left: lease files in the network's data dir after the DELs, " +
		"summed over the rounds (must be 0). " +
		"The last column is the user+system time of the plugin processes of one round (median): with more pods than cores, wall time follows it. " +
		defaultBackends + " The \"podwire nftables\" column sets both of podwire's netfilter users to nftables " +
		"(bridge `ipMasqBackend`, portmap `backend`), in a host netns of its own."
	sizes := []struct{ n, rounds int }{{32, 3}, {100, 2}}
	if e.quick {
		sizes = []struct{ n, rounds int }{{32, 1}}
		tbl.note("bench-quick runs 32 pods, one round")
	}
	// Every column renders chainConf with its own backend keys; the base runners get none.
	var cols []*runner
	for _, r := range e.baseRunners() {
		c := *r
		c.subst = map[string]string{"@MASQ@": "", "@PMB@": ""}
		cols = append(cols, &c)
	}
	h := nstest.New(t)
	nft := &runner{label: "podwire nftables", set: e.ours, h: h, pod: h.NewPod(),
		subst: map[string]string{"@MASQ@": `,"ipMasqBackend":"nftables"`, "@PMB@": `,"backend":"nftables"`}}
	cols = append(cols, nft)
	floorCol, refCol, oursCol := cols[0], cols[1], cols[2]
	runners := available(tbl, cols, chainTypes...)
	if e.ours.Has(chainTypes...) {
		tbl.note("podwire's default backends here: %s", e.defaultKinds(t))
	}
	type agg struct {
		add, del, addCPU, delCPU []time.Duration
		addEach, delEach         sample
		addFail, delFail, leases int
	}
	for _, sz := range sizes {
		res := map[*runner]*agg{}
		for _, r := range runners {
			res[r] = &agg{}
		}
		for round := 0; round < sz.rounds; round++ {
			for j := range runners {
				r := runners[(round+j)%len(runners)]
				list, err := e.conflist(r, "bench", chainConf("@MASQ@", "@PMB@"))
				must(t, err, "conflist")
				b, errs := e.runBurst(r, list, sz.n, round)
				a := res[r]
				a.add, a.del = append(a.add, b.add), append(a.del, b.del)
				a.addCPU, a.delCPU = append(a.addCPU, b.addCPU), append(a.delCPU, b.delCPU)
				a.addEach, a.delEach = append(a.addEach, b.addEach...), append(a.delEach, b.delEach...)
				a.addFail += b.addFail
				a.delFail += b.delFail
				a.leases += b.leasesLeft
				for _, err := range errs {
					tbl.note("%s, %d pods, round %d: %s", r.label, sz.n, round+1, oneLine(err))
				}
				t.Logf("%s %d pods round %d: ADD %s (%d failed, CPU %s), DEL %s (%d failed, CPU %s), %d leases left", r.label, sz.n, round+1,
					b.add.Round(time.Millisecond), b.addFail, b.addCPU.Round(time.Millisecond),
					b.del.Round(time.Millisecond), b.delFail, b.delCPU.Round(time.Millisecond), b.leasesLeft)
			}
		}
		for _, op := range []string{"ADD", "DEL"} {
			pick := func(r *runner) (walls, cpus []time.Duration, each sample, fails int, ok bool) {
				a := res[r]
				if a == nil {
					return nil, nil, nil, 0, false
				}
				if op == "DEL" {
					return a.del, a.delCPU, a.delEach, a.delFail, true
				}
				return a.add, a.addCPU, a.addEach, a.addFail, true
			}
			cpuOf := func(r *runner) string {
				_, cpus, _, _, ok := pick(r)
				if !ok {
					return "n/a"
				}
				med, _ := medianMax(cpus)
				return fmt.Sprintf("%.2f", med.Seconds())
			}
			cellOf := func(r *runner) (string, time.Duration) {
				walls, _, _, fails, ok := pick(r)
				if !ok {
					return "n/a", 0
				}
				med, max := medianMax(walls)
				return fmt.Sprintf("%.2f (%.2f), %d/%d failed", med.Seconds(), max.Seconds(),
					fails, sz.n*sz.rounds), med
			}
			perPod := func(r *runner) string {
				_, _, each, _, ok := pick(r)
				if !ok || len(each) == 0 {
					return "n/a"
				}
				return fmt.Sprintf("%s / %s", ms(each.median()), ms(each.quantile(0.99)))
			}
			leases := func(r *runner) string {
				if a := res[r]; a != nil {
					return fmt.Sprint(a.leases)
				}
				return "n/a"
			}
			f, _ := cellOf(floorCol)
			rc, rm := cellOf(refCol)
			oc, om := cellOf(oursCol)
			nc, nm := cellOf(nft)
			rat := "n/a"
			if rm > 0 && om > 0 {
				rat = fmt.Sprintf("%.2f", om.Seconds()/rm.Seconds())
			}
			leaseCell := "—"
			if op == "DEL" {
				leaseCell = leases(refCol) + " / " + leases(oursCol) + " / " + leases(nft)
			}
			tbl.row(fmt.Sprintf("%d", sz.n), op, f, rc, oc, nc, rat,
				perPod(refCol)+" | "+perPod(oursCol)+" | "+perPod(nft), leaseCell,
				cpuOf(floorCol)+" / "+cpuOf(refCol)+" / "+cpuOf(oursCol)+" / "+cpuOf(nft))
			if sz.n != 32 {
				continue
			}
			// Issue 25: podwire's wall at most half the reference's, no failed call,
			// no lease left, for each podwire column.
			for _, c := range []struct {
				id string
				r  *runner
				m  time.Duration
			}{{"conc-default-", oursCol, om}, {"conc-nft-", nft, nm}} {
				a, ar := res[c.r], res[refCol]
				if a == nil || ar == nil || rm <= 0 || c.m <= 0 {
					e.target(c.id+strings.ToLower(op), "n/a", "n/a", nil)
					continue
				}
				_, _, _, fails, _ := pick(c.r)
				ours := fmt.Sprintf("%.2f (%.2f / %.2f s), %d failed, %d leases left", c.m.Seconds()/rm.Seconds(),
					c.m.Seconds(), rm.Seconds(), fails, a.leases)
				if c.r == oursCol && e.defaults != nil {
					ours += "; " + e.defaults.String()
				}
				_, _, _, rfails, _ := pick(refCol)
				ref := fmt.Sprintf("%.2f s, %d failed", rm.Seconds(), rfails)
				e.target(c.id+strings.ToLower(op), ours, ref, boolp(c.m.Seconds() <= 0.5*rm.Seconds() && fails == 0 && a.leases == 0))
			}
		}
	}
}

// medianMax returns the median (the mean of the middle two for an even count) and the
// largest of d.
func medianMax(d []time.Duration) (med, max time.Duration) {
	sorted := append([]time.Duration(nil), d...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	med = sorted[len(sorted)/2]
	if len(sorted)%2 == 0 {
		med = (sorted[len(sorted)/2-1] + med) / 2
	}
	return med, sorted[len(sorted)-1]
}
