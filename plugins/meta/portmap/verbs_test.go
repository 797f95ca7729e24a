// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/netfilter"
	"github.com/podwire/podwire/pkg/netfilter/fake"
	"github.com/podwire/podwire/pkg/portstate"
)

// world is the plugin wired to fakes: one HostPortFake per backend kind, a temporary
// marker directory, and recorders for the host-side effects.
type world struct {
	t        *testing.T
	pm       *portmap
	kernel   map[netfilter.Kind]*fake.Kernel
	fw       map[netfilter.Kind]netfilter.HostPortBackend
	opens    int
	probe    netfilter.Probe
	flushed  []string
	localnet []netip.Addr
	failLoc  error
	proc     string
	stateDir string
}

// routeLocalnet reads the fake /proc value of cni0's route_localnet.
func (w *world) routeLocalnet() string {
	b, _ := os.ReadFile(w.proc + "/cni0/route_localnet")
	return strings.TrimSpace(string(b))
}

func newWorld(t *testing.T) *world {
	w := &world{t: t, probe: netfilter.Probe{IPTables: true, NFTables: true}, stateDir: t.TempDir(),
		kernel: map[netfilter.Kind]*fake.Kernel{netfilter.KindIPTables: fake.New(), netfilter.KindNFTables: fake.New()}}
	w.fw = map[netfilter.Kind]netfilter.HostPortBackend{}
	for k, f := range w.kernel {
		w.fw[k] = netfilter.NewHostPortsOn(k, f, f)
	}
	w.proc = t.TempDir()
	if err := os.MkdirAll(w.proc+"/cni0", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(w.proc+"/cni0/route_localnet", []byte("0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	w.pm = &portmap{
		open: func(k netfilter.Kind) (netfilter.HostPortBackend, netfilter.Kind, error) {
			w.opens++
			k, err := netfilter.Pick(k, w.probe)
			if err != nil {
				return nil, "", err
			}
			return w.fw[k], k, nil
		},
		probe: func() netfilter.Probe { return w.probe },
		state: portstate.Dir(w.stateDir),
		routeIface: func(a netip.Addr) (string, error) {
			w.localnet = append(w.localnet, a)
			return "cni0", w.failLoc
		},
		flushUDP: func(v6 bool, ports []uint16) error {
			w.flushed = append(w.flushed, fmt.Sprintf("v6=%v %v", v6, ports))
			return nil
		},
		localnet: localnet{dir: w.stateDir, proc: w.proc},
		logf:     t.Logf,
	}
	return w
}

func (w *world) dump() string {
	return w.kernel[netfilter.KindIPTables].Dump() + w.kernel[netfilter.KindNFTables].Dump()
}

func (w *world) markers() []string {
	ents, _ := os.ReadDir(string(w.pm.state))
	var out []string
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "localnet") {
			out = append(out, e.Name())
		}
	}
	return out
}

// input builds what cniplumb hands a verb. mappings is the runtimeConfig JSON list
// ("" for none); res nil means no prevResult.
func input(cmd string, o cniplumb.Owner, extra, mappings string, res *current.Result) *cniplumb.Input {
	conf := `{"cniVersion":"1.1.0","name":"` + o.Network + `","type":"portmap"` + extra
	if mappings != "" {
		conf += `,"runtimeConfig":{"portMappings":` + mappings + `}`
	}
	conf += "}"
	in := &cniplumb.Input{Command: cmd, ContainerID: o.ContainerID, IfName: o.IfName, Netns: "/var/run/netns/p",
		Stdin: []byte(conf), Conf: types.PluginConf{CNIVersion: "1.1.0", Name: o.Network, Type: "portmap"}, PrevResult: res}
	if res != nil {
		in.Prev = res // as parsed at 1.1.0 (cniplumb sets both)
	}
	return in
}

const (
	tcpMapping  = `[{"hostPort":8080,"containerPort":80}]`
	bothMapping = `[{"hostPort":8080,"containerPort":80},{"hostPort":5353,"containerPort":53,"protocol":"udp"}]`
)

