// SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/google/go-cmp/cmp"

	"github.com/podwire/podwire/pkg/link"
)

// TestStateWalk runs ADD, ADD again, DEL, CHECK and GC in random order on a few
// attachments, with pod namespaces vanishing or being unmounted under live pods and
// ADDs failing at random steps, on the fakes, for both ipMasq backends. After every
// call each live pod passes CHECK and holds its own lease; at the end, DEL of
// everything brings the node back to exactly the state it had before the first pod.
func TestStateWalk(t *testing.T) {
	for _, backend := range []string{"nftables", "iptables"} {
		for seed := uint64(1); seed <= 25; seed++ {
			t.Run(fmt.Sprintf("%s/seed%d", backend, seed), func(t *testing.T) { walk(t, backend, seed) })
		}
	}
}

// failures are the steps a walk makes an ADD fail at.
var failures = []func(w *world, err error){
	func(w *world, err error) { w.links.FailNext("CreateVeth", err) },
	func(w *world, err error) { w.links.FailNext("ConfigurePod", err) },
	func(w *world, err error) { w.links.FailNext("ConfigureHost", err) },
	func(w *world, err error) { w.ipam.fail = err },
	func(w *world, err error) { w.kernel.FailNext("flush", err) },
}

func walk(t *testing.T, backend string, seed uint64) {
	conf := `,"isGateway":true,"ipMasq":true,"ipMasqBackend":"` + backend + `","macspoofchk":true,"ipam":{"type":"host-local"}`
	rng := rand.New(rand.NewPCG(seed, 15))
	w := newWorld(t, rng.IntN(2) == 0)
	before := settled(t, w, conf)
	const pods = 5
	type att struct {
		id, netns string
		res       *current.Result // nil: not added
		dead      bool            // its netns vanished or was unmounted; waits for DEL
		gen       int
	}
	atts := make([]*att, pods)
	for i := range atts {
		atts[i] = &att{id: fmt.Sprintf("c%d", i)}
	}
	var log []string
	fail := func(format string, a ...any) {
		t.Fatalf("after %s:\n"+format, append([]any{strings.Join(log, ", ")}, a...)...)
	}
	boom := errors.New("injected")
	for step := 0; step < 150; step++ {
		a := atts[rng.IntN(pods)]
		switch op := rng.IntN(9); {
		case a.res == nil && op < 5:
			a.gen++
			a.netns = fmt.Sprintf("/%s-%d", a.id, a.gen)
			w.links.AddNetns(a.netns, rng.IntN(3) == 0)
			if op == 0 {
				log = append(log, "failing ADD "+a.id)
				failures[rng.IntN(len(failures))](w, boom)
				if _, err := w.add(conf, a.id, a.netns); !errors.Is(err, boom) {
					fail("the failing ADD of %s returned %v", a.id, err)
				}
				w.links.RemoveNetns(a.netns)
				break
			}
			log = append(log, "ADD "+a.id)
			r, err := w.add(conf, a.id, a.netns)
			if err != nil {
				fail("ADD of %s: %v", a.id, err)
			}
			a.res = r
		case a.res != nil && !a.dead && op < 2:
			log = append(log, "ADD again "+a.id)
			st := w.state()
			if _, err := w.add(conf, a.id, a.netns); !link.IsExists(err) {
				fail("repeated ADD of %s = %v", a.id, err)
			}
			if d := cmp.Diff(st, w.state()); d != "" {
				fail("the repeated ADD of %s changed the node:\n%s", a.id, d)
			}
		case a.res != nil && !a.dead && op == 2:
			log = append(log, "netns of "+a.id+" vanishes")
			w.links.RemoveNetns(a.netns)
			a.dead = true
		case a.res != nil && !a.dead && op == 3:
			log = append(log, "netns of "+a.id+" unmounted")
			w.links.UnmountNetns(a.netns)
			a.dead = true
		case op == 4:
			var keep []string
			for _, o := range atts {
				if o.res != nil && !o.dead {
					keep = append(keep, o.id)
				}
			}
			log = append(log, fmt.Sprintf("GC keeping %v", keep))
			if err := w.gc(conf, keep...); err != nil {
				fail("GC: %v", err)
			}
			for _, o := range atts {
				if o.res != nil && !slices.Contains(keep, o.id) {
					o.res, o.dead = nil, false // GC took the rules and lease; DEL is due
					if err := w.del(conf, o.id, o.netns, nil); err != nil {
						fail("DEL of %s after GC: %v", o.id, err)
					}
					w.links.RemoveNetns(o.netns)
				}
			}
		default:
			log = append(log, "DEL "+a.id)
			for i := 0; i < 1+rng.IntN(2); i++ {
				if err := w.del(conf, a.id, a.netns, a.res); err != nil {
					fail("DEL of %s: %v", a.id, err)
				}
			}
			w.links.RemoveNetns(a.netns)
			a.res, a.dead = nil, false
		}
		seen := map[string]string{}
		for _, o := range atts {
			if o.res == nil || o.dead {
				continue
			}
			addr := o.res.IPs[0].Address.IP.String()
			if other, dup := seen[addr]; dup {
				fail("%s and %s both hold %s", other, o.id, addr)
			}
			seen[addr] = o.id
			if h := w.ipam.holder(addr); h != o.id+"/eth0" {
				fail("the lease of %s's %s is held by %q", o.id, addr, h)
			}
			if err := w.check(conf, o.id, o.netns, o.res); err != nil {
				fail("CHECK of live %s: %v", o.id, err)
			}
		}
	}
	for _, a := range atts {
		if a.res != nil {
			if err := w.del(conf, a.id, a.netns, a.res); err != nil {
				fail("final DEL of %s: %v", a.id, err)
			}
			w.links.RemoveNetns(a.netns)
		}
	}
	if d := cmp.Diff(before, w.state()); d != "" {
		fail("the node did not come back (-before +after):\n%s", d)
	}
}
