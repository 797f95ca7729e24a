// SPDX-License-Identifier: Apache-2.0

// Package ipam is host-local's address management: configuration parsing (ranges,
// range sets, requested addresses), the round-robin allocator, and the Store seam with
// an in-memory Fake. The reference-compatible on-disk store is in pkg/ipam/disk.
//
// Parsing and allocation are pure: they read no files and need no root.
package ipam

import (
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"reflect"
	"strings"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/podwire/podwire/pkg/cniplumb"
)

// DefaultDataDir is where leases live when ipam.dataDir is not set (the reference's
// default, so both binaries share one store).
const DefaultDataDir = "/var/lib/cni/networks"

// Conf is a validated host-local configuration.
type Conf struct {
	Network    string         // the network name: the lease directory under DataDir
	DataDir    string         // absolute, cleaned
	ResolvConf string         // path of a resolv.conf-format file, or ""
	Routes     []*types.Route // copied into the result
	RangeSets  []RangeSet     // one address is allocated from each
	// Requested maps a range set index to the address asked for in it (CNI_ARGS IP=,
	// args.cni.ips or runtimeConfig.ips).
	Requested map[int]Request
}

// Request is a specific address asked for by the runtime, with where it came from for
// error messages.
type Request struct {
	IP     net.IP
	Source string // "CNI_ARGS IP", "args.cni.ips" or "runtimeConfig.ips"
}

// StoreConf is the part of the configuration DEL and GC need: where the leases are.
// It parses even when the ranges are broken or have changed since ADD, so a DEL can
// always release what an earlier ADD took.
type StoreConf struct {
	Network string
	DataDir string
	// Relative is the dataDir as configured when it was a relative path, which ADD
	// refuses; DataDir is then resolved against the working directory.
	Relative string
}

type rawRange struct {
	Subnet     string `json:"subnet"`
	RangeStart string `json:"rangeStart"`
	RangeEnd   string `json:"rangeEnd"`
	Gateway    string `json:"gateway"`
}

type rawIPAM struct {
	rawRange
	Type       string         `json:"type"`
	Routes     []*types.Route `json:"routes"`
	DataDir    string         `json:"dataDir"`
	ResolvConf string         `json:"resolvConf"`
	Ranges     [][]rawRange   `json:"ranges"`
}

type rawNet struct {
	Name          string   `json:"name"`
	IPAM          *rawIPAM `json:"ipam"`
	RuntimeConfig struct {
		IPRanges [][]rawRange `json:"ipRanges"`
		IPs      []string     `json:"ips"`
	} `json:"runtimeConfig"`
	Args *struct {
		CNI *struct {
			IPs []string `json:"ips"`
		} `json:"cni"`
	} `json:"args"`
}

func decode(stdin []byte) (*rawNet, error) {
	var n rawNet
	if err := json.Unmarshal(stdin, &n); err != nil {
		return nil, cniplumb.DecodeError("network configuration", err)
	}
	if n.IPAM == nil {
		return nil, cniplumb.ConfigError("ipam", `the "ipam" object is missing; host-local reads its ranges from "ipam": {"type": "host-local", "ranges": [...]}`)
	}
	return &n, nil
}

// ParseStoreConf parses only the network name and ipam.dataDir. A relative dataDir,
// which ADD refuses, is resolved against wd (the plugin's working directory, which
// the runtime chose), where the reference host-local would have kept its leases:
// DEL and GC of a pod made with such a conflist must still find them. An empty wd
// refuses it as ADD does.
func ParseStoreConf(stdin []byte, wd string) (*StoreConf, error) {
	n, err := decode(stdin)
	if err != nil {
		return nil, err
	}
	d := n.IPAM.DataDir
	if d != "" && !filepath.IsAbs(d) && wd != "" && filepath.IsAbs(wd) && !strings.ContainsRune(d, 0) {
		return &StoreConf{Network: n.Name, DataDir: filepath.Join(wd, d), Relative: d}, nil
	}
	dir, err := parseDataDir(d)
	if err != nil {
		return nil, err
	}
	return &StoreConf{Network: n.Name, DataDir: dir}, nil
}

