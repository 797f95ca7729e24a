// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/podwire/podwire/integration/nstest"
)

// hostLocalList is a conflist whose only plugin is host-local (libcni calls an IPAM
// plugin directly just as well), with the ips and ipRanges capabilities enabled.
func hostLocalList(h *nstest.H, netName, ipamBody string) *libcni.NetworkConfigList {
	return h.Conflist(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"@PREFIX@-%s","plugins":[
		{"type":"host-local","capabilities":{"ips":true,"ipRanges":true},
		 "ipam":{"type":"host-local","dataDir":"@DATADIR@",%s}}]}`, netName, ipamBody))
}

// leaseFiles reads the lease files of a network: address -> content, exactly as on
// disk (with \r\n shown escaped).
func leaseFiles(t *testing.T, h *nstest.H, list *libcni.NetworkConfigList) map[string]string {
	t.Helper()
	dir := filepath.Join(h.DataDir, list.Name)
	ents, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return map[string]string{}
	}
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range ents {
		if net.ParseIP(e.Name()) == nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = strings.ReplaceAll(string(b), "\r\n", `\r\n`)
	}
	return out
}

// cniErr finds the plugin's CNI error inside libcni's wrapping.
func cniErr(err error) (*types.Error, bool) {
	var e *types.Error
	ok := errors.As(err, &e)
	return e, ok
}

func resultIPs(r *current.Result) string {
	var s []string
	for _, ip := range r.IPs {
		g := ""
		if ip.Gateway != nil {
			g = " gw " + ip.Gateway.String()
		}
		s = append(s, ip.Address.String()+g)
	}
	return strings.Join(s, ", ")
}

func TestHostLocalDualStack(t *testing.T) {
	h := nstest.New(t)
	before := h.Snapshot()
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	os.WriteFile(resolv, []byte("# node DNS\nnameserver 10.96.0.10\nsearch svc.cluster.local cluster.local\noptions ndots:5\n"), 0o644)
	list := hostLocalList(h, "ds", `"ranges":[[{"subnet":"10.77.0.0/16","gateway":"10.77.0.1"}],[{"subnet":"fd77::/64"}]],
		"routes":[{"dst":"0.0.0.0/0"},{"dst":"::/0"}],"resolvConf":"`+resolv+`"`)
	pod := h.NewPod()
	rt := h.RT(pod, "eth0")

	res := h.MustAdd(list, rt)
	if got := resultIPs(res); got != "10.77.0.2/16 gw 10.77.0.1, fd77::2/64 gw fd77::1" {
		t.Errorf("ADD result IPs: %s", got)
	}
	if len(res.Routes) != 2 || res.Routes[0].Dst.String() != "0.0.0.0/0" || res.Routes[1].Dst.String() != "::/0" {
		t.Errorf("ADD result routes: %v", res.Routes)
	}
	if d := cmp.Diff(types.DNS{Nameservers: []string{"10.96.0.10"}, Search: []string{"svc.cluster.local", "cluster.local"}, Options: []string{"ndots:5"}}, res.DNS); d != "" {
		t.Errorf("DNS from resolvConf (-want +got):\n%s", d)
	}
	id := rt.ContainerID
	if d := cmp.Diff(map[string]string{"10.77.0.2": id + `\r\neth0`, "fd77::2": id + `\r\neth0`}, leaseFiles(t, h, list)); d != "" {
		t.Errorf("lease files (-want +got):\n%s", d)
	}
	t.Logf("ADD: %s; lease files as the reference writes them", resultIPs(res))

	// A runtime restarted mid-ADD repeats it: same addresses, no second lease.
	if again := h.MustAdd(list, rt); resultIPs(again) != resultIPs(res) {
		t.Errorf("repeated ADD: %s, first: %s", resultIPs(again), resultIPs(res))
	}
	if err := h.Check(list, rt); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	// A second interface of the same pod is another attachment.
	rt1 := h.RT(pod, "net1")
	if got := resultIPs(h.MustAdd(list, rt1)); got != "10.77.0.3/16 gw 10.77.0.1, fd77::3/64 gw fd77::1" {
		t.Errorf("ADD net1: %s", got)
	}
	if err := h.Status(list); err != nil {
		t.Errorf("STATUS: %v", err)
	}
	h.MustDel(list, rt)
	if err := h.Check(list, rt1); err != nil {
		t.Errorf("CHECK net1 after DEL eth0: %v", err)
	}
	h.MustDel(list, rt1)
	h.MustDel(list, rt1) // DEL repeats
	h.DeletePod(pod)
	h.MustDel(list, rt) // DEL without the netns
	if got := leaseFiles(t, h, list); len(got) != 0 {
		t.Errorf("leases after DEL: %v", got)
	}
	t.Log("DEL releases both addresses; repeated DEL and DEL without netns succeed")
	h.RequireUnchanged(before)
}

func TestHostLocalRequestedIPs(t *testing.T) {
	h := nstest.New(t)
	before := h.Snapshot()
	list := hostLocalList(h, "req", `"ranges":[[{"subnet":"10.78.0.0/24"}],[{"subnet":"fd78::/64"}]]`)
	pod := h.NewPod()

	a := h.RT(pod, "eth0", nstest.WithContainerID("a"), nstest.WithArgs([2]string{"IP", "10.78.0.50"}))
	if got := resultIPs(h.MustAdd(list, a)); got != "10.78.0.50/24 gw 10.78.0.1, fd78::2/64 gw fd78::1" {
		t.Errorf("CNI_ARGS IP=: %s", got)
	}
	b := h.RT(pod, "eth0", nstest.WithContainerID("b"), nstest.WithCaps(map[string]any{"ips": []string{"10.78.0.60/24", "fd78::60/64"}}))
	if got := resultIPs(h.MustAdd(list, b)); got != "10.78.0.60/24 gw 10.78.0.1, fd78::60/64 gw fd78::1" {
		t.Errorf("runtimeConfig ips: %s", got)
	}
	// Taken by another container: a clear error, and nothing leased.
	c := h.RT(pod, "eth0", nstest.WithContainerID("c"), nstest.WithCaps(map[string]any{"ips": []string{"10.78.0.60"}}))
	_, err := h.Add(list, c)
	if err == nil || !strings.Contains(err.Error(), "10.78.0.60 is already leased to b/eth0") {
		t.Errorf("requesting a taken address: %v", err)
	}
	// Outside every range: code 7 naming the capability.
	d := h.RT(pod, "eth0", nstest.WithContainerID("d"), nstest.WithCaps(map[string]any{"ips": []string{"192.168.9.9"}}))
	_, err = h.Add(list, d)
	if e, ok := cniErr(err); !ok || e.Code != 7 || !strings.Contains(e.Error(), "runtimeConfig.ips") || !strings.Contains(e.Error(), "not in any configured range") {
		t.Errorf("requesting an address outside the ranges: %v", err)
	}
	t.Logf("outside every range: %v", err)
	// The ipRanges capability's set comes first, then the configured ones (as in the
	// reference): one address from each.
	r := h.RT(pod, "eth0", nstest.WithContainerID("r"), nstest.WithCaps(map[string]any{"ipRanges": [][]map[string]string{{{"subnet": "10.79.5.0/24", "rangeStart": "10.79.5.200"}}}}))
	rr := h.MustAdd(list, r)
	if len(rr.IPs) != 3 || rr.IPs[0].Address.String() != "10.79.5.200/24" ||
		!strings.HasPrefix(rr.IPs[1].Address.String(), "10.78.0.") || !strings.HasPrefix(rr.IPs[2].Address.String(), "fd78::") {
		t.Errorf("ipRanges: %s, want 10.79.5.200/24 first, then one address of each configured range set", resultIPs(rr))
	}
	for _, rt := range []*libcni.RuntimeConf{a, b, c, d, r} {
		h.MustDel(list, rt)
	}
	h.RequireUnchanged(before)
}

// referenceBin returns the directory holding the reference host-local (the
// containernetworking/plugins release podwire replaces), installing it from the Go
// module proxy into <repo>/.cache once, as the benchmarks do.
func referenceBin(t *testing.T) string {
	t.Helper()
	root, err := nstest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	const version = "v1.10.0"
	dir := filepath.Join(root, ".cache", "reference-"+version)
	if _, err := os.Stat(filepath.Join(dir, "host-local")); err == nil {
		return dir
	}
	out, err := execGo(dir, "install", "-trimpath", "github.com/containernetworking/plugins/plugins/ipam/host-local@"+version)
	if err != nil {
		t.Fatalf("installing the reference host-local %s: %v\n%s", version, err, out)
	}
	return dir
}

// execGo runs the go tool with GOBIN=gobin.
func execGo(gobin string, args ...string) ([]byte, error) {
	cmd := exec.Command("go", args...)
	cmd.Env = append(os.Environ(), "GOBIN="+gobin, "CGO_ENABLED=0")
	return cmd.CombinedOutput()
}

// TestHostLocalReferenceCompat swaps the reference host-local binary and podwire's
// under live attachments, both ways, on one data dir and one libcni cache, as a node
// operator replacing /opt/cni/bin/host-local would.
func TestHostLocalReferenceCompat(t *testing.T) {
	h := nstest.New(t)
	before := h.Snapshot()
	cache := filepath.Join(t.TempDir(), "cache")
	ours := libcni.NewCNIConfigWithCacheDir([]string{h.BinDir}, cache, nil)
	ref := libcni.NewCNIConfigWithCacheDir([]string{referenceBin(t)}, cache, nil)
	list := hostLocalList(h, "compat", `"ranges":[[{"subnet":"10.80.0.0/24"}],[{"subnet":"fd80::/64"}]]`)
	pod := h.NewPod()
	rt := func(id string) *libcni.RuntimeConf { return h.RT(pod, "eth0", nstest.WithContainerID(id)) }
	add := func(c *libcni.CNIConfig, who, id string) string {
		t.Helper()
		r, err := h.AddWith(c, list, rt(id))
		if err != nil {
			t.Fatalf("%s ADD %s: %v", who, id, err)
		}
		return resultIPs(r)
	}
	del := func(c *libcni.CNIConfig, who, id string) {
		t.Helper()
		if err := h.DelWith(c, list, rt(id)); err != nil {
			t.Fatalf("%s DEL %s: %v", who, id, err)
		}
	}
	check := func(c *libcni.CNIConfig, id string) error {
		return h.InHost(func() error { return c.CheckNetworkList(t.Context(), list, rt(id)) })
	}

	// The reference leases first; podwire takes over and continues.
	if got := add(ref, "reference", "r1"); got != "10.80.0.2/24 gw 10.80.0.1, fd80::2/64 gw fd80::1" {
		t.Errorf("reference ADD r1: %s", got)
	}
	add(ref, "reference", "r2")
	refFiles := leaseFiles(t, h, list)
	if got := add(ours, "podwire", "p1"); got != "10.80.0.4/24 gw 10.80.0.1, fd80::4/64 gw fd80::1" {
		t.Errorf("podwire ADD after the reference: %s (want round-robin after the reference's last)", got)
	}
	if got := add(ours, "podwire", "r1"); got != "10.80.0.2/24 gw 10.80.0.1, fd80::2/64 gw fd80::1" {
		t.Errorf("podwire ADD repeated for the reference's r1: %s", got)
	}
	if err := check(ours, "r2"); err != nil {
		t.Errorf("podwire CHECK of the reference's r2: %v", err)
	}
	del(ours, "podwire", "r2")
	// podwire writes byte-identical lease files.
	p1Files := leaseFiles(t, h, list)
	if p1Files["10.80.0.4"] != "p1\\r\\neth0" || refFiles["10.80.0.2"] != "r1\\r\\neth0" {
		t.Errorf("lease formats differ: reference %q, podwire %q", refFiles["10.80.0.2"], p1Files["10.80.0.4"])
	}
	t.Logf("reference lease %q, podwire lease %q", refFiles["10.80.0.2"], p1Files["10.80.0.4"])

	// Back to the reference: it honours and releases podwire's leases.
	if _, err := h.AddWith(ref, list, rt("p1")); err == nil || !strings.Contains(err.Error(), "duplicate allocation") {
		t.Errorf("reference ADD for podwire's p1 should see its lease (duplicate allocation): %v", err)
	}
	if err := check(ref, "p1"); err != nil {
		t.Errorf("reference CHECK of podwire's p1: %v", err)
	}
	if got := add(ref, "reference", "r3"); got != "10.80.0.5/24 gw 10.80.0.1, fd80::5/64 gw fd80::1" {
		t.Errorf("reference ADD after podwire: %s", got)
	}
	del(ref, "reference", "p1")
	if got := leaseFiles(t, h, list); got["10.80.0.4"] != "" {
		t.Errorf("reference DEL left podwire's lease: %v", got)
	}
	// The reference's GC keeps podwire's index and valid leases; podwire sees the result.
	add(ours, "podwire", "p2")
	if err := h.InHost(func() error {
		return ref.GCNetworkList(t.Context(), list, &libcni.GCArgs{ValidAttachments: []types.GCAttachment{{ContainerID: "p2", IfName: "eth0"}, {ContainerID: "r3", IfName: "eth0"}}})
	}); err != nil {
		t.Fatalf("reference GC: %v", err)
	}
	if err := check(ours, "p2"); err != nil {
		t.Errorf("podwire CHECK after the reference's GC: %v", err)
	}
	if err := check(ours, "r1"); err == nil {
		t.Error("podwire CHECK of r1 collected by the reference's GC passed")
	}
	want := map[string]string{"10.80.0.5": `r3\r\neth0`, "fd80::5": `r3\r\neth0`, "10.80.0.6": `p2\r\neth0`, "fd80::6": `p2\r\neth0`}
	if d := cmp.Diff(want, leaseFiles(t, h, list)); d != "" {
		t.Errorf("leases after the reference's GC (-want +got):\n%s", d)
	}
	del(ours, "podwire", "r3")
	del(ref, "reference", "p2")
	h.RequireUnchanged(before)
}

// TestHostLocalConcurrent: 100 concurrent ADDs get 100 distinct addresses; 100
// concurrent DELs leave an empty store.
func TestHostLocalConcurrent(t *testing.T) {
	h := nstest.New(t)
	before := h.Snapshot()
	list := hostLocalList(h, "conc", `"ranges":[[{"subnet":"10.81.0.0/16"}]]`)
	pod := h.NewPod()
	const n = 100
	rts := make([]*libcni.RuntimeConf, n)
	for i := range rts {
		rts[i] = h.RT(pod, "eth0", nstest.WithContainerID(fmt.Sprintf("conc%03d", i)))
	}
	var wg sync.WaitGroup
	ips := make([]string, n)
	errs := make([]error, n)
	start := time.Now()
	for i := range rts {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			r, err := h.Add(list, rts[i])
			if err == nil {
				ips[i] = r.IPs[0].Address.IP.String()
			}
			errs[i] = err
		}(i)
	}
	wg.Wait()
	seen := map[string]int{}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("ADD %d: %v", i, err)
		}
		if j, dup := seen[ips[i]]; dup {
			t.Fatalf("%s given to both %d and %d", ips[i], j, i)
		}
		seen[ips[i]] = i
	}
	files := leaseFiles(t, h, list)
	if len(files) != n {
		t.Fatalf("%d lease files, want %d", len(files), n)
	}
	for i, ip := range ips {
		if files[ip] != fmt.Sprintf(`conc%03d\r\neth0`, i) {
			t.Errorf("lease %s holds %q, want conc%03d", ip, files[ip], i)
		}
	}
	t.Logf("%d concurrent ADDs: %d distinct addresses in %v", n, len(seen), time.Since(start).Round(time.Millisecond))
	start = time.Now()
	for i := range rts {
		wg.Add(1)
		go func(i int) { defer wg.Done(); errs[i] = h.Del(list, rts[i]) }(i)
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("DEL %d: %v", i, err)
		}
	}
	if got := leaseFiles(t, h, list); len(got) != 0 {
		t.Errorf("%d leases left after concurrent DELs", len(got))
	}
	t.Logf("%d concurrent DELs: store empty after %v", n, time.Since(start).Round(time.Millisecond))
	h.RequireUnchanged(before)
}

// TestHostLocalBrokenAndPreviousBootLeases: an empty lease file (a writer crashed
// between creating and filling it) is reclaimed once older than 10 s; leases from a
// previous boot are reclaimed when the range is otherwise exhausted.
func TestHostLocalBrokenAndPreviousBootLeases(t *testing.T) {
	h := nstest.New(t)
	before := h.Snapshot()
	// A /29: .1 is the gateway, .2-.6 the five usable addresses.
	list := hostLocalList(h, "boot", `"ranges":[[{"subnet":"10.82.0.0/29"}]]`)
	dir := filepath.Join(h.DataDir, list.Name)
	pod := h.NewPod()
	rt := func(id string) *libcni.RuntimeConf { return h.RT(pod, "eth0", nstest.WithContainerID(id)) }
	os.MkdirAll(dir, 0o755)

	// An empty lease as the reference leaves it after a crash, a minute old, and a
	// fresh one (a writer might still be filling it).
	old := time.Now().Add(-time.Minute)
	os.WriteFile(filepath.Join(dir, "10.82.0.2"), nil, 0o600)
	os.Chtimes(filepath.Join(dir, "10.82.0.2"), old, old)
	os.WriteFile(filepath.Join(dir, "10.82.0.3"), nil, 0o600)
	if got := resultIPs(h.MustAdd(list, rt("a"))); got != "10.82.0.2/29 gw 10.82.0.1" {
		t.Errorf("ADD over a stale empty lease: %s", got)
	}
	if got := resultIPs(h.MustAdd(list, rt("b"))); got != "10.82.0.4/29 gw 10.82.0.1" {
		t.Errorf("ADD next to a fresh empty lease: %s (want it skipped)", got)
	}
	os.Remove(filepath.Join(dir, "10.82.0.3"))
	for _, id := range []string{"c", "d", "e"} {
		h.MustAdd(list, rt(id))
	}
	if err := h.Status(list); err == nil {
		t.Fatal("STATUS on a full range passed")
	}
	// Now the node "reboots": rewrite podwire's index exactly as it looks after a
	// reboot (the recorded boot ID is no longer the kernel's).
	markPreviousBoot(t, dir)
	if err := h.Status(list); err != nil {
		t.Errorf("STATUS with reclaimable leases from a previous boot: %v", err)
	}
	// e is re-added after the reboot (same container ID, as podman does): it keeps its
	// address and becomes current.
	if got := resultIPs(h.MustAdd(list, rt("e"))); got != "10.82.0.3/29 gw 10.82.0.1" {
		t.Errorf("re-ADD of e after the reboot: %s", got)
	}
	if got := resultIPs(h.MustAdd(list, rt("new"))); got != "10.82.0.4/29 gw 10.82.0.1" {
		t.Errorf("ADD on a range full of the previous boot's leases: %s", got)
	}
	if d := cmp.Diff(map[string]string{"10.82.0.3": `e\r\neth0`, "10.82.0.4": `new\r\neth0`}, leaseFiles(t, h, list)); d != "" {
		t.Errorf("after reclaiming the previous boot's leases (-want +got):\n%s", d)
	}
	for _, id := range []string{"a", "b", "c", "d", "e", "new"} {
		h.MustDel(list, rt(id))
	}
	h.RequireUnchanged(before)
}

// markPreviousBoot sets the boot ID in podwire's index to one that is not the
// running kernel's, which is what the index looks like after a reboot.
func markPreviousBoot(t *testing.T, dir string) {
	t.Helper()
	rewrite := func(p string) {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		dec := json.NewDecoder(strings.NewReader(string(b)))
		dec.UseNumber() // inode numbers and nanosecond mtimes do not fit a float64
		if err := dec.Decode(&m); err != nil {
			t.Fatal(err)
		}
		if _, ok := m["boot"]; ok {
			m["boot"] = "00000000-0000-0000-0000-previousboot"
		}
		if ls, ok := m["leases"].([]any); ok {
			for _, l := range ls {
				l.(map[string]any)["boot"] = "00000000-0000-0000-0000-previousboot"
			}
		}
		b, _ = json.Marshal(m)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	rewrite(filepath.Join(dir, ".podwire", "state"))
	owners, _ := filepath.Glob(filepath.Join(dir, ".podwire", "owners", "*"))
	if len(owners) == 0 {
		t.Fatal("no index entries to mark")
	}
	for _, p := range owners {
		rewrite(p)
	}
}

func TestHostLocalGC(t *testing.T) {
	h := nstest.New(t)
	before := h.Snapshot()
	list := hostLocalList(h, "gc", `"ranges":[[{"subnet":"10.83.0.0/24"}],[{"subnet":"fd83::/64"}]]`)
	other := hostLocalList(h, "gc2", `"ranges":[[{"subnet":"10.84.0.0/24"}]]`)
	pod := h.NewPod()
	var rts []*libcni.RuntimeConf
	for _, a := range [][2]string{{"a", "eth0"}, {"a", "net1"}, {"b", "eth0"}, {"c", "eth0"}} {
		rt := h.RT(pod, a[1], nstest.WithContainerID(a[0]))
		rts = append(rts, rt)
		h.MustAdd(list, rt)
		h.MustAdd(other, rt)
	}
	if err := h.GC(list, []types.GCAttachment{{ContainerID: "a", IfName: "eth0"}, {ContainerID: "c", IfName: "eth0"}}); err != nil {
		t.Fatal(err)
	}
	var owners []string
	for _, v := range leaseFiles(t, h, list) {
		owners = append(owners, v)
	}
	sort.Strings(owners)
	if d := cmp.Diff([]string{`a\r\neth0`, `a\r\neth0`, `c\r\neth0`, `c\r\neth0`}, owners); d != "" {
		t.Errorf("leases after GC (-want +got):\n%s", d)
	}
	if got := len(leaseFiles(t, h, other)); got != 4 {
		t.Errorf("GC of one network touched another: %d leases left of 4", got)
	}
	t.Log("GC released a/net1 and b/eth0, kept a/eth0 and c/eth0 and the other network's leases")
	// An empty valid list means every lease of the network is stale.
	if err := h.GC(other, []types.GCAttachment{}); err != nil {
		t.Fatal(err)
	}
	if got := leaseFiles(t, h, other); len(got) != 0 {
		t.Errorf("GC with no valid attachments left %v", got)
	}
	for _, rt := range rts {
		h.MustDel(list, rt)
	}
	h.RequireUnchanged(before)
}

func TestHostLocalStatus(t *testing.T) {
	h := nstest.New(t)
	before := h.Snapshot()
	list := hostLocalList(h, "st", `"ranges":[[{"subnet":"10.85.0.0/24","rangeStart":"10.85.0.10","rangeEnd":"10.85.0.12"}],[{"subnet":"fd85::/64"}]]`)
	pod := h.NewPod()
	if err := h.Status(list); err != nil {
		t.Fatalf("STATUS on an empty network: %v", err)
	}
	var rts []*libcni.RuntimeConf
	for i := 0; i < 3; i++ {
		rt := h.RT(pod, "eth0", nstest.WithContainerID(fmt.Sprint("s", i)))
		rts = append(rts, rt)
		h.MustAdd(list, rt)
	}
	err := h.Status(list)
	e, ok := cniErr(err)
	if !ok || e.Code != 50 || !strings.Contains(e.Error(), "range set 0 (10.85.0.10-10.85.0.12)") || !strings.Contains(e.Error(), "exhausted") {
		t.Fatalf("STATUS on an exhausted range: %v, want code 50 naming the range", err)
	}
	t.Logf("STATUS: %v", err)
	_, err = h.Add(list, h.RT(pod, "eth0", nstest.WithContainerID("s9")))
	if e, ok := cniErr(err); !ok || e.Code != 50 {
		t.Errorf("ADD on an exhausted range: %v, want code 50", err)
	}
	h.MustDel(list, rts[1])
	if err := h.Status(list); err != nil {
		t.Errorf("STATUS after a DEL: %v", err)
	}
	for _, rt := range rts {
		h.MustDel(list, rt)
	}

	// A data dir on a read-only filesystem.
	ro := t.TempDir()
	if err := unix.Mount("podwire-ro", ro, "tmpfs", unix.MS_RDONLY, "size=1m"); err != nil {
		t.Fatalf("mounting a read-only tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(ro, unix.MNT_DETACH); err != nil {
			t.Errorf("unmounting %s: %v", ro, err)
		}
	})
	roList := h.Conflist(`{"cniVersion":"1.1.0","name":"@PREFIX@-ro","plugins":[{"type":"host-local","ipam":{"type":"host-local","dataDir":"` + ro + `","ranges":[[{"subnet":"10.86.0.0/24"}]]}}]}`)
	err = h.Status(roList)
	if e, ok := cniErr(err); !ok || e.Code != 50 || !strings.Contains(e.Error(), "read-only file system") {
		t.Errorf("STATUS with a read-only data dir: %v", err)
	}
	t.Logf("STATUS read-only: %v", err)
	_, err = h.Add(roList, h.RT(pod, "eth0"))
	if e, ok := cniErr(err); !ok || e.Code != 5 {
		t.Errorf("ADD with a read-only data dir: %v, want code 5", err)
	}
	h.RequireUnchanged(before)
}

// TestHostLocalBadInput runs the binary on bad configurations: a code-7 error naming
// the key, a non-zero exit, and nothing written.
// TestHostLocalCNIArgsOnDEL: DEL goes on with CNI_ARGS ADD would refuse (an unknown
// key without IgnoreUnknown=1; the reference's DEL refuses them and keeps the lease),
// warns on stderr, and releases the lease: a DEL must not refuse to tear down.
func TestHostLocalCNIArgsOnDEL(t *testing.T) {
	h := nstest.New(t)
	pod := h.NewPod()
	conf := `{"cniVersion":"1.1.0","name":"` + h.Name("args") + `","type":"host-local","ipam":{"type":"host-local","dataDir":"` + h.DataDir + `","ranges":[[{"subnet":"10.0.0.0/24"}]]}}`
	env := func(cmd, args string) map[string]string {
		return map[string]string{"CNI_COMMAND": cmd, "CNI_CONTAINERID": "c1", "CNI_IFNAME": "eth0", "CNI_NETNS": pod.Path(), "CNI_ARGS": args}
	}
	if out, exit := h.Exec("host-local", env("ADD", "K8S_POD_NAME=p"), conf); exit == 0 {
		t.Fatalf("ADD with an unknown CNI_ARGS key and no IgnoreUnknown succeeded: %s", out)
	}
	if out, exit := h.Exec("host-local", env("ADD", "IgnoreUnknown=1;K8S_POD_NAME=p"), conf); exit != 0 {
		t.Fatalf("ADD: exit %d: %s", exit, out)
	}
	lease := filepath.Join(h.DataDir, h.Name("args"), "10.0.0.2")
	if _, err := os.Stat(lease); err != nil {
		t.Fatalf("no lease after ADD: %v", err)
	}
	if out, exit := h.Exec("host-local", env("DEL", "K8S_POD_NAME=p"), conf); exit != 0 {
		t.Fatalf("DEL with an unknown key: exit %d, %s; want success", exit, out)
	}
	if _, err := os.Stat(lease); !os.IsNotExist(err) {
		t.Fatalf("lease still there after DEL: %v", err)
	}
}

func TestHostLocalBadInput(t *testing.T) {
	h := nstest.New(t)
	pod := h.NewPod()
	before := h.Snapshot()
	env := map[string]string{"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "bad", "CNI_IFNAME": "eth0", "CNI_NETNS": pod.Path()}
	conf := func(ipam string) string {
		return `{"cniVersion":"1.1.0","name":"bad","type":"host-local","ipam":{"type":"host-local","dataDir":"` + h.DataDir + `",` + ipam + `}}`
	}
	for _, tc := range []struct {
		name, stdin, args string
		code              uint
		key               string
	}{
		{"no ranges", conf(`"routes":[]`), "", 7, "ipam.ranges"},
		{"subnet with host bits", conf(`"ranges":[[{"subnet":"10.0.0.1/24"}]]`), "", 7, "ipam.ranges[0][0].subnet"},
		{"gateway outside subnet", conf(`"ranges":[[{"subnet":"10.0.0.0/24","gateway":"10.1.0.1"}]]`), "", 7, "ipam.ranges[0][0].gateway"},
		{"rangeStart after rangeEnd", conf(`"ranges":[[{"subnet":"10.0.0.0/24","rangeStart":"10.0.0.9","rangeEnd":"10.0.0.5"}]]`), "", 7, "ipam.ranges[0][0].rangeStart"},
		{"overlapping range sets", conf(`"ranges":[[{"subnet":"10.0.0.0/24"}],[{"subnet":"10.0.0.0/25"}]]`), "", 7, "ipam.ranges[1]"},
		{"v4 range in v6 subnet", conf(`"ranges":[[{"subnet":"fd00::/64","rangeEnd":"10.0.0.9"}]]`), "", 7, "ipam.ranges[0][0].rangeEnd"},
		{"legacy subnet too small", conf(`"subnet":"10.0.0.0/31"`), "", 7, "ipam.subnet"},
		{"relative dataDir", `{"cniVersion":"1.1.0","name":"bad","ipam":{"dataDir":"x","ranges":[[{"subnet":"10.0.0.0/24"}]]}}`, "", 7, "ipam.dataDir"},
		{"unreadable resolvConf", conf(`"resolvConf":"/nonexistent/resolv.conf","ranges":[[{"subnet":"10.0.0.0/24"}]]`), "", 7, "ipam.resolvConf"},
		{"CNI_ARGS IP garbage", conf(`"ranges":[[{"subnet":"10.0.0.0/24"}]]`), "IP=nope", 4, "CNI_ARGS"},
		{"CNI_ARGS unknown key", conf(`"ranges":[[{"subnet":"10.0.0.0/24"}]]`), "K8S_POD_NAME=p", 4, "CNI_ARGS"},
		{"CNI_ARGS ip= in lower case", conf(`"ranges":[[{"subnet":"10.0.0.0/24"}]]`), "ip=10.0.0.9", 4, "CNI_ARGS"},
		{"no ipam", `{"cniVersion":"1.1.0","name":"bad","type":"host-local"}`, "", 7, "ipam"},
		{"ranges not a list", conf(`"ranges":{}`), "", 6, "network configuration"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := map[string]string{}
			for k, v := range env {
				e[k] = v
			}
			if tc.args != "" {
				e["CNI_ARGS"] = tc.args
			}
			out, exit := h.Exec("host-local", e, tc.stdin)
			if exit == 0 {
				t.Fatalf("exit 0: %s", out)
			}
			ce, err := nstest.CNIError(out)
			if err != nil {
				t.Fatal(err)
			}
			if ce.Code != tc.code || !strings.Contains(ce.Msg, tc.key) {
				t.Errorf("got code %d %q, want code %d naming %s", ce.Code, ce.Error(), tc.code, tc.key)
			}
		})
	}
	h.RequireUnchanged(before)
	if ents, _ := os.ReadDir(h.DataDir); len(ents) != 0 {
		t.Errorf("bad input created %v in the data dir", ents)
	}
}

// TestHostLocalSIGTERMWhileWaitingForLock: a host-local ADD blocked on the lease
// directory's lock (held here, as another process would) ends with code 11 when the
// runtime sends SIGTERM, and leaves no lease.
func TestHostLocalSIGTERMWhileWaitingForLock(t *testing.T) {
	h := nstest.New(t)
	pod := h.NewPod()
	before := h.Snapshot()
	name := h.Name("sigterm")
	dir := filepath.Join(h.DataDir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	lf, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	if err := unix.Flock(int(lf.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	conf := `{"cniVersion":"1.1.0","name":"` + name + `","type":"host-local","ipam":{"type":"host-local","dataDir":"` +
		h.DataDir + `","ranges":[[{"subnet":"10.82.0.0/24"}]]}}`
	var cmd *exec.Cmd
	var stdout strings.Builder
	if err := h.InHost(func() error {
		cmd = exec.Command(filepath.Join(h.BinDir, "host-local"))
		cmd.Env = []string{"CNI_PATH=" + h.BinDir, "CNI_COMMAND=ADD", "CNI_CONTAINERID=sigterm1",
			"CNI_IFNAME=eth0", "CNI_NETNS=" + pod.Path()}
		cmd.Stdin = strings.NewReader(conf)
		cmd.Stdout = &stdout
		return cmd.Start()
	}); err != nil {
		t.Fatal(err)
	}
	// Wait until one of its threads sits in flock(2): the verb is then waiting on the
	// lock and has asked for the context's Done channel.
	deadline := time.Now().Add(20 * time.Second)
	for !inSyscall(cmd.Process.Pid, unix.SYS_FLOCK) {
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("host-local never waited in flock; stdout %q", stdout.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := cmd.Process.Signal(unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("after SIGTERM: %v (want exit status 1, not death by signal); stdout %q", err, stdout.String())
	}
	ce, err := nstest.CNIError(stdout.String())
	if err != nil {
		t.Fatal(err)
	}
	if ce.Code != 11 {
		t.Errorf("code %d %q, want 11 (try again later)", ce.Code, ce.Error())
	}
	_ = unix.Flock(int(lf.Fd()), unix.LOCK_UN)
	list := h.Conflist(`{"cniVersion":"1.1.0","name":"` + name + `","plugins":[{"type":"host-local","ipam":{"type":"host-local","dataDir":"@DATADIR@","ranges":[[{"subnet":"10.82.0.0/24"}]]}}]}`)
	if got := leaseFiles(t, h, list); len(got) != 0 {
		t.Errorf("leases after the cancelled ADD: %v", got)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	h.RequireUnchanged(before)
}

// inSyscall reports whether a thread of pid is inside system call nr.
func inSyscall(pid int, nr int) bool {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/syscall", pid))
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if fields := strings.Fields(string(b)); len(fields) > 0 && fields[0] == fmt.Sprint(nr) {
			return true
		}
	}
	return false
}
