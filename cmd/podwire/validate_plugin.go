// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/podwire/podwire/pkg/confkeys"
	"github.com/podwire/podwire/pkg/ipam"
	"github.com/podwire/podwire/pkg/netfilter"
)

// boolKeys are keys whose value must be a JSON boolean; a quoted "true" is a
// different thing to the plugins (the reference's Go decoding refuses it with a
// message naming internal types).
var boolKeys = []string{"isGateway", "isDefaultGateway", "forceAddress", "ipMasq", "hairpinMode", "promiscMode",
	"preserveDefaultVlan", "macspoofchk", "enabledad", "disableContainerInterface", "portIsolation", "snat", "masqAll",
	"disableCheck", "disableGC"}

// mainPlugins create the pod's interface; chained plugins must come after one.
var mainPlugins = []string{"bridge", "ptp", "macvlan", "ipvlan", "host-device", "vlan", "dummy", "tap", "vrf"}

// entry checks one plugin entry at index i of entries.
func (v *validator) entry(where string, m map[string]any, entries []map[string]any, i int) {
	typ, _ := m["type"].(string)
	label := where
	if typ != "" && where != "" {
		label = fmt.Sprintf("%s (%s)", where, typ)
	}
	if typ == "" {
		v.errorf(join(where, "type"), `the entry has no "type": it names the plugin binary to run, e.g. "bridge"`)
		return
	}
	v.binary(join(label, "type"), typ, confkeys.Names())
	for _, k := range boolKeys {
		if x, ok := m[k]; ok {
			if _, isBool := x.(bool); !isBool {
				v.errorf(join(label, k), "%q must be true or false (no quotes), not %s", k, jsonKind(x))
			}
		}
	}
	known, ours := confkeys.Known(typ)
	if !ours {
		return // another project's plugin: its keys are not podwire's to judge
	}
	v.unknownKeys(label, m, known)
	v.capabilities(label, typ, m)
	switch typ {
	case "bridge":
		v.backendKey(label, m, "ipMasqBackend")
		v.ipam(label, m)
	case "portmap", "bandwidth":
		v.chained(label, typ, entries, i)
		if typ == "portmap" {
			v.backendKey(label, m, "backend")
		}
	}
}

// binary checks that the plugin typ is in one of the plugin directories.
func (v *validator) binary(where, typ string, names []string) {
	for _, d := range v.binDirs {
		if st, err := os.Stat(filepath.Join(d, typ)); err == nil && !st.IsDir() {
			return
		}
	}
	var have []string
	for _, d := range v.binDirs {
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			have = append(have, e.Name())
		}
	}
	hint := ""
	if s := suggest(typ, append(have, names...)); s != "" && s != typ {
		hint = fmt.Sprintf(" (did you mean %q?)", s)
	}
	v.errorf(where, "plugin %q is not in the plugin directories %s%s: every ADD would fail; install it there (make install) or fix \"type\" (CNI_PATH or --bin-dir name the directories)", typ, strings.Join(v.binDirs, ":"), hint)
}

// capabilities checks the capabilities object and what a plugin needs of it.
func (v *validator) capabilities(label, typ string, m map[string]any) {
	raw, ok := m["capabilities"]
	caps, isObj := raw.(map[string]any)
	if ok && !isObj {
		v.errorf(join(label, "capabilities"), `"capabilities" must be an object such as {"portMappings": true}, not %s`, jsonKind(raw))
		return
	}
	known := confkeys.Capabilities[typ]
	for k, x := range caps {
		if !slices.Contains(known, k) {
			if s := suggest(k, known); s != "" {
				v.errorf(join(label, "capabilities."+k), "unknown capability %q: did you mean %q? the runtime passes only the capabilities the entry names", k, s)
			}
		} else if x != true {
			v.warnf(join(label, "capabilities."+k), "capability %q is not true: the runtime will not pass it", k)
		}
	}
	switch {
	case typ == "portmap" && caps["portMappings"] != true:
		v.errorf(join(label, "capabilities"), `portmap without "capabilities": {"portMappings": true} maps nothing: the runtime passes a pod's hostPorts only to entries that ask for them; add it`)
	case typ == "bandwidth" && caps["bandwidth"] != true && m["ingressRate"] == nil && m["egressRate"] == nil:
		v.errorf(join(label, "capabilities"), `bandwidth without "capabilities": {"bandwidth": true} (or ingressRate/egressRate) shapes nothing: the runtime passes a pod's bandwidth annotations only to entries that ask for them; add it`)
	}
}