func parseDataDir(d string) (string, error) {
	if d == "" {
		return DefaultDataDir, nil
	}
	if !filepath.IsAbs(d) || strings.ContainsRune(d, 0) {
		return "", cniplumb.ConfigError("ipam.dataDir", "%q is not an absolute path; set it to a directory such as %s", d, DefaultDataDir)
	}
	return filepath.Clean(d), nil
}

// EnvArgs are the CNI_ARGS host-local reads, the reference's IPAMEnvArgs: one
// address (IP=10.1.2.7 or IP=10.1.2.7/24; case matters) and IgnoreUnknown.
type EnvArgs struct {
	types.CommonArgs
	IP ArgIP
}

// ArgIP is an address with an optional prefix length, parsed exactly as the reference's
// ip.IP (containernetworking/plugins/pkg/ip, which would link that module's netlink and
// nftables dependencies into host-local): "" is none, "a/n" must be a valid CIDR (its
// address is the one asked for, host bits and all), anything else net.ParseIP.
type ArgIP struct{ IP net.IP }

// UnmarshalText implements encoding.TextUnmarshaler for types.LoadArgs.
func (a *ArgIP) UnmarshalText(b []byte) error {
	s := string(b)
	switch {
	case s == "":
		a.IP = nil
	case strings.Contains(s, "/"):
		ip, _, err := net.ParseCIDR(s)
		if err != nil {
			return fmt.Errorf("invalid IP address %s", s)
		}
		a.IP = ip
	default:
		if a.IP = net.ParseIP(s); a.IP == nil {
			return fmt.Errorf("invalid IP address %s", s)
		}
	}
	return nil
}

// ToIP is the address in its shortest form, or nil.
func (a ArgIP) ToIP() net.IP { return canonical(a.IP) }

// LoadEnvArgs parses CNI_ARGS as the reference's host-local does on every verb
// (cniplumb.LoadArgs): an unknown key without IgnoreUnknown=1, a malformed entry or an
// IP= that is not an address is a code-4 error.
func LoadEnvArgs(cniArgs string) (EnvArgs, error) {
	var a EnvArgs
	err := cniplumb.LoadArgs("host-local", cniArgs, &a)
	return a, err
}

// ParseConf parses and validates the whole configuration (stdin) and the requested
// addresses in cniArgs (CNI_ARGS). Every problem with a key is a code-7 error whose
// message names the key, e.g. "ipam.ranges[0][1].gateway"; malformed JSON is code 6
// and a malformed CNI_ARGS value is code 4.
func ParseConf(stdin []byte, cniArgs string) (*Conf, error) {
	n, err := decode(stdin)
	if err != nil {
		return nil, err
	}
	c := &Conf{Network: n.Name, ResolvConf: n.IPAM.ResolvConf, Requested: map[int]Request{}}
	if c.DataDir, err = parseDataDir(n.IPAM.DataDir); err != nil {
		return nil, err
	}
	for i, r := range n.IPAM.Routes {
		if r == nil || r.Dst.IP == nil {
			return nil, cniplumb.ConfigError(fmt.Sprintf("ipam.routes[%d].dst", i), `a route needs "dst", e.g. {"dst": "0.0.0.0/0"}`)
		}
		c.Routes = append(c.Routes, r)
	}

	// Where the ranges come from, in the reference's order: the ipRanges capability's
	// sets first, then the legacy top-level range, then "ranges".
	var raw [][]rawRange
	var keys []string // key prefix for each raw range set
	for i, s := range n.RuntimeConfig.IPRanges {
		raw = append(raw, s)
		keys = append(keys, fmt.Sprintf("runtimeConfig.ipRanges[%d]", i))
	}
	if legacy := n.IPAM.rawRange; legacy != (rawRange{}) {
		raw = append(raw, []rawRange{legacy})
		keys = append(keys, "ipam")
	}
	for i, s := range n.IPAM.Ranges {
		raw = append(raw, s)
		keys = append(keys, fmt.Sprintf("ipam.ranges[%d]", i))
	}
	if len(raw) == 0 {
		return nil, cniplumb.ConfigError("ipam.ranges", `no address ranges are configured; set "ranges": [[{"subnet": "10.22.0.0/16"}]] (or the legacy "subnet")`)
	}
	for i, s := range raw {
		set, err := parseRangeSet(keys[i], s)
		if err != nil {
			return nil, err
		}
		c.RangeSets = append(c.RangeSets, set)
	}
	for i := range c.RangeSets {
		for j := i + 1; j < len(c.RangeSets); j++ {
			for a := range c.RangeSets[i] {
				for b := range c.RangeSets[j] {
					if c.RangeSets[i][a].overlaps(&c.RangeSets[j][b]) {
						return nil, cniplumb.ConfigError(keys[j], "range %s overlaps range %s of %s; each address may belong to one range set only",
							c.RangeSets[j][b].String(), c.RangeSets[i][a].String(), keys[i])
					}
				}
			}
		}
	}
	if err := c.parseRequests(n, cniArgs); err != nil {
		return nil, err
	}
	return c, nil
}

