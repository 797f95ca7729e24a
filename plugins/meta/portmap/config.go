// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/netfilter"
)

// defaultMarkBit is the reference's default markMasqBit (0x2000); kube-proxy uses 14
// and 15, so 13 stays clear of them.
const defaultMarkBit = 13

// Mapping is one validated runtimeConfig.portMappings entry.
type Mapping struct {
	HostPort      uint16
	ContainerPort uint16
	Proto         netfilter.Proto
	HostIP        netip.Addr // zero: every host address
}

// Conf is portmap's validated configuration.
type Conf struct {
	Backend      netfilter.Kind // Auto, or as configured (externalSetMarkChain implies iptables)
	SNAT         bool
	MasqAll      bool
	MarkBit      int
	SetMarkChain string
	Conditions   map[netfilter.Family]netfilter.Match
	Mappings     []Mapping
}

type rawMapping struct {
	HostPort      json.RawMessage `json:"hostPort"`
	ContainerPort json.RawMessage `json:"containerPort"`
	Protocol      json.RawMessage `json:"protocol"`
	HostIP        json.RawMessage `json:"hostIP"`
}

type rawConf struct {
	Backend              *string   `json:"backend"`
	SNAT                 *bool     `json:"snat"`
	MasqAll              *bool     `json:"masqAll"`
	MarkMasqBit          *int      `json:"markMasqBit"`
	ExternalSetMarkChain *string   `json:"externalSetMarkChain"`
	ConditionsV4         *[]string `json:"conditionsV4"`
	ConditionsV6         *[]string `json:"conditionsV6"`
	RuntimeConfig        *struct {
		PortMappings []rawMapping `json:"portMappings"`
	} `json:"runtimeConfig"`
}

// decodeRaw unmarshals stdin, turning a value of the wrong JSON type into a code-7
// error that names the key.
func decodeRaw(stdin []byte) (rawConf, error) {
	var rc rawConf
	if err := json.Unmarshal(stdin, &rc); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return rc, cniplumb.ConfigError(te.Field, "%s must be a JSON %s, not %s", te.Field, jsonKind(te.Type.Kind().String()), te.Value)
		}
		return rc, cniplumb.DecodeError("network configuration", err)
	}
	return rc, nil
}

func jsonKind(goKind string) string {
	switch goKind {
	case "bool":
		return "boolean (true or false)"
	case "int", "int64":
		return "whole number"
	case "slice":
		return "array"
	case "struct", "ptr":
		return "object"
	}
	return goKind
}

