// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sort"
	"strings"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/netfilter"
)

const defaultBridge = "cni0"

// netConf is bridge's configuration, with the reference plugin's keys.
type netConf struct {
	types.NetConf
	Bridge                    string       `json:"bridge"`
	IsGateway                 bool         `json:"isGateway"`
	IsDefaultGateway          bool         `json:"isDefaultGateway"`
	ForceAddress              bool         `json:"forceAddress"`
	IPMasq                    bool         `json:"ipMasq"`
	IPMasqBackend             *string      `json:"ipMasqBackend,omitempty"`
	MTU                       int          `json:"mtu"`
	HairpinMode               bool         `json:"hairpinMode"`
	PromiscMode               bool         `json:"promiscMode"`
	Vlan                      int          `json:"vlan"`
	VlanTrunk                 []*vlanTrunk `json:"vlanTrunk,omitempty"`
	PreserveDefaultVlan       bool         `json:"preserveDefaultVlan"`
	MacSpoofChk               bool         `json:"macspoofchk,omitempty"`
	EnableDad                 bool         `json:"enabledad,omitempty"`
	DisableContainerInterface bool         `json:"disableContainerInterface,omitempty"`
	PortIsolation             bool         `json:"portIsolation,omitempty"`

	Args struct {
		Cni struct {
			Mac string `json:"mac,omitempty"`
		} `json:"cni,omitempty"`
	} `json:"args,omitempty"`
	RuntimeConfig struct {
		Mac string `json:"mac,omitempty"`
	} `json:"runtimeConfig,omitempty"`
}

// envArgs are the CNI_ARGS bridge reads, the reference's MacEnvArgs: MAC= (case
// matters) and IgnoreUnknown; see cniplumb.LoadArgs.
type envArgs struct {
	types.CommonArgs
	MAC types.UnmarshallableString
}

type vlanTrunk struct {
	MinID *int `json:"minID,omitempty"`
	MaxID *int `json:"maxID,omitempty"`
	ID    *int `json:"id,omitempty"`
}

// conf is the validated configuration the verbs work from.
type conf struct {
	raw      *netConf
	Bridge   string
	Backend  netfilter.Kind
	MAC      net.HardwareAddr // nil: random
	Trunk    []int            // sorted, distinct
	Layer3   bool             // an IPAM plugin is configured
	IPAMType string
}

// parseConf decodes and validates everything before anything on the node changes.
// args is CNI_ARGS. Every problem is a code-7 error naming the key.
func parseConf(stdin []byte, args string) (*conf, error) { return parse(stdin, args, true) }

// parseStatusConf is parseConf for STATUS, which never uses the MAC.
func parseStatusConf(stdin []byte) (*conf, error) { return parse(stdin, "", false) }

