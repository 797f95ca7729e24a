// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/link"
	"github.com/podwire/podwire/pkg/netfilter"
	"github.com/podwire/podwire/pkg/netfilter/fake"
)

// fakeIPAM is an in-memory host-local: the lowest free address of 10.0.0.0/24 (and of
// fd00::/64 when dual), the gateway .1 excluded; a repeated ADD of an attachment
// returns its lease, as podwire's host-local does. FailNext makes the next ADD fail.
type fakeIPAM struct {
	mu     sync.Mutex
	dual   bool
	leases map[string]int // "containerID/ifname" -> host number
	fail   error
}

func newFakeIPAM(dual bool) *fakeIPAM { return &fakeIPAM{dual: dual, leases: map[string]int{}} }

func attKey(in *cniplumb.Input) string { return in.ContainerID + "/" + in.IfName }

func (f *fakeIPAM) Add(_ context.Context, in *cniplumb.Input, _ string) (types.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail; err != nil {
		f.fail = nil
		return nil, err
	}
	n, ok := f.leases[attKey(in)]
	if !ok {
		used := map[int]bool{}
		for _, h := range f.leases {
			used[h] = true
		}
		for n = 2; used[n]; n++ {
		}
		if n > 254 {
			return nil, fmt.Errorf("no address left")
		}
		f.leases[attKey(in)] = n
	}
	r := &current.Result{CNIVersion: current.ImplementedSpecVersion,
		IPs: []*current.IPConfig{{Address: net.IPNet{IP: net.IPv4(10, 0, 0, byte(n)).To4(), Mask: net.CIDRMask(24, 32)}}}}
	if f.dual {
		ip := net.ParseIP(fmt.Sprintf("fd00::%x", n))
		r.IPs = append(r.IPs, &current.IPConfig{Address: net.IPNet{IP: ip, Mask: net.CIDRMask(64, 128)}})
	}
	return r, nil
}

func (f *fakeIPAM) Del(_ context.Context, in *cniplumb.Input, _ string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.leases, attKey(in))
	return nil
}

func (f *fakeIPAM) Check(_ context.Context, in *cniplumb.Input, _ string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.leases[attKey(in)]; !ok {
		return fmt.Errorf("no lease for %s", attKey(in))
	}
	return nil
}

func (f *fakeIPAM) GC(_ context.Context, in *cniplumb.Input, _ string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for k := range f.leases {
		id, ifname, _ := strings.Cut(k, "/")
		if !in.ValidAttachments.Has(cniplumb.Owner{Network: in.Conf.Name, ContainerID: id, IfName: ifname}) {
			delete(f.leases, k)
		}
	}
	return nil
}

func (f *fakeIPAM) Status(context.Context, *cniplumb.Input, string) error { return nil }

// holder returns the attachment holding 10.0.0.<n>, "" for none.
func (f *fakeIPAM) holder(addr string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	for k, n := range f.leases {
		if fmt.Sprintf("10.0.0.%d", n) == addr {
			return k
		}
	}
	return ""
}

func (f *fakeIPAM) dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for k, n := range f.leases {
		out = append(out, fmt.Sprintf("lease 10.0.0.%d %s", n, k))
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}

// fakeMasq is masqBackends on one fake kernel, both layouts, as on the node.
type fakeMasq struct{ k *fake.Kernel }

func (m fakeMasq) open(k netfilter.Kind) netfilter.MasqBackend {
	if k == netfilter.Auto {
		k = netfilter.KindNFTables
	}
	return netfilter.NewMasqOn(k, m.k, m.k)
}

func (m fakeMasq) Open(want netfilter.Kind) (netfilter.MasqBackend, error) { return m.open(want), nil }

func (m fakeMasq) Remove(ctx context.Context, o netfilter.Owner, addrs []netip.Prefix) error {
	return errors.Join(m.open(netfilter.KindNFTables).Remove(ctx, o, addrs), m.open(netfilter.KindIPTables).Remove(ctx, o, addrs))
}