// parseConf validates everything portmap reads from its configuration; every problem
// is a code-7 error naming the key and saying what to do. Nothing is probed: the
// backend is chosen later.
func parseConf(stdin []byte) (*Conf, error) {
	rc, err := decodeRaw(stdin)
	if err != nil {
		return nil, err
	}
	c := &Conf{SNAT: true, MarkBit: defaultMarkBit}
	if rc.Backend != nil {
		if c.Backend, err = netfilter.ParseKind("backend", *rc.Backend); err != nil {
			return nil, err
		}
	}
	if rc.SNAT != nil {
		c.SNAT = *rc.SNAT
	}
	if rc.MasqAll != nil {
		c.MasqAll = *rc.MasqAll
	}
	if rc.ExternalSetMarkChain != nil {
		if rc.MarkMasqBit != nil {
			return nil, cniplumb.ConfigError("markMasqBit", "markMasqBit and externalSetMarkChain exclude each other: with externalSetMarkChain the chain's owner (kube-proxy) sets its own mark; remove one of them")
		}
		if err := checkChainName(*rc.ExternalSetMarkChain); err != nil {
			return nil, err
		}
		c.SetMarkChain = *rc.ExternalSetMarkChain
		switch c.Backend {
		case netfilter.KindNFTables:
			return nil, cniplumb.ConfigError("externalSetMarkChain", "externalSetMarkChain %q is an iptables chain, which the nftables backend cannot jump to; use \"backend\": \"iptables\" or remove externalSetMarkChain", c.SetMarkChain)
		case netfilter.Auto:
			c.Backend = netfilter.KindIPTables
		}
	}
	if rc.MarkMasqBit != nil {
		if b := *rc.MarkMasqBit; b < 0 || b > 31 {
			return nil, cniplumb.ConfigError("markMasqBit", "markMasqBit is %d; it must be a bit number 0-31 (default %d)", b, defaultMarkBit)
		}
		c.MarkBit = *rc.MarkMasqBit
	}
	c.Conditions = map[netfilter.Family]netfilter.Match{}
	for _, cs := range []struct {
		key  string
		fam  netfilter.Family
		list *[]string
	}{{"conditionsV4", netfilter.IPv4, rc.ConditionsV4}, {"conditionsV6", netfilter.IPv6, rc.ConditionsV6}} {
		if cs.list == nil {
			continue
		}
		m, ok, err := parseConditions(cs.key, cs.fam, *cs.list)
		if err != nil {
			return nil, err
		}
		if ok {
			c.Conditions[cs.fam] = m
		}
	}
	if rc.RuntimeConfig != nil {
		if c.Mappings, err = parseMappings(rc.RuntimeConfig.PortMappings); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// builtinTargets are iptables verdicts and targets an externalSetMarkChain must not
// name: jumping to them would accept, drop or rewrite packets instead of marking.
var builtinTargets = map[string]bool{"ACCEPT": true, "DROP": true, "RETURN": true, "QUEUE": true, "NFQUEUE": true,
	"REJECT": true, "LOG": true, "DNAT": true, "SNAT": true, "MASQUERADE": true, "MARK": true, "REDIRECT": true,
	"CONNMARK": true, "NETMAP": true, "CT": true, "TRACE": true, "NOTRACK": true}

func checkChainName(s string) error {
	ok := s != "" && len(s) <= 28 && s[0] != '-' && s[0] != '!'
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-' || r == '.') {
			ok = false
		}
	}
	if !ok {
		return cniplumb.ConfigError("externalSetMarkChain", "externalSetMarkChain %q is not an iptables chain name: use 1-28 letters, digits, '_', '-' or '.', such as \"KUBE-MARK-MASQ\"", s)
	}
	if builtinTargets[s] {
		return cniplumb.ConfigError("externalSetMarkChain", "externalSetMarkChain %q is a built-in iptables target, not a chain that marks packets; use a chain such as \"KUBE-MARK-MASQ\"", s)
	}
	return nil
}

func isNull(raw json.RawMessage) bool {
	s := bytes.TrimSpace(raw)
	return len(s) == 0 || bytes.Equal(s, []byte("null"))
}

// parsePort accepts a JSON whole number 1-65535.
func parsePort(raw json.RawMessage) (uint16, string) {
	s := string(bytes.TrimSpace(raw))
	if isNull(raw) {
		return 0, "missing"
	}
	if strings.HasPrefix(s, `"`) {
		return 0, s + " is a string, not a number"
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, s + " is not a whole number"
	}
	if v < 1 || v > 65535 {
		return 0, s + " is outside 1-65535"
	}
	return uint16(v), ""
}

func parseString(raw json.RawMessage) (string, bool) {
	if isNull(raw) {
		return "", true
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", false
	}
	return s, true
}

