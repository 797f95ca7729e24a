// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/tc"
)

// counting wraps a Backend and counts calls, to prove "no request, no netlink work".
type counting struct {
	tc.Backend
	calls int
}

func (c *counting) Apply(ctx context.Context, p tc.Plan) error {
	c.calls++
	return c.Backend.Apply(ctx, p)
}
func (c *counting) Observe(ctx context.Context, d, i string) (tc.State, error) {
	c.calls++
	return c.Backend.Observe(ctx, d, i)
}
func (c *counting) Remove(ctx context.Context, r tc.Removal) error {
	c.calls++
	return c.Backend.Remove(ctx, r)
}
func (c *counting) IFBs(ctx context.Context) ([]tc.IFB, error) { c.calls++; return c.Backend.IFBs(ctx) }

// world is a fake node: pods are netns paths mapping interface names to host veths.
type world struct {
	fake    *tc.Fake
	count   *counting
	s       *shaper
	veths   map[string]string // "netns/ifname" -> host veth
	lookups int
}

func newWorld() *world {
	w := &world{fake: tc.NewFake(), veths: map[string]string{}}
	w.count = &counting{Backend: w.fake}
	w.s = &shaper{tc: w.count, probe: func(context.Context) error { return nil }}
	w.s.hostVeth = func(netns, ifName string) (string, int, error) {
		w.lookups++
		v, ok := w.veths[netns+"/"+ifName]
		if !ok {
			return "", 0, errGone
		}
		return v, 1500, nil
	}
	return w
}

func (w *world) pod(netns, ifName, veth string) {
	w.veths[netns+"/"+ifName] = veth
	w.fake.AddLink(veth, "veth", 1500)
}

func input(cmd, netns, ifName, bw string) *cniplumb.Input {
	conf := `{"cniVersion":"1.0.0","name":"net","type":"bandwidth"`
	if bw != "" {
		conf += `,"runtimeConfig":{"bandwidth":` + bw + `}`
	}
	conf += `}`
	in := &cniplumb.Input{Command: cmd, ContainerID: "c-" + netns, Netns: "/run/netns/" + netns, IfName: ifName, Stdin: []byte(conf)}
	_ = json.Unmarshal(in.Stdin, &in.Conf)
	in.PrevResult = &current.Result{CNIVersion: "1.0.0", Interfaces: []*current.Interface{
		{Name: "veth-" + netns, Mac: "02:00:00:00:00:01"},
		{Name: ifName, Mac: "02:00:00:00:00:02", Sandbox: in.Netns},
	}}
	in.Prev = in.PrevResult // as parsed at 1.0.0 (cniplumb sets both)
	return in
}

const bw10 = `{"ingressRate":10000000,"ingressBurst":4294967295,"egressRate":10000000,"egressBurst":4294967295}`

func TestVerbsLifecycle(t *testing.T) {
	ctx := context.Background()
	w := newWorld()
	w.pod("/run/netns/p1", "eth0", "veth1")
	initial := w.fake.Dump()

	res, err := w.s.add(ctx, input("ADD", "p1", "eth0", bw10))
	if err != nil {
		t.Fatal(err)
	}
	ifb := referenceIFBName("net", "c-p1") // the first interface of a pod gets the reference's name
	r := res.(*current.Result)
	if len(r.Interfaces) != 3 || r.Interfaces[2].Name != ifb || r.Interfaces[2].Sandbox != "" || r.Interfaces[2].Mac == "" {
		t.Errorf("result interfaces: %+v", r.Interfaces)
	}
	want := strings.ReplaceAll(`IFB ifb mtu 1500 up alias "podwire:net/c-p1/eth0 dev=veth1" root tbf rate 10000000bit burst 62500B (buffer 781250 ticks) limit 25000B peakrate 20000000bit
veth1 veth mtu 1500 up root tbf rate 10000000bit burst 62500B (buffer 781250 ticks) limit 25000B peakrate 20000000bit clsact [pref 65000 -> IFB]`, "IFB", ifb)
	if got := w.fake.Dump(); got != want {
		t.Errorf("after ADD:\n%s\nwant:\n%s", got, want)
	}
	if err := w.s.check(ctx, input("CHECK", "p1", "eth0", bw10)); err != nil {
		t.Errorf("CHECK after ADD: %v", err)
	}
	// CHECK with another rate than ADD's fails and names the difference.
	err = w.s.check(ctx, input("CHECK", "p1", "eth0", `{"egressRate":20000000}`))
	if err == nil || !strings.Contains(err.Error(), "rate 20000000bit") || !strings.Contains(err.Error(), "no ingress shaping is requested") {
		t.Errorf("CHECK with a different request: %v", err)
	}

	for i := range 2 { // DEL is repeatable
		if err := w.s.del(ctx, input("DEL", "p1", "eth0", bw10)); err != nil {
			t.Fatalf("DEL %d: %v", i, err)
		}
		if got := w.fake.Dump(); got != initial {
			t.Fatalf("after DEL %d:\n%s\nwant:\n%s", i, got, initial)
		}
	}
	if err := w.s.check(ctx, input("CHECK", "p1", "eth0", bw10)); err == nil {
		t.Error("CHECK after DEL passed")
	}
}

