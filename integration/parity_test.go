// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/google/go-cmp/cmp"

	"github.com/podwire/podwire/integration/nodestate"
	"github.com/podwire/podwire/integration/nstest"
)

// TestParity runs the same conflists through the reference plugins (v1.10.0) and
// through podwire at every cniVersion the reference accepts, each run in fresh host
// and pod namespaces, and requires the same outcome: what each plugin printed on ADD
// (as JSON, after normalizing MACs, veth names and namespace paths), the kernel state
// of both namespaces after ADD and after DEL, and CHECK's verdict. At 0.2.0 and 1.0.0
// it also ADDs through one implementation and DELs through the other, as a node that
// swaps binaries under live pods does, and requires that nothing of the pod is left.

// parityVersions are the cniVersions the reference accepts; "" leaves the key out,
// which libcni and skel read as 0.1.0.
var parityVersions = []string{"", "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}

// paritySwapVersions are those at which ADD by one implementation is followed by DEL
// by the other: one with 0.2.0 results (no interfaces, no prevResult on DEL) and one
// with 1.x results.
var paritySwapVersions = map[string]bool{"0.2.0": true, "1.0.0": true}

type parityPlugin struct {
	conf  string // with @BR@ and @DATADIR@
	since string // the lowest cniVersion the reference plugin accepts ("": all)
}

type parityCase struct {
	name     string
	ifName   string
	plugins  []parityPlugin
	caps     map[string]any
	args     [][2]string // CNI_ARGS
	versions []string    // nil: parityVersions
}

func bridgePlugin(extra, ranges, routes string) parityPlugin {
	if extra != "" {
		extra += ","
	}
	return parityPlugin{conf: fmt.Sprintf(`{"type":"bridge","bridge":"@BR@",%s
	  "ipam":{"type":"host-local","dataDir":"@DATADIR@","ranges":%s,"routes":%s}}`, extra, ranges, routes)}
}

const (
	parityV4     = `[[{"subnet":"10.77.0.0/24"}]]`
	parityDual   = `[[{"subnet":"10.77.0.0/24"}],[{"subnet":"fd00:77::/64"}]]`
	parityRoute4 = `[{"dst":"192.168.77.0/24"}]`
	parityRoutes = `[{"dst":"192.168.77.0/24"},{"dst":"fd00:1177::/64"}]`
)

var (
	portmapPlugin   = parityPlugin{conf: `{"type":"portmap","capabilities":{"portMappings":true}}`}
	bandwidthPlugin = parityPlugin{conf: `{"type":"bandwidth","capabilities":{"bandwidth":true}}`, since: "0.3.0"}
	chainCaps       = map[string]any{
		"portMappings": []map[string]any{{"hostPort": 18080, "containerPort": 80, "protocol": "tcp"}},
		"bandwidth":    map[string]any{"ingressRate": 8000000, "ingressBurst": 80000, "egressRate": 8000000, "egressBurst": 80000},
	}
	fewVersions = []string{"0.2.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}
)

var parityCases = []parityCase{
	{name: "loopback", ifName: "lo", plugins: []parityPlugin{{conf: `{"type":"loopback"}`}}},
	{name: "v4", plugins: []parityPlugin{bridgePlugin("", parityV4, parityRoute4)}},
	{name: "v4-gateway", plugins: []parityPlugin{bridgePlugin(`"isGateway":true`, parityV4, parityRoute4)}, versions: fewVersions},
	{name: "v4-default-masq", plugins: []parityPlugin{bridgePlugin(`"isDefaultGateway":true,"ipMasq":true`, parityV4, parityRoute4)}, versions: fewVersions},
	{name: "dual", plugins: []parityPlugin{bridgePlugin("", parityDual, parityRoutes)}, versions: fewVersions},
	{name: "dual-gateway-masq", plugins: []parityPlugin{bridgePlugin(`"isGateway":true,"isDefaultGateway":true,"ipMasq":true`, parityDual, parityRoutes)}, versions: fewVersions},
	{name: "chain", plugins: []parityPlugin{bridgePlugin(`"isGateway":true,"ipMasq":true`, parityV4, "[]"), portmapPlugin, bandwidthPlugin},
		caps: chainCaps, versions: fewVersions},
	{name: "chain-dual", plugins: []parityPlugin{bridgePlugin(`"isGateway":true,"isDefaultGateway":true,"ipMasq":true`, parityDual, "[]"), portmapPlugin, bandwidthPlugin},
		caps: chainCaps, versions: fewVersions},
}

// parityMAC is asked for through CNI_ARGS; the normalizer leaves it as it is, so the
// comparison shows whether it was applied.
const parityMAC = "02:00:00:00:00:42"

// argsCases are CNI_ARGS as runtimes and operators pass them, through the whole chain:
// bridge reads MAC and IgnoreUnknown, host-local IP and IgnoreUnknown, both
// case-sensitively and refusing other keys without IgnoreUnknown=1; loopback, portmap
// and bandwidth read none.
func argsCases() []parityCase {
	chain := []parityPlugin{bridgePlugin(`"isGateway":true`, parityV4, "[]"), portmapPlugin, bandwidthPlugin}
	lo := []parityPlugin{{conf: `{"type":"loopback"}`}}
	var out []parityCase
	for _, a := range []struct {
		name string
		args [][2]string
	}{
		{"MAC", [][2]string{{"MAC", parityMAC}}}, // host-local refuses MAC
		{"IgnoreUnknown+MAC", [][2]string{{"IgnoreUnknown", "1"}, {"MAC", parityMAC}}},
		{"IgnoreUnknown+mac", [][2]string{{"IgnoreUnknown", "1"}, {"mac", parityMAC}}},
		{"mac", [][2]string{{"mac", parityMAC}}},
		{"K8S", [][2]string{{"K8S_POD_NAMESPACE", "ns"}, {"K8S_POD_NAME", "p"}}},
		{"containerd", [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "ns"}, {"K8S_POD_NAME", "p"}, {"K8S_POD_INFRA_CONTAINER_ID", "x"}, {"K8S_POD_UID", "u"}}},
		{"IgnoreUnknown+IP", [][2]string{{"IgnoreUnknown", "1"}, {"IP", "10.77.0.9"}}},
		{"IgnoreUnknown+IP-list", [][2]string{{"IgnoreUnknown", "1"}, {"IP", "10.77.0.9,10.77.0.10"}}},
		{"IgnoreUnknown+ip", [][2]string{{"IgnoreUnknown", "1"}, {"ip", "10.77.0.9"}}},
		{"IgnoreUnknown-yes", [][2]string{{"IgnoreUnknown", "yes"}, {"K8S_POD_NAME", "p"}}},
		{"trailing-semicolon", [][2]string{{"IgnoreUnknown", "1;"}}},
	} {
		out = append(out,
			parityCase{name: "args-chain/" + a.name, plugins: chain, caps: chainCaps, args: a.args, versions: []string{"1.0.0"}},
			parityCase{name: "args-loopback/" + a.name, ifName: "lo", plugins: lo, args: a.args, versions: []string{"1.0.0"}})
	}
	return out
}

// parityRejections are the runs podwire refuses and the reference does not: podwire's
// extra validation, by "case/version", with the reason. There are none.
var parityRejections = map[string]string{}

// parityAfterDel are the lines of the namespaces after the last DEL in which podwire
// differs on purpose, each with the reason; they are left out of the comparison.
var parityAfterDel = []deliberate{
	{regexp.MustCompile(`^(ipv4/conf/[^/]+/route_localnet:|/proc/sys/net/ipv4/conf/[^/]+/route_localnet=)`),
		"portmap turns route_localnet back off when the last pod that needed it is gone, if podwire turned it on (CVE-2020-8558); " +
			"the reference leaves it on for good (portmap README, \"On the host\")"},
}

type deliberate struct {
	line *regexp.Regexp
	why  string
}

// afterDel is the compared part of s without the lines of parityAfterDel.
func afterDel(s nodestate.Snapshot) nodestate.Snapshot {
	out := nodestate.Snapshot{}
	for k, v := range compared(s) {
		var keep []string
		for _, l := range strings.Split(v, "\n") {
			if !slices.ContainsFunc(parityAfterDel, func(d deliberate) bool { return d.line.MatchString(l) }) {
				keep = append(keep, l)
			}
		}
		out[k] = strings.Join(keep, "\n")
	}
	return out
}

func TestParity(t *testing.T) {
	nstest.RequireRoot(t)
	refDir := referenceDir(t, "bridge", "host-local", "loopback", "portmap", "bandwidth")
	for _, c := range append(parityCases, argsCases()...) {
		versions := c.versions
		if versions == nil {
			versions = parityVersions
		}
		for _, v := range versions {
			label := v
			if label == "" {
				label = "no-cniVersion"
			}
			t.Run(c.name+"/"+label, func(t *testing.T) {
				p := newParityRun(t, c, v)
				ref := p.run(t, refDir, refDir)
				ours := p.run(t, "", "")
				if reason, ok := parityRejections[c.name+"/"+label]; ok {
					if !ours.addFailed || ref.addFailed {
						t.Fatalf("listed as rejected by podwire only (%s), but podwire failed=%v, reference failed=%v", reason, ours.addFailed, ref.addFailed)
					}
					t.Logf("podwire rejects it, the reference does not: %s", reason)
					return
				}
				if ref.addFailed && ours.addFailed {
					// DEL of an attachment whose ADD both refused (CNI_ARGS ADD refuses):
					// the reference's DEL refuses them too, podwire's goes on with a
					// warning, since a DEL must never refuse to tear down (bridge and
					// host-local READMEs). The verdicts differ by design.
					for i, st := range ours.steps {
						if st == "DEL ok=true" && i < len(ref.steps) && ref.steps[i] == "DEL ok=false" {
							ours.steps[i] = ref.steps[i]
							t.Logf("podwire's DEL %d goes on where the reference's refuses the CNI_ARGS", i)
						}
					}
				}
				compareParity(t, "reference", "podwire", ref, ours)
				if ref.addFailed || ours.addFailed {
					return // nothing was made that DEL could leave behind or a swap could delete
				}
				for _, o := range []*parityObs{ref, ours} {
					requireNothingLeft(t, o)
				}
				if !paritySwapVersions[v] || c.args != nil {
					return // CNI_ARGS change nothing a swap could trip over
				}
				for _, swap := range []struct {
					name     string
					add, del string
					want     *parityObs
				}{
					{"ADD by the reference, DEL by podwire", refDir, "", ref},
					{"ADD by podwire, DEL by the reference", "", refDir, ours},
				} {
					got := p.run(t, swap.add, swap.del)
					if d := nodestate.Diff(afterDel(swap.want.afterDel), afterDel(got.afterDel)); d != "" {
						t.Errorf("%s: the namespaces differ from DEL by the ADD's own implementation (- same, + swapped):\n%s", swap.name, d)
					}
					requireNothingLeft(t, got)
				}
			})
		}
	}
}

// parityRun is one case at one cniVersion; its runs share the network name and the
// container ID, so chain names derived from them are equal.
type parityRun struct {
	c                   parityCase
	version             string
	network, id, bridge string
}

func newParityRun(t *testing.T, c parityCase, v string) *parityRun {
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	tag := hex.EncodeToString(b[:])
	// The bridge name is unique too: podwire keeps per-interface state in /run/podwire
	// (portmap's route_localnet holders), which all namespaces of the machine share.
	return &parityRun{c: c, version: v, network: "par" + tag, id: "parity-ctr-" + tag, bridge: "pb" + tag}
}

// conflist is the case's conflist at the run's cniVersion, without the plugins the
// reference does not accept at it (bandwidth below 0.3.0).
func (p *parityRun) conflist(t *testing.T, h *nstest.H) *libcni.NetworkConfigList {
	t.Helper()
	var plugins []string
	for _, pl := range p.c.plugins {
		if pl.since != "" {
			if ok, _ := version.GreaterThanOrEqualTo(versionOrLegacy(p.version), pl.since); !ok {
				continue
			}
		}
		plugins = append(plugins, strings.NewReplacer("@BR@", p.bridge, "@DATADIR@", h.DataDir).Replace(pl.conf))
	}
	head := fmt.Sprintf(`"name":%q`, p.network)
	if p.version != "" {
		head = fmt.Sprintf(`"cniVersion":%q,%s`, p.version, head)
	}
	text := fmt.Sprintf(`{%s,"plugins":[%s]}`, head, strings.Join(plugins, ","))
	list, err := libcni.NetworkConfFromBytes([]byte(text))
	if err != nil {
		t.Fatalf("parsing conflist: %v\n%s", err, text)
	}
	return list
}

func versionOrLegacy(v string) string {
	if v == "" {
		return "0.1.0"
	}
	return v
}

// parityObs is what one run observed, normalized.
type parityObs struct {
	steps     []string // each plugin call: verb, plugin, and its stdout or "failed"
	addFailed bool
	afterAdd  nodestate.Snapshot
	afterDel  nodestate.Snapshot
}

// run ADDs with the plugins in addDir, CHECKs (from 0.4.0) and DELs with those in
// delDir, in fresh namespaces; "" is podwire's build. The two libcni clients share one
// result cache, as on a node where only the binaries change.
func (p *parityRun) run(t *testing.T, addDir, delDir string) *parityObs {
	t.Helper()
	h := nstest.New(t)
	// No IPv6 duplicate address detection on the node's new links (bridge, veth): it
	// takes one to two seconds, and an address's local route appears only when it ends,
	// so a DEL before or after that would leave different routes behind. Both
	// implementations run so; neither touches these knobs on the node.
	h.Run(h.HostNS, "sysctl", "-qw", "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0")
	pod := h.NewPod()
	if addDir == "" {
		addDir = h.BinDir
	}
	if delDir == "" {
		delDir = h.BinDir
	}
	cache := filepath.Join(t.TempDir(), "cache")
	rec := newRecorder()
	adder := libcni.NewCNIConfigWithCacheDir([]string{addDir}, cache, rec)
	deleter := libcni.NewCNIConfigWithCacheDir([]string{delDir}, cache, rec)
	list := p.conflist(t, h)
	ifName := p.c.ifName
	if ifName == "" {
		ifName = "eth0"
	}
	rt := h.RT(pod, ifName, nstest.WithContainerID(p.id), nstest.WithCaps(p.c.caps), nstest.WithArgs(p.c.args...))
	o := &parityObs{}

	_, err := h.AddWith(adder, list, rt)
	o.addFailed = err != nil
	settle(t, pod, h.HostNS)
	n := newNormalizer(t, h, pod)
	o.steps = append(o.steps, callLines(n, rec.take())...)
	o.afterAdd = n.snapshot(t, h, pod, false)

	if ok, _ := version.GreaterThanOrEqualTo(versionOrLegacy(p.version), "0.4.0"); ok && !o.addFailed {
		err := h.InHost(func() error { return adder.CheckNetworkList(context.Background(), list, rt) })
		o.steps = append(o.steps, fmt.Sprintf("CHECK ok=%v", err == nil))
		rec.take()
	}
	for i := 0; i < 2; i++ { // the spec requires a repeated DEL to succeed
		err := h.DelWith(deleter, list, rt)
		o.steps = append(o.steps, fmt.Sprintf("DEL ok=%v", err == nil))
		if err != nil {
			t.Logf("DEL %d: %v", i+1, err)
		}
		rec.take()
	}
	settle(t, pod, h.HostNS)
	o.afterDel = newNormalizer(t, h, pod).snapshot(t, h, pod, true)
	if addDir == h.BinDir && delDir != h.BinDir {
		// The reference's DEL does not know podwire's bookkeeping in /run/podwire
		// (portmap's marker and route_localnet holder); a DEL by podwire, as after a
		// switch back, removes it.
		if err := h.DelWith(libcni.NewCNIConfigWithCacheDir([]string{h.BinDir}, cache, nil), list, rt); err != nil {
			t.Errorf("DEL by podwire after the reference's DEL: %v", err)
		}
	}
	return o
}

func callLines(n *normalizer, calls []call) []string {
	var out []string
	for _, c := range calls {
		switch {
		case c.failed:
			out = append(out, fmt.Sprintf("%s %s: failed", c.verb, c.plugin))
		case c.verb == "ADD":
			out = append(out, fmt.Sprintf("%s %s:\n%s", c.verb, c.plugin, n.result(c.stdout)))
		default:
			out = append(out, fmt.Sprintf("%s %s: ok", c.verb, c.plugin))
		}
	}
	return out
}

// compareParity requires the same plugin outputs, CHECK and DEL verdicts, and, when ADD
// succeeded, the same namespaces after ADD and after DEL. What a failed ADD leaves is
// not compared: the spec leaves it to the runtime's DEL, and podwire's ADD undoes its
// own steps where the reference's leaves the bridge or veth it made.
func compareParity(t *testing.T, aName, bName string, a, b *parityObs) {
	t.Helper()
	if d := cmp.Diff(a.steps, b.steps); d != "" {
		t.Errorf("plugin outputs differ (- %s, + %s):\n%s", aName, bName, d)
	}
	if a.addFailed && b.addFailed {
		return
	}
	if d := nodestate.Diff(compared(a.afterAdd), compared(b.afterAdd)); d != "" {
		t.Errorf("namespaces after ADD differ (- %s, + %s):\n%s", aName, bName, d)
	}
	if d := nodestate.Diff(afterDel(a.afterDel), afterDel(b.afterDel)); d != "" {
		t.Errorf("namespaces after DEL differ (- %s, + %s):\n%s", aName, bName, d)
	}
}

// requireNothingLeft fails when DEL left anything of the pod: a veth or IFB, an
// address in the pod, a lease, a qdisc or filter on its veth, a rule naming the
// container or its addresses.
func requireNothingLeft(t *testing.T, o *parityObs) {
	t.Helper()
	s := o.afterDel
	var left []string
	for _, k := range []string{"host links", "pod links", "pod addrs", "host qdiscs", "host filters"} {
		for _, l := range strings.Split(s[k], "\n") {
			if strings.Contains(l, "veth@") || strings.Contains(l, "bwp") || strings.Contains(l, "eth0") {
				left = append(left, k+": "+l)
			}
		}
	}
	if s["host leases"] != "" {
		left = append(left, "leases: "+s["host leases"])
	}
	// Rules name the container (iptables comments), its hostPort chain (CNI-DN-) or its
	// addresses; the chains and tables shared by all pods may stay, as they do after
	// DEL by the reference.
	for _, k := range []string{"host iptables-save", "host ip6tables-save", "host nft"} {
		for _, l := range strings.Split(s[k], "\n") {
			if strings.Contains(l, "parity-ctr-") || strings.Contains(l, "CNI-DN-") || strings.Contains(l, "10.77.0.") || strings.Contains(l, "fd00:77:") {
				left = append(left, k+": "+l)
			}
		}
	}
	if len(left) > 0 {
		t.Errorf("DEL left parts of the pod behind:\n%s", strings.Join(left, "\n"))
	}
}
