// Package bench is `make bench`: podwire's plugins measured side by side with the
// reference plugins (containernetworking/plugins at ReferenceVersion) and a no-op floor,
// through libcni in namespaces it creates, interleaved so machine drift cancels. It
// prints one markdown table and writes BENCHMARKS.md. It asserts nothing about speed:
// the numbers are the product.
package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/podwire/podwire/integration/nstest"
)

// env is one bench run: the three sets, each with its own host netns and pod netns.
type env struct {
	t     *testing.T
	quick bool
	iters int
	floor *set
	ref   *set
	ours  *set
	exec  map[string]*rssExec
	hosts map[string]*nstest.H
	pods  map[string]ns.NetNS
	rep   *report
}

func TestBench(t *testing.T) {
	mode := os.Getenv("PODWIRE_BENCH")
	if mode == "" {
		t.Skip("benchmarks run only through `make bench` (PODWIRE_BENCH=full) or `make bench-quick` (PODWIRE_BENCH=quick)")
	}
	nstest.RequireRoot(t)
	e := &env{t: t, quick: mode == "quick", iters: 25, exec: map[string]*rssExec{},
		hosts: map[string]*nstest.H{}, pods: map[string]ns.NetNS{}, rep: newReport()}
	if e.quick {
		e.iters = 8
	}
	e.floor, e.ref, e.ours = floorSet(t), referenceSet(t), ourSet(t)
	for _, s := range e.sets() {
		e.exec[s.Name] = newRSSExec()
		h := nstest.New(t)
		e.hosts[s.Name] = h
		e.pods[s.Name] = h.NewPod()
	}
	start := time.Now()
	for _, sec := range sections {
		if e.quick && !sec.quick {
			continue
		}
		e.rep.section(sec.name)
		t.Run(sec.name, func(t *testing.T) { sec.run(e) })
	}
	e.sizes()
	header := fmt.Sprintf("# podwire benchmarks\n\nRun on %s, %s, %d cores (%s), mode %s, %d iterations per cell, in %s.\n"+
		"Sets: **floor** (a no-op Go plugin under every name: the cost of starting the same processes), "+
		"**reference** (containernetworking/plugins %s, `go install`ed from the module proxy), **podwire** (this tree).\n"+
		"Times are wall-clock milliseconds through libcni, median / p95, sets interleaved A B C A B C.\n",
		time.Now().UTC().Format("2006-01-02"), hostDesc(), runtime.NumCPU(), runtime.GOARCH, mode, e.iters,
		time.Since(start).Round(time.Second), ReferenceVersion)
	md := e.rep.markdown(header)
	fmt.Println(md)
	root, _ := nstest.RepoRoot()
	out := filepath.Join(root, "BENCHMARKS.md")
	if p := os.Getenv("PODWIRE_BENCH_OUT"); p != "" {
		out = p
	}
	if err := os.WriteFile(out, []byte(md), 0o644); err != nil {
		t.Errorf("writing %s: %v", out, err)
	}
}

func (e *env) sets() []*set { return []*set{e.floor, e.ref, e.ours} }

func hostDesc() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	model := "unknown CPU"
	if err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				model = strings.TrimSpace(strings.SplitN(l, ":", 2)[1])
				break
			}
		}
	}
	var u [65]byte
	if rel, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		copy(u[:], rel)
	}
	return fmt.Sprintf("Linux %s, %s", strings.TrimSpace(string(u[:])), model)
}

// cni returns a libcni client for set s using the RSS-recording executor.
func (e *env) cni(s *set) *libcni.CNIConfig {
	return libcni.NewCNIConfigWithCacheDir([]string{s.Dir}, e.t.TempDir(), e.exec[s.Name])
}

// pair is one timed ADD and its DEL.
type pair struct{ add, del sample }