// TestVerbsNoRequest: without a bandwidth request ADD and CHECK do no backend or veth
// work at all, and DEL only looks for a leftover IFB by name.
func TestVerbsNoRequest(t *testing.T) {
	ctx := context.Background()
	w := newWorld()
	w.pod("/run/netns/p1", "eth0", "veth1")
	for _, bw := range []string{"", `{}`, `{"ingressRate":0,"egressRate":0}`} {
		in := input("ADD", "p1", "eth0", bw)
		res, err := w.s.add(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		if res.(*current.Result) != in.PrevResult {
			t.Error("ADD without a request did not pass prevResult through")
		}
		if err := w.s.check(ctx, input("CHECK", "p1", "eth0", bw)); err != nil {
			t.Fatal(err)
		}
	}
	if w.count.calls != 0 || w.lookups != 0 {
		t.Errorf("ADD/CHECK without a request made %d backend calls and %d veth lookups", w.count.calls, w.lookups)
	}
	if err := w.s.del(ctx, input("DEL", "p1", "eth0", "")); err != nil {
		t.Fatal(err)
	}
	if w.lookups != 0 {
		t.Errorf("DEL without a request and without an IFB looked up the veth")
	}
}

func TestVerbsErrors(t *testing.T) {
	ctx := context.Background()
	w := newWorld()
	w.pod("/run/netns/p1", "eth0", "veth1")
	initial := w.fake.Dump()

	_, err := w.s.add(ctx, input("ADD", "p1", "eth0", `{"ingressRate":-5}`))
	if cniplumb.Code(err) != cniplumb.CodeInvalidConfig {
		t.Errorf("negative rate: %v", err)
	}
	in := input("ADD", "p1", "eth0", bw10)
	in.PrevResult, in.Prev = nil, nil
	if _, err := w.s.add(ctx, in); cniplumb.Code(err) != cniplumb.CodeInvalidConfig {
		t.Errorf("without prevResult: %v", err)
	}
	if _, err := w.s.add(ctx, input("ADD", "p1", "net9", bw10)); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("missing pod interface: %v", err)
	}
	// A failing step rolls the whole ADD back.
	w.fake.FailOn = "add redirect"
	if _, err := w.s.add(ctx, input("ADD", "p1", "eth0", bw10)); err == nil {
		t.Error("ADD with an injected failure passed")
	}
	w.fake.FailOn = ""
	// A foreign root qdisc fails ingress shaping without touching anything.
	w.fake.SetForeign("veth1", "htb 1:", "", 0)
	foreign := w.fake.Dump()
	if _, err := w.s.add(ctx, input("ADD", "p1", "eth0", bw10)); err == nil || !strings.Contains(err.Error(), "htb 1:") {
		t.Errorf("ADD over a foreign root: %v", err)
	}
	if got := w.fake.Dump(); got != foreign {
		t.Errorf("failed ADD changed state:\n%s", got)
	}
	// DEL after the rejected ADDs, even with the bad config, succeeds.
	if err := w.s.del(ctx, input("DEL", "p1", "eth0", `{"ingressRate":-5}`)); err != nil {
		t.Errorf("DEL with a rejected config: %v", err)
	}
	w.fake.SetForeign("veth1", "", "", 0)
	if got := w.fake.Dump(); got != initial {
		t.Errorf("state after failures:\n%s\nwant:\n%s", got, initial)
	}
	// STATUS maps a probe failure to code 50.
	w.s.probe = func(context.Context) error { return errors.New("no IFB") }
	if err := w.s.status(ctx, nil); cniplumb.Code(err) != cniplumb.CodeNotAvailable {
		t.Errorf("STATUS: %v", err)
	}
}