func TestAddDelCycle(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	res, err := w.pm.add(ctx, input("ADD", owner1, "", bothMapping, dualStack()))
	if err != nil {
		t.Fatal(err)
	}
	if res.(*current.Result) != nil && len(res.(*current.Result).IPs) != 4 {
		t.Errorf("prevResult not passed through: %v", res)
	}
	if d := w.kernel[netfilter.KindNFTables].Dump(); !strings.Contains(d, "dnat to 10.88.0.5:80") || !strings.Contains(d, "dnat to [fd88::5]:53") {
		t.Errorf("auto did not pick nftables or rules are missing:\n%s", w.dump())
	}
	if len(w.markers()) != 1 || len(w.localnet) != 1 || w.localnet[0] != addr("10.88.0.5") {
		t.Errorf("markers %v, localnet %v", w.markers(), w.localnet)
	}
	if strings.Join(w.flushed, ";") != "v6=false [5353];v6=true [5353]" {
		t.Errorf("UDP flush after ADD: %v", w.flushed)
	}
	if got := w.routeLocalnet(); got != "1" {
		t.Errorf("route_localnet after ADD = %s, want 1", got)
	}
	if err := w.pm.check(ctx, input("CHECK", owner1, "", bothMapping, dualStack())); err != nil {
		t.Errorf("CHECK after ADD: %v", err)
	}
	// CHECK notices a configuration that differs from what is installed.
	if err := w.pm.check(ctx, input("CHECK", owner1, "", tcpMapping, dualStack())); err == nil {
		t.Error("CHECK passed with a mapping fewer than installed")
	}
	// DEL without portMappings (the runtime need not pass them again) removes everything.
	w.flushed = nil
	if err := w.pm.del(ctx, input("DEL", owner1, "", "", nil)); err != nil {
		t.Fatal(err)
	}
	if d := w.dump(); d != "" || len(w.markers()) != 0 {
		t.Errorf("after DEL: markers %v, rules:\n%s", w.markers(), d)
	}
	if strings.Join(w.flushed, ";") != "v6=false [5353];v6=true [5353]" {
		t.Errorf("UDP flush on DEL: %v", w.flushed)
	}
	if got := w.routeLocalnet(); got != "0" {
		t.Errorf("route_localnet after the last DEL = %s, want 0 again", got)
	}
	// DEL is idempotent and costs nothing the second time.
	opens := w.opens
	if err := w.pm.del(ctx, input("DEL", owner1, "", "", nil)); err != nil || w.opens != opens {
		t.Errorf("second DEL: %v, opened a backend %d times", err, w.opens-opens)
	}
	if err := w.pm.check(ctx, input("CHECK", owner1, "", tcpMapping, dualStack())); err == nil {
		t.Error("CHECK passed after DEL")
	}
}

// An attachment without port mappings opens no backend and writes no file on ADD,
// CHECK and DEL.
func TestNoMappingsCostsNothing(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	for _, m := range []string{"", "[]"} {
		res, err := w.pm.add(ctx, input("ADD", owner1, "", m, dualStack()))
		if err != nil || res == nil {
			t.Fatalf("ADD: %v", err)
		}
		if err := w.pm.check(ctx, input("CHECK", owner1, "", m, dualStack())); err != nil {
			t.Errorf("CHECK: %v", err)
		}
		if err := w.pm.del(ctx, input("DEL", owner1, "", m, nil)); err != nil {
			t.Errorf("DEL: %v", err)
		}
	}
	if w.opens != 0 || len(w.markers()) != 0 || len(w.localnet) != 0 || len(w.flushed) != 0 {
		t.Errorf("opens=%d markers=%v localnet=%v flushed=%v", w.opens, w.markers(), w.localnet, w.flushed)
	}
}

func TestAddBadInputCreatesNothing(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name, extra, mappings string
		res                   *current.Result
		want                  string
	}{
		{"missing prevResult", "", tcpMapping, nil, "chained plugin"},
		{"missing prevResult without mappings", "", "", nil, "chained plugin"},
		{"port out of range", "", `[{"hostPort":65536,"containerPort":80}]`, dualStack(), "1-65535"},
		{"unknown protocol", "", `[{"hostPort":80,"containerPort":80,"protocol":"gre"}]`, dualStack(), "gre"},
		{"invalid hostIP", "", `[{"hostPort":80,"containerPort":80,"hostIP":"300.1.1.1"}]`, dualStack(), "300.1.1.1"},
		{"no pod address", "", tcpMapping, &current.Result{}, "no address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			_, err := w.pm.add(ctx, input("ADD", owner1, tc.extra, tc.mappings, tc.res))
			if cniplumb.Code(err) != 7 || !strings.Contains(errText(err), tc.want) {
				t.Errorf("ADD = %v; want code 7 containing %q", err, tc.want)
			}
			if w.opens != 0 || w.dump() != "" || len(w.markers()) != 0 {
				t.Errorf("bad input touched state: opens=%d markers=%v\n%s", w.opens, w.markers(), w.dump())
			}
		})
	}
}

