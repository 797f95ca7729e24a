// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/podwire/podwire/integration/nstest"
	"github.com/podwire/podwire/pkg/netfilter"
)

// Issue 14's acceptance for names: interface names and container IDs at the edge of
// what the CNI spec allows, through the whole chain (bridge with ipMasq and
// host-local, portmap with a host port).
//
// What gets through: libcni and skel check CNI_IFNAME as the spec says (1-15 bytes,
// not "." or "..", no "/", ":" or whitespace), so `"`, `\`, `'`, `$` and `;` reach
// the plugins; container IDs must match ^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$, with no length
// limit. libcni caches each attachment's result in a file named
// <network>-<containerID>-<ifname>, so it cannot ADD an attachment whose file name
// would pass 255 bytes (it fails after every plugin succeeded); a 1,000-character ID
// therefore runs through directRuntime, the same plugin sequence without that cache.

// namesConf is bridge (dual stack, ipMasq unless noMasq) + host-local + portmap, with
// both netfilter backends set to kind.
func namesConf(h *nstest.H, kind netfilter.Kind, noMasq bool) *libcni.NetworkConfigList {
	return h.Conflist(`{"cniVersion":"1.1.0","name":"@PREFIX@net","plugins":[
	 {"type":"bridge","bridge":"@PREFIX@br","isGateway":true,"isDefaultGateway":true,"hairpinMode":true,
	  "ipMasq":` + fmt.Sprint(!noMasq) + `,"ipMasqBackend":"` + string(kind) + `",
	  "ipam":{"type":"host-local","ranges":[[{"subnet":"10.77.0.0/24"}],[{"subnet":"fd77::/64"}]],"dataDir":"@DATADIR@"}},
	 {"type":"portmap","capabilities":{"portMappings":true},` + pmBackend(kind) + `}]}`)
}

// chainRunner runs ADD, CHECK and DEL of one attachment the way some runtime does.
type chainRunner interface {
	Add() (*current.Result, error)
	Check() error
	Del() error
}

// libcniRuntime is containerd's and CRI-O's way: libcni with its result cache.
type libcniRuntime struct {
	h    *nstest.H
	list *libcni.NetworkConfigList
	rt   *libcni.RuntimeConf
}

func (r libcniRuntime) Add() (*current.Result, error) { return r.h.Add(r.list, r.rt) }
func (r libcniRuntime) Check() error                  { return r.h.Check(r.list, r.rt) }
func (r libcniRuntime) Del() error                    { return r.h.Del(r.list, r.rt) }

// directRuntime runs the list's plugin binaries one by one as libcni does — the same
// injected name, cniVersion, runtimeConfig (for the capabilities a plugin declares) and
// prevResult, ADD and CHECK in order, DEL in reverse with the ADD result — keeping the
// result in memory instead of libcni's cache file.
type directRuntime struct {
	h      *nstest.H
	list   *libcni.NetworkConfigList
	rt     *libcni.RuntimeConf
	result json.RawMessage // the last successful ADD's result
}

func (r *directRuntime) run(command string, p *libcni.PluginConfig, prev json.RawMessage) (string, error) {
	inject := map[string]any{"name": r.list.Name, "cniVersion": r.list.CNIVersion}
	if prev != nil {
		inject["prevResult"] = prev
	}
	rc := map[string]any{}
	for c, ok := range p.Network.Capabilities {
		if v, has := r.rt.CapabilityArgs[c]; ok && has {
			rc[c] = v
		}
	}
	if len(rc) > 0 {
		inject["runtimeConfig"] = rc
	}
	conf, err := libcni.InjectConf(p, inject)
	if err != nil {
		return "", err
	}
	// PATH as libcni passes it (the runtime's environment): plugins find iptables there.
	out, code := r.h.Exec(p.Network.Type, map[string]string{"PATH": os.Getenv("PATH"),
		"CNI_COMMAND": command, "CNI_CONTAINERID": r.rt.ContainerID, "CNI_NETNS": r.rt.NetNS, "CNI_IFNAME": r.rt.IfName,
	}, string(conf.Bytes))
	if code != 0 {
		e, perr := nstest.CNIError(out)
		if perr != nil {
			return "", fmt.Errorf("plugin %s (%s): exit %d: %v", p.Network.Type, command, code, perr)
		}
		return "", fmt.Errorf("plugin %s (%s): %w", p.Network.Type, command, e)
	}
	return out, nil
}

func (r *directRuntime) Add() (*current.Result, error) {
	var prev json.RawMessage
	for _, p := range r.list.Plugins {
		out, err := r.run("ADD", p, prev)
		if err != nil {
			return nil, err
		}
		prev = json.RawMessage(out)
	}
	r.result = prev
	res, err := current.NewResult(prev)
	if err != nil {
		return nil, fmt.Errorf("parsing the ADD result: %w\n%s", err, prev)
	}
	return current.GetResult(res)
}

func (r *directRuntime) Check() error {
	if r.result == nil {
		return fmt.Errorf("CHECK without a successful ADD")
	}
	for _, p := range r.list.Plugins {
		if _, err := r.run("CHECK", p, r.result); err != nil {
			return err
		}
	}
	return nil
}