// TestVerbsStateWalk runs ADD, CHECK, DEL and GC for several attachments (two of them
// interfaces of one pod, one pod next to another tc user) in random order, checking after
// each step that CHECK agrees with what was added, and that deleting everything
// returns the fake node to exactly its initial state.
func TestVerbsStateWalk(t *testing.T) {
	ctx := context.Background()
	type att struct{ netns, ifName, veth string }
	atts := []att{{"p1", "eth0", "veth1"}, {"p1", "net1", "veth2"}, {"p2", "eth0", "veth3"}, {"p3", "eth0", "veth4"}}
	requests := []string{bw10, `{"egressRate":100000000}`, `{"ingressRate":5000000,"ingressBurst":0}`, ""}
	for seed := range uint64(50) {
		w := newWorld()
		for _, a := range atts {
			w.pod("/run/netns/"+a.netns, a.ifName, a.veth)
		}
		w.fake.SetForeign("veth4", "", "clsact", 2) // an eBPF agent's filters
		initial := w.fake.Dump()
		r := rand.New(rand.NewPCG(seed, 7))
		added := map[int]string{}
		for step := range 40 {
			i := r.IntN(len(atts))
			a := atts[i]
			where := fmt.Sprintf("seed %d step %d %s/%s", seed, step, a.netns, a.ifName)
			switch r.IntN(4) {
			case 0:
				// A runtime DELs before it ADDs an attachment again; a repeated ADD (a
				// retry) carries the same request.
				bw, again := added[i]
				if !again {
					bw = requests[r.IntN(len(requests))]
				}
				if _, err := w.s.add(ctx, input("ADD", a.netns, a.ifName, bw)); err != nil {
					t.Fatalf("%s ADD: %v", where, err)
				}
				added[i] = bw
			case 1:
				if err := w.s.del(ctx, input("DEL", a.netns, a.ifName, added[i])); err != nil {
					t.Fatalf("%s DEL: %v", where, err)
				}
				delete(added, i)
			case 2:
				var valid []types.GCAttachment
				for j := range added {
					if r.IntN(3) > 0 {
						valid = append(valid, types.GCAttachment{ContainerID: "c-" + atts[j].netns, IfName: atts[j].ifName})
					}
				}
				in := input("GC", "", "", "")
				in.ValidAttachments = cniplumb.Owners{}
				for _, v := range valid {
					in.ValidAttachments[cniplumb.Owner{Network: "net", ContainerID: v.ContainerID, IfName: v.IfName}] = true
				}
				if err := w.s.gc(ctx, in); err != nil {
					t.Fatalf("%s GC: %v", where, err)
				}
				// GC only removes IFBs; an unlisted attachment is gone as far as the runtime
				// knows, so DEL it to mirror the runtime (its redirect goes with its veth).
				for j := range added {
					if !in.ValidAttachments.Has(cniplumb.Owner{Network: "net", ContainerID: "c-" + atts[j].netns, IfName: atts[j].ifName}) {
						if err := w.s.del(ctx, input("DEL", atts[j].netns, atts[j].ifName, added[j])); err != nil {
							t.Fatalf("%s DEL after GC: %v", where, err)
						}
						delete(added, j)
					}
				}
			case 3:
				if bw, ok := added[i]; ok {
					if err := w.s.check(ctx, input("CHECK", a.netns, a.ifName, bw)); err != nil {
						t.Fatalf("%s CHECK: %v\n%s", where, err, w.fake.Dump())
					}
				}
			}
		}
		for i, bw := range added {
			if err := w.s.del(ctx, input("DEL", atts[i].netns, atts[i].ifName, bw)); err != nil {
				t.Fatal(err)
			}
		}
		if got := w.fake.Dump(); got != initial {
			t.Fatalf("seed %d: state after deleting everything:\n%s\nwant:\n%s", seed, got, initial)
		}
	}
}