func TestAddFailureUndoes(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	w.kernel[netfilter.KindNFTables].FailNext("flush", cniplumb.TryAgain("the xtables lock", errors.New("held")))
	_, err := w.pm.add(ctx, input("ADD", owner1, "", tcpMapping, dualStack()))
	if cniplumb.Code(err) != 11 {
		t.Errorf("busy backend: %v (code %d), want code 11", err, cniplumb.Code(err))
	}
	if w.dump() != "" || len(w.markers()) != 0 {
		t.Errorf("failed ADD left markers %v and rules\n%s", w.markers(), w.dump())
	}
	w.failLoc = errors.New("read-only /proc")
	if _, err := w.pm.add(ctx, input("ADD", owner1, "", tcpMapping, dualStack())); err == nil || !strings.Contains(err.Error(), "read-only") {
		t.Errorf("route_localnet failure: %v", err)
	}
	if w.dump() != "" || len(w.markers()) != 0 {
		t.Errorf("failed ADD left markers %v and rules\n%s", w.markers(), w.dump())
	}
}

func TestBackendSelection(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	if _, err := w.pm.add(ctx, input("ADD", owner1, `,"backend":"iptables"`, tcpMapping, dualStack())); err != nil {
		t.Fatal(err)
	}
	if w.kernel[netfilter.KindIPTables].Dump() == "" || w.kernel[netfilter.KindNFTables].Dump() != "" {
		t.Errorf("backend iptables not honoured:\n%s", w.dump())
	}
	// DEL follows the marker, whatever the DEL configuration says.
	if err := w.pm.del(ctx, input("DEL", owner1, `,"backend":"nftables"`, "", nil)); err != nil || w.dump() != "" {
		t.Errorf("DEL: %v\n%s", err, w.dump())
	}
	// A backend asked for by name but missing: code 50, nothing created.
	w.probe = netfilter.Probe{NFTables: true}
	if _, err := w.pm.add(ctx, input("ADD", owner1, `,"backend":"iptables"`, tcpMapping, dualStack())); cniplumb.Code(err) != 50 {
		t.Errorf("missing iptables: %v", err)
	}
	if err := w.pm.status(ctx, input("STATUS", owner1, `,"backend":"iptables"`, "", nil)); cniplumb.Code(err) != 50 {
		t.Errorf("STATUS with missing iptables: %v", err)
	}
	if err := w.pm.status(ctx, input("STATUS", owner1, "", "", nil)); err != nil {
		t.Errorf("STATUS with nftables: %v", err)
	}
	w.probe = netfilter.Probe{}
	if err := w.pm.status(ctx, input("STATUS", owner1, "", "", nil)); cniplumb.Code(err) != 50 {
		t.Errorf("STATUS with nothing: %v", err)
	}
	if len(w.markers()) != 0 {
		t.Errorf("markers left: %v", w.markers())
	}
}

// Without a marker but with portMappings, DEL cleans every backend: the attachment
// was set up by the reference portmap (or the marker was lost).
func TestDelWithoutMarker(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	if _, err := w.pm.add(ctx, input("ADD", owner1, `,"backend":"iptables"`, bothMapping, dualStack())); err != nil {
		t.Fatal(err)
	}
	for _, m := range w.markers() {
		_ = os.Remove(string(w.pm.state) + "/" + m)
	}
	w.flushed = nil
	if err := w.pm.del(ctx, input("DEL", owner1, "", "", nil)); err != nil || w.dump() == "" {
		t.Errorf("DEL without marker and mappings must do nothing: %v\n%s", err, w.dump())
	}
	if err := w.pm.del(ctx, input("DEL", owner1, "", bothMapping, nil)); err != nil || w.dump() != "" {
		t.Errorf("DEL without marker but with mappings: %v\n%s", err, w.dump())
	}
	if strings.Join(w.flushed, ";") != "v6=false [5353];v6=true [5353]" {
		t.Errorf("UDP flush: %v", w.flushed)
	}
	// Even a configuration ADD would refuse does not make DEL fail.
	if err := w.pm.del(ctx, input("DEL", owner1, `,"backend":"bogus"`, `[{"hostPort":70000,"containerPort":1,"protocol":"icmp"}]`, nil)); err != nil {
		t.Errorf("DEL with a bad configuration: %v", err)
	}
}