func parseRangeSet(key string, raw []rawRange) (RangeSet, error) {
	if len(raw) == 0 {
		return nil, cniplumb.ConfigError(key, "the range set is empty; list at least one range, e.g. [{\"subnet\": \"10.22.0.0/16\"}]")
	}
	var set RangeSet
	for j, rr := range raw {
		rkey := key
		if key != "ipam" {
			rkey = fmt.Sprintf("%s[%d]", key, j)
		}
		r, err := parseRange(rkey, rr)
		if err != nil {
			return nil, err
		}
		if j > 0 && len(r.RangeStart) != len(set[0].RangeStart) {
			return nil, cniplumb.ConfigError(rkey+".subnet", "%s is %s but the first range of the set is %s; a range set holds one address family (use a second range set for dual-stack)",
				r.Subnet.String(), family(r.RangeStart), family(set[0].RangeStart))
		}
		for k := range set {
			if set[k].overlaps(&r) {
				return nil, cniplumb.ConfigError(rkey, "range %s overlaps range %s in the same set", r.String(), set[k].String())
			}
		}
		set = append(set, r)
	}
	return set, nil
}

func family(ip net.IP) string {
	if len(ip) == net.IPv4len {
		return "IPv4"
	}
	return "IPv6"
}

func join(key, field string) string {
	if key == "ipam" {
		return "ipam." + field
	}
	return key + "." + field
}

func parseRange(key string, rr rawRange) (Range, error) {
	var r Range
	if rr.Subnet == "" {
		return r, cniplumb.ConfigError(join(key, "subnet"), `"subnet" is missing; set it to a CIDR such as "10.22.0.0/16"`)
	}
	ip, subnet, err := net.ParseCIDR(rr.Subnet)
	if err != nil {
		return r, cniplumb.ConfigError(join(key, "subnet"), "%q is not a CIDR such as 10.22.0.0/16", rr.Subnet)
	}
	if !ip.Equal(subnet.IP) {
		return r, cniplumb.ConfigError(join(key, "subnet"), "%q has host bits set; the network address is %s", rr.Subnet, subnet.String())
	}
	subnet.IP = canonical(subnet.IP)
	if len(subnet.Mask) != len(subnet.IP) {
		// ParseCIDR gives a 4-byte mask for IPv4 and 16 for IPv6; keep them aligned.
		ones, _ := subnet.Mask.Size()
		subnet.Mask = net.CIDRMask(ones, len(subnet.IP)*8)
	}
	ones, bits := subnet.Mask.Size()
	if ones > bits-2 {
		return r, cniplumb.ConfigError(join(key, "subnet"), "%s is too small to allocate from (a /%d has no address besides the network and gateway); use a /%d or larger",
			subnet.String(), ones, bits-2)
	}
	r.Subnet = *subnet
	parse := func(field, v string, def net.IP) (net.IP, error) {
		if v == "" {
			return def, nil
		}
		a := canonical(net.ParseIP(v))
		if a == nil {
			return nil, cniplumb.ConfigError(join(key, field), "%q is not an IP address", v)
		}
		if len(a) != len(subnet.IP) {
			return nil, cniplumb.ConfigError(join(key, field), "%s is %s but subnet %s is %s", v, family(a), subnet.String(), family(subnet.IP))
		}
		if !subnet.Contains(a) {
			return nil, cniplumb.ConfigError(join(key, field), "%s is outside subnet %s", v, subnet.String())
		}
		return a, nil
	}
	if r.Gateway, err = parse("gateway", rr.Gateway, NextIP(subnet.IP)); err != nil {
		return r, err
	}
	if r.RangeStart, err = parse("rangeStart", rr.RangeStart, NextIP(subnet.IP)); err != nil {
		return r, err
	}
	if r.RangeEnd, err = parse("rangeEnd", rr.RangeEnd, lastIP(*subnet)); err != nil {
		return r, err
	}
	if cmpIP(r.RangeStart, r.RangeEnd) > 0 {
		return r, cniplumb.ConfigError(join(key, "rangeStart"), "%s is after rangeEnd %s", r.RangeStart, r.RangeEnd)
	}
	if r.usable().Sign() == 0 {
		return r, cniplumb.ConfigError(join(key, "rangeStart"), "range %s has no usable address: its only address is the gateway %s", r.String(), r.Gateway)
	}
	return r, nil
}