func parse(stdin []byte, args string, wantMAC bool) (*conf, error) {
	n := &netConf{Bridge: defaultBridge}
	if err := json.Unmarshal(stdin, n); err != nil {
		return nil, cniplumb.DecodeError("bridge configuration", err)
	}
	c := &conf{raw: n, Bridge: n.Bridge, IPAMType: n.IPAM.Type, Layer3: n.IPAM.Type != ""}
	if n.IsDefaultGateway {
		n.IsGateway = true
	}
	if msg := checkIfName(n.Bridge); msg != "" {
		return nil, cniplumb.ConfigError("bridge", "bridge name %q %s", n.Bridge, msg)
	}
	if n.MTU < 0 || n.MTU > 65535 {
		return nil, cniplumb.ConfigError("mtu", "mtu %d is out of range; use 68-65535, or 0 for the kernel default", n.MTU)
	}
	if n.MTU > 0 && n.MTU < 68 {
		return nil, cniplumb.ConfigError("mtu", "mtu %d is below IPv4's minimum of 68", n.MTU)
	}
	if n.Vlan < 0 || n.Vlan > 4094 {
		return nil, cniplumb.ConfigError("vlan", "invalid VLAN ID %d (must be between 0 and 4094)", n.Vlan)
	}
	if n.IsGateway && n.Vlan != 0 {
		if gw := vlanGatewayName(n.Bridge, n.Vlan); len(gw) > 15 {
			return nil, cniplumb.ConfigError("bridge", "with vlan %d and isGateway the gateway interface would be named %q, longer than Linux's 15 bytes; use a bridge name of at most %d bytes", n.Vlan, gw, 15-(len(gw)-len(n.Bridge)))
		}
	}
	var err error
	if c.Trunk, err = collectTrunk(n.VlanTrunk); err != nil {
		return nil, err
	}
	if n.HairpinMode && n.PromiscMode {
		return nil, cniplumb.ConfigError("hairpinMode", "cannot set hairpin mode and promiscuous mode at the same time; choose one")
	}
	if c.Layer3 && n.DisableContainerInterface {
		return nil, cniplumb.ConfigError("disableContainerInterface", "cannot use IPAM when disableContainerInterface is set; drop \"ipam\" or the flag")
	}
	if n.IPMasqBackend != nil {
		if c.Backend, err = netfilter.ParseKind("ipMasqBackend", *n.IPMasqBackend); err != nil {
			return nil, err
		}
	}
	// Every verb, as the reference's loadNetConf does for ADD, DEL and CHECK.
	var ea envArgs
	if err := cniplumb.LoadArgs("bridge", args, &ea); err != nil {
		return nil, err
	}
	if wantMAC {
		if c.MAC, err = pickMAC(n, string(ea.MAC)); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// teardownConf is what DEL and GC need of the configuration: which plugin holds the
// lease, which rules ADD may have made, and the bridge (for GC's question whether a
// host veth is this network's).
type teardownConf struct {
	IPAMType    string // "": no IPAM (layer 2)
	IPMasq      bool
	MacSpoofChk bool
	Bridge      string
}

// parseTeardown reads the keys teardown needs one by one, so a conflist edited since
// ADD (a backend typo, an MTU out of range, a bridge name too long, hairpinMode with
// promiscMode...) cannot keep DEL from removing the pod's veth, rules and lease, as
// it does not keep the reference's DEL either. What parseConf would reject is
// returned as warnings for stderr. A key teardown needs that cannot be read is an
// error, after the other steps ran: ipMasq and macspoofchk are then taken as set
// (removing rules that are not there costs a lookup), an unreadable ipam leaves the
// lease alone.
func parseTeardown(stdin []byte) (*teardownConf, []error, error) {
	var warnings []error
	if _, err := parse(stdin, "", false); err != nil {
		warnings = append(warnings, err)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(stdin, &raw); err != nil {
		return nil, nil, cniplumb.DecodeError("bridge configuration", err)
	}
	t := &teardownConf{Bridge: defaultBridge}
	var errs []error
	field := func(key string, v any) bool {
		b, ok := raw[key]
		if !ok || string(b) == "null" {
			return true
		}
		if err := json.Unmarshal(b, v); err != nil {
			errs = append(errs, cniplumb.DecodeError(key, err))
			return false
		}
		return true
	}
	if !field("ipMasq", &t.IPMasq) {
		t.IPMasq = true
	}
	if !field("macspoofchk", &t.MacSpoofChk) {
		t.MacSpoofChk = true
	}
	var ipam struct {
		Type string `json:"type"`
	}
	field("ipam", &ipam)
	t.IPAMType = ipam.Type
	if !field("bridge", &t.Bridge) {
		t.Bridge = ""
	}
	return t, warnings, errors.Join(errs...)
}

// pickMAC applies the reference's precedence: CNI_ARGS MAC= (argsMAC), then
// args.cni.mac, then the "mac" capability (runtimeConfig.mac) wins.
func pickMAC(n *netConf, argsMAC string) (net.HardwareAddr, error) {
	key, mac := "", ""
	if argsMAC != "" {
		key, mac = "CNI_ARGS MAC", argsMAC
	}
	if n.Args.Cni.Mac != "" {
		key, mac = "args.cni.mac", n.Args.Cni.Mac
	}
	if n.RuntimeConfig.Mac != "" {
		key, mac = "runtimeConfig.mac", n.RuntimeConfig.Mac
	}
	if mac == "" {
		return nil, nil
	}
	hw, err := net.ParseMAC(mac)
	if err != nil || len(hw) != 6 {
		return nil, cniplumb.ConfigError(key, "%q is not a MAC address; use six colon-separated hex bytes such as 02:42:0a:00:00:05", mac)
	}
	return hw, nil
}

func collectTrunk(items []*vlanTrunk) ([]int, error) {
	set := map[int]bool{}
	for i, it := range items {
		if it == nil {
			continue
		}
		key := fmt.Sprintf("vlanTrunk[%d]", i)
		switch {
		case it.MinID != nil && it.MaxID != nil:
			lo, hi := *it.MinID, *it.MaxID
			if lo <= 0 || lo > 4094 {
				return nil, cniplumb.ConfigError(key+".minID", "incorrect trunk minID parameter %d; use 1-4094", lo)
			}
			if hi <= 0 || hi > 4094 {
				return nil, cniplumb.ConfigError(key+".maxID", "incorrect trunk maxID parameter %d; use 1-4094", hi)
			}
			if hi < lo {
				return nil, cniplumb.ConfigError(key, "minID %d is greater than maxID %d in trunk parameter", lo, hi)
			}
			for v := lo; v <= hi; v++ {
				set[v] = true
			}
		case it.MinID == nil && it.MaxID != nil:
			return nil, cniplumb.ConfigError(key, "minID and maxID should be configured simultaneously, minID is missing")
		case it.MinID != nil && it.MaxID == nil:
			return nil, cniplumb.ConfigError(key, "minID and maxID should be configured simultaneously, maxID is missing")
		}
		if it.ID != nil {
			if *it.ID <= 0 || *it.ID > 4094 {
				return nil, cniplumb.ConfigError(key+".id", "incorrect trunk id parameter %d; use 1-4094", *it.ID)
			}
			set[*it.ID] = true
		}
	}
	if len(set) == 0 {
		return nil, nil
	}
	out := make([]int, 0, len(set))
	for v := range set {
		out = append(out, v)
	}
	sort.Ints(out)
	return out, nil
}

// checkIfName returns why s cannot be a Linux interface name, or "".
func checkIfName(s string) string {
	switch {
	case s == "":
		return "is empty"
	case len(s) > 15:
		return fmt.Sprintf("is %d bytes long; Linux allows at most 15", len(s))
	case s == "." || s == "..":
		return "is not allowed"
	case strings.ContainsAny(s, "/: \t\n\x00"):
		return "contains '/', ':' or whitespace"
	}
	return ""
}