// interleave runs one ADD+DEL per set per round, rotating which set goes first, for
// iters rounds, and returns each set's samples. f performs and times one ADD+DEL.
func (e *env) interleave(sets []*set, iters int, f func(s *set, i int) (add, del time.Duration, err error)) map[string]*pair {
	out := map[string]*pair{}
	for _, s := range sets {
		out[s.Name] = &pair{}
	}
	for i := 0; i < iters; i++ {
		for j := range sets {
			s := sets[(i+j)%len(sets)]
			a, d, err := f(s, i)
			if err != nil {
				e.t.Errorf("%s round %d: %v", s.Name, i, err)
				e.rep.note("%s failed in round %d: %v", s.Name, i, err)
				return out
			}
			out[s.Name].add = append(out[s.Name].add, a)
			out[s.Name].del = append(out[s.Name].del, d)
		}
	}
	return out
}

// addDel times ADD then DEL of list for the set's pod, in the set's host netns.
func (e *env) addDel(s *set, list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) (add, del time.Duration, err error) {
	h := e.hosts[s.Name]
	c := e.cni(s)
	err = h.InHost(func() error {
		t0 := time.Now()
		if _, err := c.AddNetworkList(ctxBG(), list, rt); err != nil {
			return fmt.Errorf("ADD: %w", err)
		}
		add = time.Since(t0)
		t0 = time.Now()
		if err := c.DelNetworkList(ctxBG(), list, rt); err != nil {
			return fmt.Errorf("DEL: %w", err)
		}
		del = time.Since(t0)
		return nil
	})
	return add, del, err
}

// conflist renders a conflist template for set s: @DATADIR@ is the set's data dir,
// @NAME@ a network name.
func (e *env) conflist(s *set, name, text string) *libcni.NetworkConfigList {
	text = strings.ReplaceAll(text, "@DATADIR@", e.hosts[s.Name].DataDir)
	text = strings.ReplaceAll(text, "@NAME@", name)
	l, err := libcni.NetworkConfFromBytes([]byte(text))
	must(e.t, err, "conflist %s", name)
	return l
}

func (e *env) rt(s *set, ifName string, i int, caps map[string]any) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{
		ContainerID:    fmt.Sprintf("bench-%s-%d", s.Name, i),
		NetNS:          e.pods[s.Name].Path(),
		IfName:         ifName,
		CapabilityArgs: caps,
	}
}

// available returns the sets that ship all of types, noting the ones that do not.
func (e *env) available(bench string, types ...string) []*set {
	var out []*set
	for _, s := range e.sets() {
		if s.Has(types...) {
			out = append(out, s)
		} else {
			e.rep.note("%s: %s does not ship %s yet; its column is n/a", bench, s.Name, strings.Join(types, "+"))
		}
	}
	return out
}

// timed runs an interleaved ADD/DEL benchmark of one conflist and adds two rows.
func (e *env) timed(bench, text, ifName string, caps func(i int) map[string]any, types ...string) {
	sets := e.available(bench, types...)
	res := e.interleave(sets, e.iters, func(s *set, i int) (time.Duration, time.Duration, error) {
		var c map[string]any
		if caps != nil {
			c = caps(i)
		}
		return e.addDel(s, e.conflist(s, "bench", text), e.rt(s, ifName, i, c))
	})
	get := func(s *set, del bool) sample {
		p := res[s.Name]
		if p == nil {
			return nil
		}
		if del {
			return p.del
		}
		return p.add
	}
	e.rep.timingRow(bench+" ADD", get(e.floor, false), get(e.ref, false), get(e.ours, false))
	e.rep.timingRow(bench+" DEL", get(e.floor, true), get(e.ref, true), get(e.ours, true))
}

// sizes adds binary sizes and peak RSS per plugin.
func (e *env) sizes() {
	e.rep.section("Binary size and peak RSS per plugin")
	e.rep.row("plugin", "reference size", "podwire size", "reference peak RSS", "podwire peak RSS")
	e.rep.row("---", "---", "---", "---", "---")
	for _, p := range pluginTypes {
		size := func(s *set) string {
			fi, err := os.Stat(filepath.Join(s.Dir, p))
			if err != nil {
				return "n/a"
			}
			return fmt.Sprintf("%.1f MiB", float64(fi.Size())/(1<<20))
		}
		rss := func(s *set) string {
			if k := e.exec[s.Name].peak[p]; k > 0 {
				return fmt.Sprintf("%.1f MiB", float64(k)/1024)
			}
			return "n/a"
		}
		e.rep.row(p, size(e.ref), size(e.ours), rss(e.ref), rss(e.ours))
	}
}
