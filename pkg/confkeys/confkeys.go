// SPDX-License-Identifier: Apache-2.0

// Package confkeys knows the configuration keys every podwire plugin reads, for
// `podwire validate`'s unknown-key check and its "did you mean". The keys are the
// JSON names of the plugins' own config structs: host-local's come from pkg/ipam by
// reflection; the plugins' (package main, which nothing can import) are listed here
// and each plugin has a test that compares this list with its struct by reflection,
// so the two cannot drift.
package confkeys

import (
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/ipam"
)

// List is the keys of a conflist's top level (the spec's, as libcni reads them).
var List = []string{"cniVersion", "cniVersions", "name", "disableCheck", "disableGC", "loadOnlyInlinedPlugins", "plugins"}

// Common is the keys every plugin entry may carry: the spec's (types.PluginConf), what
// runtimes inject (args, runtimeConfig), and the opt-in log every podwire plugin reads.
var Common = slices.Concat(FromStruct(types.PluginConf{}), []string{"args", "runtimeConfig", "cni.dev/attachments"}, FromStruct(cniplumb.LogKeys{}))

// Plugins is each podwire plugin's own keys, beside Common.
var Plugins = map[string][]string{
	"bridge": {"bridge", "isGateway", "isDefaultGateway", "forceAddress", "ipMasq", "ipMasqBackend", "mtu",
		"hairpinMode", "promiscMode", "vlan", "vlanTrunk", "preserveDefaultVlan", "macspoofchk", "enabledad",
		"disableContainerInterface", "portIsolation"},
	"portmap":   {"backend", "snat", "masqAll", "markMasqBit", "externalSetMarkChain", "conditionsV4", "conditionsV6"},
	"bandwidth": {"ingressRate", "ingressBurst", "egressRate", "egressBurst", "unshapedSubnets", "shapedSubnets"},
	"loopback":  {},
}

// IPAM is host-local's keys inside "ipam", and Range those of one range.
var IPAM, Range = ipam.ConfKeys()

// Capabilities is the capabilities podwire's plugins act on, per plugin.
var Capabilities = map[string][]string{
	"portmap":   {"portMappings"},
	"bandwidth": {"bandwidth"},
	"bridge":    {"mac", "ipRanges", "ips"},
}

// FromStruct returns the JSON names of v's fields (a struct or pointer to one), with
// embedded structs' fields flattened in, as encoding/json decodes them.
func FromStruct(v any) []string {
	t := reflect.TypeOf(v)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if f.Anonymous && name == "" {
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				out = append(out, FromStruct(reflect.Zero(ft).Interface())...)
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, name)
	}
	return out
}

// Diff compares plugin's list with the keys of its config struct v (Common's keys in
// v are ignored); "" when they agree. Plugins' tests call it.
func Diff(plugin string, v any) string {
	want := slices.Clone(Plugins[plugin])
	var got []string
	for _, k := range FromStruct(v) {
		if !slices.Contains(Common, k) {
			got = append(got, k)
		}
	}
	sort.Strings(want)
	sort.Strings(got)
	if slices.Equal(want, got) {
		return ""
	}
	return fmt.Sprintf("confkeys.Plugins[%q] = %v, but the config struct has %v: update pkg/confkeys", plugin, want, got)
}

// Known returns the keys a plugin entry of type plugin may carry, and whether podwire
// knows the plugin at all.
func Known(plugin string) ([]string, bool) {
	own, ok := Plugins[plugin]
	return append(slices.Clone(Common), own...), ok
}

// Names is the plugins podwire ships.
func Names() []string { return []string{"bridge", "host-local", "portmap", "bandwidth", "loopback"} }