func (m fakeMasq) Check(ctx context.Context, want netfilter.Kind, p netfilter.MasqPlan) error {
	err := m.open(want).Check(ctx, p)
	if netfilter.IsNotFound(err) {
		other := netfilter.KindIPTables
		if want == netfilter.KindIPTables {
			other = netfilter.KindNFTables
		}
		if oerr := m.open(other).Check(ctx, p); oerr == nil {
			return nil
		}
	}
	return err
}

func (m fakeMasq) GC(ctx context.Context, network string, keep cniplumb.Owners) error {
	return errors.Join(m.open(netfilter.KindNFTables).GC(ctx, network, keep), m.open(netfilter.KindIPTables).GC(ctx, network, keep))
}

// world is one node of fakes and the plugin on them.
type world struct {
	t      *testing.T
	links  *link.Fake
	kernel *fake.Kernel
	ipam   *fakeIPAM
	stderr *bytes.Buffer
	p      *plugin
	macs   int
}

func newWorld(t *testing.T, dual bool) *world {
	w := &world{t: t, links: link.NewFake(), kernel: fake.New(), ipam: newFakeIPAM(dual), stderr: &bytes.Buffer{}}
	w.p = &plugin{links: w.links, ipam: w.ipam, masq: fakeMasq{w.kernel}, spoof: netfilter.NewMacSpoofOn(w.kernel),
		stderr: w.stderr, random: w.mac}
	return w
}

// mac hands out distinct MACs, deterministic per world, none lower than 02:01:...
func (w *world) mac() (net.HardwareAddr, error) {
	w.macs++
	sum := sha256.Sum256([]byte(fmt.Sprint(w.macs)))
	return net.HardwareAddr{0x02 | sum[0]&0xf0, sum[1], sum[2], sum[3], sum[4], sum[5]}, nil
}

// input builds the verb's input for conf (a bridge object's extra keys), as
// cniplumb.Main would.
func (w *world) input(cmd, conf, containerID, netns string, prev *current.Result) *cniplumb.Input {
	stdin := []byte(`{"cniVersion":"1.1.0","name":"net","type":"bridge","bridge":"br0"` + conf + `}`)
	in := &cniplumb.Input{Command: cmd, ContainerID: containerID, Netns: netns, IfName: "eth0", Stdin: stdin,
		Conf: types.PluginConf{CNIVersion: "1.1.0", Name: "net", Type: "bridge"}, PrevResult: prev}
	return in
}

func (w *world) add(conf, id, netns string) (*current.Result, error) {
	r, err := w.p.add(context.Background(), w.input("ADD", conf, id, netns, nil))
	if err != nil {
		return nil, err
	}
	return current.NewResultFromResult(r)
}

func (w *world) mustAdd(conf, id, netns string) *current.Result {
	w.t.Helper()
	r, err := w.add(conf, id, netns)
	if err != nil {
		w.t.Fatalf("ADD %s: %v", id, err)
	}
	return r
}

func (w *world) del(conf, id, netns string, prev *current.Result) error {
	return w.p.del(context.Background(), w.input("DEL", conf, id, netns, prev))
}

func (w *world) check(conf, id, netns string, prev *current.Result) error {
	return w.p.check(context.Background(), w.input("CHECK", conf, id, netns, prev))
}

func (w *world) gc(conf string, keep ...string) error {
	in := w.input("GC", conf, "", "", nil)
	in.ValidAttachments = cniplumb.Owners{}
	for _, id := range keep {
		in.ValidAttachments[cniplumb.Owner{Network: "net", ContainerID: id, IfName: "eth0"}] = true
	}
	return w.p.gc(context.Background(), in)
}

// state is everything the fakes hold, for before/after comparisons.
func (w *world) state() string {
	return "links:\n" + w.links.Dump() + "rules:\n" + w.kernel.Dump() + "leases:\n" + w.ipam.dump() + "\n"
}