// chained checks that a chained plugin comes after a plugin that makes the interface.
func (v *validator) chained(label, typ string, entries []map[string]any, i int) {
	for _, e := range entries[:i] {
		if t, _ := e["type"].(string); slices.Contains(mainPlugins, t) {
			return
		}
	}
	v.errorf(label, "%s is a chained plugin: it works on the interface an earlier entry made (bridge, ptp, ...), so it must come after that entry in \"plugins\"", typ)
}

// backendKey checks a netfilter backend name.
func (v *validator) backendKey(label string, m map[string]any, key string) {
	x, ok := m[key]
	if !ok {
		return
	}
	s, _ := x.(string)
	if _, err := netfilter.ParseKind(key, s); err != nil || !isString(x) {
		v.errorf(join(label, key), "%q must be \"iptables\" or \"nftables\" (or left out to pick automatically), not %s", key, jsonText(x))
	}
}

func isString(x any) bool { _, ok := x.(string); return ok }

func jsonText(x any) string {
	b, _ := json.Marshal(x)
	return string(b)
}

// ipam checks a host-local ipam section: its keys, the shape of "ranges" and each
// range's keys, then host-local's own parser for values.
func (v *validator) ipam(label string, m map[string]any) {
	raw, ok := m["ipam"]
	if !ok {
		return // layer 2 only
	}
	where := join(label, "ipam")
	im, isObj := raw.(map[string]any)
	if !isObj {
		v.errorf(where, `"ipam" must be an object such as {"type": "host-local", "ranges": [[{"subnet": "10.244.1.0/24"}]]}, not %s`, jsonKind(raw))
		return
	}
	typ, _ := im["type"].(string)
	if typ == "" {
		v.errorf(join(where, "type"), `"ipam" has no "type": name the IPAM plugin, e.g. "host-local"`)
		return
	}
	v.binary(join(where, "type"), typ, []string{"host-local"})
	if typ != "host-local" {
		return
	}
	v.unknownKeys(where, im, confkeys.IPAM)
	shapeOK := true
	if r, ok := im["ranges"]; ok {
		shapeOK = v.ranges(join(where, "ranges"), r)
	}
	if _, hasSubnet := im["subnet"]; !hasSubnet && im["ranges"] == nil {
		v.errorf(where, `host-local has no addresses to give: add "ranges": [[{"subnet": "10.244.1.0/24"}]]`)
		return
	}
	if !shapeOK {
		return
	}
	m2 := map[string]any{}
	for k, x := range m {
		m2[k] = x
	}
	if _, ok := m2["name"]; !ok {
		m2["name"] = "validate"
	}
	b, _ := json.Marshal(m2)
	if _, err := ipam.ParseConf(b, ""); err != nil {
		v.errorf(where, "host-local refuses it: %v", err)
	}
}

// ranges checks that ranges is a list of range sets, each a list of ranges.
func (v *validator) ranges(where string, raw any) bool {
	sets, ok := raw.([]any)
	if !ok {
		v.errorf(where, `"ranges" is a list of range sets, each a list of ranges: [[{"subnet": "10.244.1.0/24"}]], not %s`, jsonKind(raw))
		return false
	}
	good := true
	for i, set := range sets {
		rs, ok := set.([]any)
		if !ok {
			if _, isObj := set.(map[string]any); isObj {
				v.errorf(fmt.Sprintf("%s[%d]", where, i), `ranges is a list of range sets: [[{...}]], not [{...}]: each range set is a list of ranges (one address is taken from each set, so dual-stack is [[{IPv4 range}], [{IPv6 range}]]); wrap this range in [ ]`)
			} else {
				v.errorf(fmt.Sprintf("%s[%d]", where, i), "a range set must be a list of ranges [{\"subnet\": ...}], not %s", jsonKind(set))
			}
			good = false
			continue
		}
		for j, r := range rs {
			rm, ok := r.(map[string]any)
			w := fmt.Sprintf("%s[%d][%d]", where, i, j)
			if !ok {
				v.errorf(w, "a range must be an object {\"subnet\": ...}, not %s", jsonKind(r))
				good = false
				continue
			}
			v.unknownKeys(w, rm, confkeys.Range)
		}
	}
	return good
}