func (r *directRuntime) Del() error {
	var errs []string
	for i := len(r.list.Plugins) - 1; i >= 0; i-- {
		if _, err := r.run("DEL", r.list.Plugins[i], r.result); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

// longContainerID is n characters of what the spec allows in a container ID.
func longContainerID(n int) string {
	const allowed = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_.-"
	var b strings.Builder
	b.WriteString("c")
	for b.Len() < n {
		b.WriteByte(allowed[b.Len()%len(allowed)])
	}
	return b.String()
}

// nameCase is one attachment of TestHostileNames.
type nameCase struct {
	name, ifName string
	id           func(network string) string // nil keeps the harness's ID
	direct       bool                        // run through directRuntime
	noMasq       bool                        // bridge without ipMasq: portmap's part alone
}

// TestHostileNames attaches one pod per case, on both netfilter backends (portmap's
// backend and bridge's ipMasqBackend alike): ADD succeeds and creates the interface by
// that name; the host port forwards from an external client, from 127.0.0.1 and
// hairpin; the pod's own connections leave masqueraded; CHECK passes; GC listing the
// attachment keeps it working; DEL and then GC listing nothing leave the node exactly
// as it was.
func TestHostileNames(t *testing.T) {
	cases := []nameCase{
		{name: "ifname with a quote", ifName: `eth"0`},
		{name: "ifname ending in a backslash", ifName: `eth0\`},
		{name: "ifname of 15 characters", ifName: "eth0-abcdefghij"},
		{name: "ifname of 15 quoting characters", ifName: `"a"b\c'd$e;f!g\`},
		// The longest ID whose cache file name libcni can write (255 bytes).
		{name: "container ID libcni's longest", ifName: "eth0", id: func(network string) string {
			return longContainerID(255 - len(network) - len("-") - len("-eth0"))
		}},
		{name: "container ID of 1000 characters", ifName: "eth0", direct: true, id: func(string) string { return longContainerID(1000) }},
		{name: "container ID of 1000 characters without ipMasq", ifName: "eth0", direct: true, noMasq: true, id: func(string) string { return longContainerID(1000) }},
	}
	for _, c := range cases {
		if len(c.ifName) > 15 {
			t.Fatalf("case %q: interface name %q is longer than 15 bytes", c.name, c.ifName)
		}
	}
	for _, kind := range pmBackends {
		t.Run(string(kind), func(t *testing.T) {
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) { hostileName(t, kind, c) })
			}
		})
	}
}

func hostileName(t *testing.T, kind netfilter.Kind, c nameCase) {
	h := nstest.New(t)
	client := pmNode(t, h)
	list := namesConf(h, kind, c.noMasq)
	pmForgetMarkers(t, list.Name)
	pmWarmUp(t, h, list)
	before := h.Snapshot()

	pod := h.NewPod()
	pmServe(t, pod, "pod", 80)
	pmServe(t, client, "client", 7000)
	rt := h.RT(pod, c.ifName, pmMap("tcp:8080:80", "udp:8080:80"))
	if c.id != nil {
		rt.ContainerID = c.id(list.Name)
	}
	var run chainRunner = libcniRuntime{h, list, rt}
	if c.direct {
		run = &directRuntime{h: h, list: list, rt: rt}
	}
	t.Logf("interface %q, container ID of %d characters", rt.IfName, len(rt.ContainerID))
	attachment := types.GCAttachment{ContainerID: rt.ContainerID, IfName: rt.IfName}

	res, err := run.Add()
	if err != nil {
		t.Errorf("ADD: %v", err)
	} else {
		if out, err := nstest.RunIn(pod, "ip", "-o", "link", "show", "dev", c.ifName); err != nil {
			t.Errorf("no interface %q in the pod: %v\n%s", c.ifName, err, out)
		}
		working := func(when string) {
			pmExpect(t, when+": external tcp", client, "tcp", pmNode4+":8080", "pod", pmClient4)
			pmExpect(t, when+": external udp", client, "udp", pmNode4+":8080", "pod", pmClient4)
			pmExpect(t, when+": external tcp ipv6", client, "tcp", "["+pmNode6+"]:8080", "pod", pmClient6)
			pmExpect(t, when+": localhost", h.HostNS, "tcp", "127.0.0.1:8080", "pod", pmGW4)
			pmExpect(t, when+": hairpin", pod, "tcp", pmNode4+":8080", "pod", pmGW4)
			// ipMasq: the client sees the node's address, not the pod's.
			if !c.noMasq {
				pmExpect(t, when+": masquerade", pod, "tcp", pmClient4+":7000", "client", pmNode4)
			}
			if err := run.Check(); err != nil {
				t.Errorf("%s: CHECK: %v", when, err)
			}
		}
		working("after ADD")
		// GC that lists the attachment must keep everything of it.
		if err := h.GC(list, []types.GCAttachment{attachment}); err != nil {
			t.Errorf("GC listing the attachment: %v", err)
		}
		working("after a GC listing it")
		if t.Failed() {
			t.Logf("pod %s; portmap's and ipMasq's rules:\n%s%s", pmAddr(t, res, false), pmRules(t, h),
				h.Run(h.HostNS, "sh", "-c", "nft list table inet cni_plugins_masquerade 2>/dev/null; true"))
		}
	}

	if err := run.Del(); err != nil {
		t.Errorf("DEL: %v", err)
	}
	if err := h.GC(list, []types.GCAttachment{}); err != nil {
		t.Errorf("GC after DEL: %v", err)
	}
	if m := pmMarkers(t, list.Name); len(m) != 0 {
		t.Errorf("portmap markers left after DEL and GC: %v", m)
	}
	pmSettle(t, h)
	h.RequireUnchanged(before)
}