func TestGC(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	a := cniplumb.Owner{Network: "net1", ContainerID: "a", IfName: "eth0"}
	b := cniplumb.Owner{Network: "net1", ContainerID: "b", IfName: "eth0"}
	other := cniplumb.Owner{Network: "net2", ContainerID: "a", IfName: "eth0"}
	for _, o := range []cniplumb.Owner{a, b, other} {
		if _, err := w.pm.add(ctx, input("ADD", o, "", bothMapping, dualStack())); err != nil {
			t.Fatal(err)
		}
	}
	in := input("GC", a, "", "", nil)
	in.ValidAttachments = cniplumb.Owners{b: true}
	w.flushed = nil
	if err := w.pm.gc(ctx, in); err != nil {
		t.Fatal(err)
	}
	d := w.dump()
	if strings.Contains(d, "net1/a/eth0") || !strings.Contains(d, "net1/b/eth0") || !strings.Contains(d, "net2/a/eth0") {
		t.Errorf("GC kept the wrong attachments:\n%s", d)
	}
	if len(w.markers()) != 2 || len(w.flushed) != 2 {
		t.Errorf("markers after GC: %v, flushed %v", w.markers(), w.flushed)
	}
	if err := w.pm.check(ctx, input("CHECK", b, "", bothMapping, dualStack())); err != nil {
		t.Errorf("CHECK of a kept attachment: %v", err)
	}
}

// TestStateWalk runs ADD, DEL, CHECK and GC in random order over a few attachments and
// requires CHECK to agree with what was added, and that a final DEL of everything
// leaves no rule and no marker.
func TestStateWalk(t *testing.T) {
	ctx := context.Background()
	owners := []cniplumb.Owner{
		{Network: "net1", ContainerID: "a", IfName: "eth0"},
		{Network: "net1", ContainerID: "a", IfName: "eth1"},
		{Network: "net1", ContainerID: "b", IfName: "eth0"},
		{Network: "net2", ContainerID: "a", IfName: "eth0"},
	}
	backends := []string{"", `,"backend":"iptables"`, `,"backend":"nftables"`}
	rng := rand.New(rand.NewSource(5))
	for round := 0; round < 100; round++ {
		w := newWorld(t)
		added := map[cniplumb.Owner]string{}
		for step := 0; step < 12; step++ {
			o := owners[rng.Intn(len(owners))]
			switch rng.Intn(4) {
			case 0:
				be := backends[rng.Intn(len(backends))]
				if prev, ok := added[o]; ok {
					be = prev // a runtime re-ADDs with the same configuration
				}
				if _, err := w.pm.add(ctx, input("ADD", o, be, bothMapping, dualStackOn(o.IfName))); err != nil {
					t.Fatal(err)
				}
				added[o] = be
			case 1:
				if err := w.pm.del(ctx, input("DEL", o, "", "", nil)); err != nil {
					t.Fatal(err)
				}
				delete(added, o)
			case 2:
				be, ok := added[o]
				err := w.pm.check(ctx, input("CHECK", o, be, bothMapping, dualStackOn(o.IfName)))
				if ok != (err == nil) {
					t.Fatalf("round %d: CHECK %s = %v with added=%v", round, o, err, ok)
				}
			case 3:
				in := input("GC", o, "", "", nil)
				in.ValidAttachments = cniplumb.Owners{}
				for a := range added {
					in.ValidAttachments[a] = true
				}
				if err := w.pm.gc(ctx, in); err != nil {
					t.Fatal(err)
				}
			}
		}
		for _, o := range owners {
			if err := w.pm.del(ctx, input("DEL", o, "", "", nil)); err != nil {
				t.Fatal(err)
			}
		}
		if d := w.dump(); d != "" || len(w.markers()) != 0 {
			t.Fatalf("round %d: left markers %v and rules\n%s", round, w.markers(), d)
		}
		if got := w.routeLocalnet(); got != "0" {
			t.Fatalf("round %d: route_localnet left at %s", round, got)
		}
		if _, err := os.Stat(w.stateDir + "/localnet/cni0"); err == nil {
			t.Fatalf("round %d: route_localnet users left", round)
		}
	}
}