// parseMappings validates runtimeConfig.portMappings. Identical entries collapse into
// one; two entries for the same protocol, host port and host address that forward to
// different container ports are an error (only one of them could ever match).
func parseMappings(raw []rawMapping) ([]Mapping, error) {
	var out []Mapping
	seen := map[string]Mapping{}
	for i, r := range raw {
		key := fmt.Sprintf("runtimeConfig.portMappings[%d]", i)
		var m Mapping
		var why string
		if m.HostPort, why = parsePort(r.HostPort); why != "" {
			return nil, cniplumb.ConfigError(key+".hostPort", "hostPort %s in mapping %d: hostPort must be 1-65535; set it or drop the mapping", why, i)
		}
		if m.ContainerPort, why = parsePort(r.ContainerPort); why != "" {
			return nil, cniplumb.ConfigError(key+".containerPort", "containerPort %s in mapping %d (hostPort %d): containerPort must be 1-65535", why, i, m.HostPort)
		}
		proto, ok := parseString(r.Protocol)
		if !ok {
			return nil, cniplumb.ConfigError(key+".protocol", "protocol %s for hostPort %d must be a string: \"tcp\", \"udp\" or \"sctp\"", bytes.TrimSpace(r.Protocol), m.HostPort)
		}
		switch p := strings.ToLower(strings.TrimSpace(proto)); p {
		case "":
			m.Proto = netfilter.TCP
		case "tcp", "udp", "sctp":
			m.Proto = netfilter.Proto(p)
		default:
			return nil, cniplumb.ConfigError(key+".protocol", "protocol %q for hostPort %d is not supported; use \"tcp\" (the default), \"udp\" or \"sctp\"", proto, m.HostPort)
		}
		hostIP, ok := parseString(r.HostIP)
		if !ok {
			return nil, cniplumb.ConfigError(key+".hostIP", "hostIP %s for hostPort %d must be a string holding an IP address", bytes.TrimSpace(r.HostIP), m.HostPort)
		}
		if hostIP != "" {
			a, err := netip.ParseAddr(hostIP)
			if err != nil || a.Zone() != "" {
				return nil, cniplumb.ConfigError(key+".hostIP", "hostIP %q for hostPort %d is not an IPv4 or IPv6 address; use an address of this node, or leave hostIP out to listen on all of them", hostIP, m.HostPort)
			}
			m.HostIP = a.Unmap()
		}
		k := fmt.Sprintf("%s/%d/%s", m.Proto, m.HostPort, m.HostIP)
		if prev, dup := seen[k]; dup {
			if prev.ContainerPort != m.ContainerPort {
				return nil, cniplumb.ConfigError(key, "%s hostPort %d%s is mapped twice, to containerPort %d and %d; a host port can forward to one container port only", m.Proto, m.HostPort, hostIPText(m.HostIP), prev.ContainerPort, m.ContainerPort)
			}
			continue
		}
		seen[k] = m
		out = append(out, m)
	}
	return out, nil
}

func hostIPText(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return " on " + a.String()
}

// teardownConf is what DEL and GC need, read leniently: a DEL must not fail because
// the configuration it gets is one ADD would have refused (the reference accepted
// host ports above 65535 and any protocol), or the runtime's DEL chain stops and the
// pod's address leaks.
type teardownConf struct {
	Backend     netfilter.Kind
	HasMappings bool
	UDPPorts    []uint16
}

func parseTeardownConf(stdin []byte) teardownConf {
	var t teardownConf
	rc, err := decodeRaw(stdin)
	if err != nil {
		var loose struct {
			RuntimeConfig struct {
				PortMappings []json.RawMessage `json:"portMappings"`
			} `json:"runtimeConfig"`
		}
		_ = json.Unmarshal(stdin, &loose)
		t.HasMappings = len(loose.RuntimeConfig.PortMappings) > 0
		return t
	}
	if rc.Backend != nil {
		t.Backend, _ = netfilter.ParseKind("backend", *rc.Backend)
	}
	if rc.ExternalSetMarkChain != nil && t.Backend == netfilter.Auto {
		t.Backend = netfilter.KindIPTables
	}
	if rc.RuntimeConfig != nil {
		t.HasMappings = len(rc.RuntimeConfig.PortMappings) > 0
		seen := map[uint16]bool{}
		for _, r := range rc.RuntimeConfig.PortMappings {
			p, why := parsePort(r.HostPort)
			proto, _ := parseString(r.Protocol)
			if why == "" && strings.EqualFold(strings.TrimSpace(proto), "udp") && !seen[p] {
				seen[p] = true
				t.UDPPorts = append(t.UDPPorts, p)
			}
		}
	}
	return t
}
