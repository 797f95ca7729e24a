// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"fmt"
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
	all := func(op func(rt *libcni.RuntimeConf) error) (time.Duration, time.Duration, int) {
		start := make(chan struct{})
		res := make([]error, n)
		var wg sync.WaitGroup
		for i := range rts {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				<-start
				res[i] = r.h.InHost(func() error { return op(rts[i]) })
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
		return wall, cpu, failed
	}
	var b burst
	b.add, b.addCPU, b.addFail = all(func(rt *libcni.RuntimeConf) error {
		_, err := c.AddNetworkList(ctxBG(), list, rt)
		return err
	})
	b.del, b.delCPU, b.delFail = all(func(rt *libcni.RuntimeConf) error { return c.DelNetworkList(ctxBG(), list, rt) })
	return b, errs
}

func benchConcurrent(e *env, t *testing.T) {
	tbl := e.rep.section("4. Concurrent pods",
		"pods at once", "op", "floor wall s", "reference wall s", "podwire wall s (default backends)", "podwire nftables wall s", "reference / podwire",
		"plugin CPU s: floor / reference / podwire / podwire nftables")
	tbl.intro = "n full-chain ADDs started at once (distinct container IDs and hostPorts, a fresh pod netns each, " +
		"made before timing), wall time until the last returns; then their n DELs the same way. " +
		"Seconds, median over the rounds (max in parentheses), and failed calls out of all calls in those rounds. " +
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
		addFail, delFail         int
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
				a.addFail += b.addFail
				a.delFail += b.delFail
				for _, err := range errs {
					tbl.note("%s, %d pods, round %d: %s", r.label, sz.n, round+1, oneLine(err))
				}
				t.Logf("%s %d pods round %d: ADD %s (%d failed, CPU %s), DEL %s (%d failed, CPU %s)", r.label, sz.n, round+1,
					b.add.Round(time.Millisecond), b.addFail, b.addCPU.Round(time.Millisecond),
					b.del.Round(time.Millisecond), b.delFail, b.delCPU.Round(time.Millisecond))
			}
		}
		for _, op := range []string{"ADD", "DEL"} {
			cpuOf := func(r *runner) string {
				a := res[r]
				if a == nil {
					return "n/a"
				}
				cpus := a.addCPU
				if op == "DEL" {
					cpus = a.delCPU
				}
				med, _ := medianMax(cpus)
				return fmt.Sprintf("%.2f", med.Seconds())
			}
			cellOf := func(r *runner) (string, time.Duration) {
				a := res[r]
				if a == nil {
					return "n/a", 0
				}
				walls, fails := a.add, a.addFail
				if op == "DEL" {
					walls, fails = a.del, a.delFail
				}
				med, max := medianMax(walls)
				return fmt.Sprintf("%.2f (%.2f), %d/%d failed", med.Seconds(), max.Seconds(),
					fails, sz.n*sz.rounds), med
			}
			f, fm := cellOf(floorCol)
			rc, rm := cellOf(refCol)
			oc, om := cellOf(oursCol)
			nc, nm := cellOf(nft)
			rat := "n/a"
			if rm > 0 && om > 0 {
				rat = fmt.Sprintf("%.1f×", rm.Seconds()/om.Seconds())
			}
			tbl.row(fmt.Sprintf("%d", sz.n), op, f, rc, oc, nc, rat,
				cpuOf(floorCol)+" / "+cpuOf(refCol)+" / "+cpuOf(oursCol)+" / "+cpuOf(nft))
			if sz.n == 32 {
				verdict := func(m time.Duration) *bool {
					if m <= 0 || fm <= 0 {
						return nil
					}
					return boolp(m.Seconds() <= 1.5*fm.Seconds())
				}
				refCell := "n/a"
				if rm > 0 && fm > 0 {
					refCell = fmt.Sprintf("%.2f×", rm.Seconds()/fm.Seconds())
				}
				id := strings.ToLower(op)
				ours := timesFloor(om.Seconds(), fm.Seconds())
				if e.defaults != nil && om > 0 {
					ours += "; " + e.defaults.String()
				}
				e.target("conc-default-"+id, ours, refCell, verdict(om))
				e.target("conc-nft-"+id, timesFloor(nm.Seconds(), fm.Seconds()), "—", verdict(nm))
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