// parseRequests collects the requested addresses and assigns each to its range set.
func (c *Conf) parseRequests(n *rawNet, cniArgs string) error {
	type req struct{ v, source, key string }
	var reqs []req
	args, err := LoadEnvArgs(cniArgs)
	if err != nil {
		return err
	}
	if ip := args.IP.ToIP(); ip != nil {
		reqs = append(reqs, req{ip.String(), "CNI_ARGS IP", "CNI_ARGS"})
	}
	if n.Args != nil && n.Args.CNI != nil {
		for _, s := range n.Args.CNI.IPs {
			reqs = append(reqs, req{s, "args.cni.ips", "args.cni.ips"})
		}
	}
	for _, s := range n.RuntimeConfig.IPs {
		reqs = append(reqs, req{s, "runtimeConfig.ips", "runtimeConfig.ips"})
	}
	for _, rq := range reqs {
		bad := func(format string, a ...any) error {
			if rq.key == "CNI_ARGS" {
				return cniplumb.EnvError("CNI_ARGS", "IP="+format, a...)
			}
			return cniplumb.ConfigError(rq.key, format, a...)
		}
		s := strings.TrimSpace(rq.v)
		if i := strings.IndexByte(s, '/'); i >= 0 {
			s = s[:i] // "10.1.2.3/24" asks for 10.1.2.3, as the reference accepts
		}
		ip := canonical(net.ParseIP(s))
		if ip == nil {
			return bad("%q is not an IP address", rq.v)
		}
		idx := -1
		for i, set := range c.RangeSets {
			if set.Contains(ip) {
				idx = i
			}
		}
		if idx < 0 {
			var all []string
			for _, set := range c.RangeSets {
				all = append(all, set.String())
			}
			return bad("%s is not in any configured range (%s); request an address inside one", ip, strings.Join(all, "; "))
		}
		if ip.Equal(c.RangeSets[idx].RangeFor(ip).Gateway) {
			return bad("%s is the gateway of its subnet and is never handed out", ip)
		}
		if prev, ok := c.Requested[idx]; ok {
			if prev.IP.Equal(ip) {
				continue
			}
			return bad("%s and %s (from %s) are both in range set %d (%s); request at most one address per range set",
				ip, prev.IP, prev.Source, idx, c.RangeSets[idx].String())
		}
		c.Requested[idx] = Request{IP: ip, Source: rq.source}
	}
	return nil
}

// ConfKeys returns the keys host-local reads inside "ipam" and inside one range, from
// its config structs (for `podwire validate`).
func ConfKeys() (ipamKeys, rangeKeys []string) {
	return jsonNames(reflect.TypeOf(rawIPAM{})), jsonNames(reflect.TypeOf(rawRange{}))
}

func jsonNames(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous {
			out = append(out, jsonNames(f.Type)...)
			continue
		}
		if name, _, _ := strings.Cut(f.Tag.Get("json"), ","); name != "" && name != "-" {
			out = append(out, name)
		}
	}
	return out
}