func TestMarkerRoundTrip(t *testing.T) {
	d := portstate.Dir(t.TempDir())
	m := portstate.Marker{Owner: owner1.Key(), Backend: netfilter.KindIPTables, Families: netfilter.V4, UDP4: []uint16{53}}
	if err := d.Write(owner1, m); err != nil {
		t.Fatal(err)
	}
	got, ok, err := d.Read(owner1)
	if err != nil || !ok || got.Backend != m.Backend || got.Families != m.Families || len(got.UDP4) != 1 {
		t.Fatalf("read = %+v %v %v", got, ok, err)
	}
	b, _ := json.Marshal(got)
	if !strings.Contains(string(b), `"backend":"iptables"`) {
		t.Errorf("marker JSON %s", b)
	}
	ls, err := d.List("net1")
	if err != nil || len(ls) != 1 || ls[0].ID != netfilter.IDOf(owner1) {
		t.Errorf("list = %+v, %v", ls, err)
	}
	if ls, _ := d.List("net2"); len(ls) != 0 {
		t.Errorf("list of another network = %+v", ls)
	}
	// A torn file still means "installed": DEL tries every backend.
	_ = os.WriteFile(d.Path(owner1), []byte("{"), 0o600)
	if got, ok, _ := d.Read(owner1); !ok || got.Backend != netfilter.Auto || got.Families != netfilter.All {
		t.Errorf("torn marker = %+v %v", got, ok)
	}
	if err := d.Remove(owner1); err != nil {
		t.Fatal(err)
	}
	if err := d.Remove(owner1); err != nil {
		t.Errorf("second remove: %v", err)
	}
}

// A repeated ADD with another backend or fewer families leaves nothing of the first.
func TestReAdd(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	if _, err := w.pm.add(ctx, input("ADD", owner1, `,"backend":"iptables"`, tcpMapping, dualStack())); err != nil {
		t.Fatal(err)
	}
	if _, err := w.pm.add(ctx, input("ADD", owner1, `,"backend":"nftables"`, tcpMapping, dualStack())); err != nil {
		t.Fatal(err)
	}
	if w.kernel[netfilter.KindIPTables].Dump() != "" || w.kernel[netfilter.KindNFTables].Dump() == "" {
		t.Errorf("after switching backends:\n%s", w.dump())
	}
	v4only := &current.Result{Interfaces: dualStack().Interfaces, IPs: dualStack().IPs[:2]}
	if _, err := w.pm.add(ctx, input("ADD", owner1, `,"backend":"nftables"`, tcpMapping, v4only)); err != nil {
		t.Fatal(err)
	}
	if d := w.dump(); strings.Contains(d, "ipv6") || !strings.Contains(d, "ipv4") {
		t.Errorf("after dropping IPv6:\n%s", d)
	}
	if err := w.pm.del(ctx, input("DEL", owner1, "", "", nil)); err != nil || w.dump() != "" || len(w.markers()) != 0 {
		t.Errorf("DEL: %v, markers %v\n%s", err, w.markers(), w.dump())
	}
	// Without nf_tables, a DEL that must look everywhere skips nftables.
	w.probe = netfilter.Probe{IPTables: true}
	if err := w.pm.del(ctx, input("DEL", owner1, "", tcpMapping, nil)); err != nil {
		t.Errorf("DEL without nf_tables: %v", err)
	}
}

// route_localnet stays on while any attachment needs it, goes off with the last one,
// and is never turned off when it was on before podwire came.
func TestRouteLocalnetUsers(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	a := cniplumb.Owner{Network: "net1", ContainerID: "a", IfName: "eth0"}
	b := cniplumb.Owner{Network: "net2", ContainerID: "b", IfName: "eth0"}
	for _, o := range []cniplumb.Owner{a, b} {
		if _, err := w.pm.add(ctx, input("ADD", o, "", tcpMapping, dualStack())); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.pm.del(ctx, input("DEL", a, "", "", nil)); err != nil {
		t.Fatal(err)
	}
	if got := w.routeLocalnet(); got != "1" {
		t.Errorf("route_localnet = %s while b still needs it", got)
	}
	gc := input("GC", b, "", "", nil) // b's network, b not listed: collected
	if err := w.pm.gc(ctx, gc); err != nil {
		t.Fatal(err)
	}
	if got := w.routeLocalnet(); got != "0" {
		t.Errorf("route_localnet = %s after GC removed its last user", got)
	}
	// Set by someone else first: left alone.
	_ = os.WriteFile(w.proc+"/cni0/route_localnet", []byte("1"), 0o644)
	if _, err := w.pm.add(ctx, input("ADD", a, "", tcpMapping, dualStack())); err != nil {
		t.Fatal(err)
	}
	if err := w.pm.del(ctx, input("DEL", a, "", "", nil)); err != nil {
		t.Fatal(err)
	}
	if got := w.routeLocalnet(); got != "1" {
		t.Errorf("route_localnet = %s; podwire turned off what it had not turned on", got)
	}
	// snat off or IPv6 only: not needed at all.
	if _, err := w.pm.add(ctx, input("ADD", a, `,"snat":false`, tcpMapping, dualStack())); err != nil {
		t.Fatal(err)
	}
	if m, _, _ := w.pm.state.Read(a); m.Localnet != "" {
		t.Errorf("snat=false recorded route_localnet on %s", m.Localnet)
	}
}