// TestGCExact: GC removes exactly the IFBs of unlisted attachments of its network.
func TestGCExact(t *testing.T) {
	ctx := context.Background()
	w := newWorld()
	w.pod("/run/netns/p1", "eth0", "veth1")
	w.pod("/run/netns/p2", "eth0", "veth2")
	w.pod("/run/netns/p3", "eth0", "veth3")
	for _, p := range []string{"p1", "p2", "p3"} {
		if _, err := w.s.add(ctx, input("ADD", p, "eth0", bw10)); err != nil {
			t.Fatal(err)
		}
	}
	w.fake.AddLink("ifb0", "ifb", 1500)
	in := input("GC", "", "", "")
	in.ValidAttachments = cniplumb.Owners{{Network: "net", ContainerID: "c-p2", IfName: "eth0"}: true}
	if err := w.s.gc(ctx, in); err != nil {
		t.Fatal(err)
	}
	ifbs, _ := w.fake.IFBs(ctx)
	var names []string
	for _, i := range ifbs {
		names = append(names, i.Name)
	}
	p2 := referenceIFBName("net", "c-p2")
	if strings.Join(names, " ") != strings.Join(sortedPair("ifb0", p2), " ") {
		t.Errorf("IFBs after GC: %v, want ifb0 and %s", names, p2)
	}
}

func sortedPair(a, b string) []string {
	if a < b {
		return []string{a, b}
	}
	return []string{b, a}
}

// TestReferenceNamedIFB: a pod's first interface gets the reference plugin's IFB name
// (so the reference's DEL removes it after a switch back); when the reference already
// made that IFB for the container, podwire uses its own name and DEL removes both.
func TestReferenceNamedIFB(t *testing.T) {
	ctx := context.Background()
	w := newWorld()
	w.pod("/run/netns/p1", "eth0", "veth1")
	w.pod("/run/netns/p2", "eth0", "veth2")
	ref1, ref2 := referenceIFBName("net", "c-p1"), referenceIFBName("net", "c-p2")
	own2, _ := ifbName(cniplumb.Owner{Network: "net", ContainerID: "c-p2", IfName: "eth0"})
	w.fake.AddLink(ref2, "ifb", 1500) // left by the reference plugin: no alias
	initial := w.fake.Dump()

	for _, p := range []string{"p1", "p2"} {
		if _, err := w.s.add(ctx, input("ADD", p, "eth0", bw10)); err != nil {
			t.Fatal(err)
		}
	}
	dump := w.fake.Dump()
	if !strings.Contains(dump, ref1+` ifb mtu 1500 up alias "podwire:net/c-p1/eth0`) {
		t.Errorf("p1's IFB is not %s:\n%s", ref1, dump)
	}
	if !strings.Contains(dump, own2+` ifb mtu 1500 up alias "podwire:net/c-p2/eth0`) || !strings.Contains(dump, "veth2 veth mtu 1500 up root tbf") {
		t.Errorf("p2 (reference IFB present) is not shaped through %s:\n%s", own2, dump)
	}
	// The reference's DEL for p1 deletes its IFB by name: what it finds is podwire's.
	w.fake.DelLink(ref1)
	for _, p := range []string{"p1", "p2"} {
		if err := w.s.del(ctx, input("DEL", p, "eth0", bw10)); err != nil {
			t.Fatal(err)
		}
	}
	want := strings.Replace(initial, ref2+" ifb mtu 1500 up\n", "", 1)
	if got := w.fake.Dump(); got != want {
		t.Errorf("after DEL:\n%s\nwant:\n%s", got, want)
	}
}
