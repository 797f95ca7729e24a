// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/podwire/podwire/integration/nstest"
)

// TestBridgeLatency compares bridge+host-local builds at the level a runtime sees: ADD
// and DEL of one pod through libcni, each build in its own host netns, rounds
// interleaved so machine drift cancels. It runs only when PODWIRE_LATENCY names the
// builds as label=bindir,... (e.g. two commits built with `make build`); it asserts
// nothing.
func TestBridgeLatency(t *testing.T) {
	spec := os.Getenv("PODWIRE_LATENCY")
	if spec == "" {
		t.Skip("set PODWIRE_LATENCY=label=bindir,label=bindir to compare builds")
	}
	rounds := 60
	if n, err := strconv.Atoi(os.Getenv("PODWIRE_LATENCY_ROUNDS")); err == nil && n > 0 {
		rounds = n
	}
	type build struct {
		label    string
		h        *nstest.H
		cni      *libcni.CNIConfig
		list     *libcni.NetworkConfigList
		add, del []time.Duration
	}
	var builds []*build
	for _, kv := range strings.Split(spec, ",") {
		label, dir, _ := strings.Cut(kv, "=")
		h := nstest.New(t)
		b := &build{label: label, h: h,
			cni:  libcni.NewCNIConfigWithCacheDir([]string{dir}, filepath.Join(t.TempDir(), "cache"), nil),
			list: bridgeConf(h, `"isGateway":true,"isDefaultGateway":true,"ipMasq":true,"ipMasqBackend":"nftables"`, `[[{"subnet":"10.38.0.0/16"}]]`)}
		builds = append(builds, b)
	}
	for r := -3; r < rounds; r++ { // three warm-up rounds
		for _, b := range builds {
			p := b.h.NewPod()
			rt := b.h.RT(p, "eth0")
			start := time.Now()
			if _, err := b.h.AddWith(b.cni, b.list, rt); err != nil {
				t.Fatalf("%s ADD: %v", b.label, err)
			}
			add := time.Since(start)
			start = time.Now()
			if err := b.h.DelWith(b.cni, b.list, rt); err != nil {
				t.Fatalf("%s DEL: %v", b.label, err)
			}
			if r >= 0 {
				b.add, b.del = append(b.add, add), append(b.del, time.Since(start))
			}
			b.h.DeletePod(p)
		}
	}
	q := func(d []time.Duration, f float64) string {
		s := slices.Clone(d)
		slices.Sort(s)
		return fmt.Sprintf("%.2f", float64(s[int(f*float64(len(s)-1))].Microseconds())/1000)
	}
	t.Logf("%d rounds; ms: median (p10-p90)", rounds)
	for _, b := range builds {
		t.Logf("%-12s ADD %s (%s-%s)  DEL %s (%s-%s)", b.label, q(b.add, .5), q(b.add, .1), q(b.add, .9), q(b.del, .5), q(b.del, .1), q(b.del, .9))
	}
}
