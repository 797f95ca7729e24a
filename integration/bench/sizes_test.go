// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"golang.org/x/sys/unix"
)

// rssPass runs each plugin of set s a few times, untimed, through rsswrap, and returns
// the peak RSS per plugin name (KiB). host-local is also run on section 5's data dir
// with 10,000 leases, recorded as "host-local@10k".
func (e *env) rssPass(t *testing.T, s *set) map[string]int64 {
	r := e.base[s.Name]
	x := newRSSExec(e.rsswrap)
	c := libcni.NewCNIConfigWithCacheDir([]string{s.Dir, e.helpers}, t.TempDir(), x)
	run := func(what, text, ifName string, caps map[string]any, subst map[string]string) {
		rr := *r
		rr.subst = subst
		list, err := e.conflist(&rr, "bench", text)
		must(t, err, "conflist")
		for i := 0; i < 3; i++ {
			rt := rtFor(&rr, fmt.Sprintf("rss-%d", i), ifName, caps)
			err := r.h.InHost(func() error {
				if _, err := c.AddNetworkList(ctxBG(), list, rt); err != nil {
					_ = c.DelNetworkList(ctxBG(), list, rt)
					return fmt.Errorf("ADD: %w", err)
				}
				return c.DelNetworkList(ctxBG(), list, rt)
			})
			if err != nil {
				t.Errorf("RSS pass, %s %s: %v", s.Name, what, err)
				return
			}
		}
	}
	out := map[string]int64{}
	if s.Has(chainTypes...) {
		run("full chain", chainConf("", ""), "eth0", chainCaps(0), nil)
	}
	if s.Has("loopback") {
		run("loopback", `{"cniVersion":"1.1.0","name":"@NAME@","plugins":[{"type":"loopback"}]}`, "lo", nil, nil)
	}
	if s.Has("host-local") {
		run("host-local", leaseConf, "eth0", nil, map[string]string{"@LEASEDIR@": t.TempDir()})
		for _, p := range pluginTypes {
			out[p] = x.peakOf(p)
		}
		if dir := e.leaseDirs[s.Name]; dir != "" {
			x.mu.Lock()
			delete(x.peak, "host-local")
			x.mu.Unlock()
			run("host-local with 10,000 leases", leaseConf, "eth0", nil, map[string]string{"@LEASEDIR@": dir})
			out["host-local@10k"] = x.peakOf("host-local")
		}
	}
	for _, p := range pluginTypes {
		if out[p] == 0 {
			out[p] = x.peakOf(p)
		}
	}
	return out
}

// sizes adds binary sizes and peak RSS per plugin.
func (e *env) sizes(t *testing.T) {
	tbl := e.rep.section("7. Binary size and peak RSS per plugin",
		"plugin", "floor (no-op) size", "reference size", "podwire size", "floor peak RSS", "reference peak RSS", "podwire peak RSS")
	tbl.intro = "Sizes are the stripped binaries (`-s -w`, `-trimpath`) as run. Peak RSS is the largest `ru_maxrss` over " +
		"an untimed pass (three ADD/DEL each of the full chain, loopback and host-local alone, and host-local on section 5's " +
		"10,000 leases) with every plugin started through a small launcher (integration/bench/rsswrap), because a " +
		"child of the big test process inherits its parent's peak in `ru_maxrss`. bridge's figure covers its host-local " +
		"child."
	rss := map[string]map[string]int64{}
	for _, s := range e.sets() {
		rss[s.Name] = e.rssPass(t, s)
	}
	if kib := launcherFloor(e.rsswrap); kib > 0 {
		tbl.note("the launcher alone (running /bin/true) reports %.1f MiB: no figure can be below that", float64(kib)/1024)
	}
	rows := append(append([]string(nil), pluginTypes...), "host-local@10k")
	for _, p := range rows {
		bin := strings.TrimSuffix(p, "@10k")
		size := func(s *set) string {
			if bin != p {
				return "—"
			}
			fi, err := os.Stat(filepath.Join(s.Dir, bin))
			if err != nil {
				return "n/a"
			}
			return fmt.Sprintf("%.1f MiB", float64(fi.Size())/(1<<20))
		}
		peak := func(s *set) string {
			if k := rss[s.Name][p]; k > 0 {
				return fmt.Sprintf("%.1f MiB", float64(k)/1024)
			}
			return "n/a"
		}
		name := p
		if bin != p {
			name = "host-local, 10,000 leases"
			if e.leaseDirs[e.ours.Name] == "" {
				continue
			}
		}
		tbl.row(name, size(e.floor), size(e.ref), size(e.ours), peak(e.floor), peak(e.ref), peak(e.ours))
	}
}

// launcherFloor is rsswrap's own contribution: the peak RSS it reports for /bin/true.
func launcherFloor(wrap string) int64 {
	x := newRSSExec(wrap)
	kib, _, _, err := x.run(context.Background(), "/bin/true", nil, nil)
	if err != nil {
		return 0
	}
	return kib
}

// loadSampler records the machine's 1-minute load average and whether other sessions
// were compiling Go while the bench ran, so BENCHMARKS.md can say how quiet it was.
type loadSampler struct {
	mu        sync.Mutex
	loads     []float64
	compiling int
	done      chan struct{}
	wg        sync.WaitGroup
}

func startLoadSampler() *loadSampler {
	l := &loadSampler{done: make(chan struct{})}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		tick := time.NewTicker(5 * time.Second)
		defer tick.Stop()
		for {
			l.sample()
			select {
			case <-l.done:
				return
			case <-tick.C:
			}
		}
	}()
	return l
}

func (l *loadSampler) sample() {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return
	}
	others := foreignCompilers()
	l.mu.Lock()
	l.loads = append(l.loads, v)
	if others > 0 {
		l.compiling++
	}
	l.mu.Unlock()
}

// foreignCompilers counts Go compiler and linker processes outside this process's
// session: other engineers' builds and tests.
func foreignCompilers() int {
	self, err := unix.Getsid(0)
	if err != nil {
		return 0
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	n := 0
	for _, ent := range ents {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(filepath.Join("/proc", ent.Name(), "comm"))
		if err != nil {
			continue
		}
		switch strings.TrimSpace(string(comm)) {
		case "compile", "link", "asm", "cgo", "vet":
		default:
			continue
		}
		if sid, err := unix.Getsid(pid); err == nil && sid != self {
			n++
		}
	}
	return n
}

func (l *loadSampler) stop() string {
	close(l.done)
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.loads) == 0 {
		return "not sampled"
	}
	s := append([]float64(nil), l.loads...)
	sort.Float64s(s)
	return fmt.Sprintf("min %.2f, median %.2f, max %.2f over %d samples every 5 s; another session's Go compiler was running in %d of them",
		s[0], s[len(s)/2], s[len(s)-1], len(s), l.compiling)
}
