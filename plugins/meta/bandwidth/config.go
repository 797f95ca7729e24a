// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/big"
	"strconv"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/tc"
)

// Direction is one direction's request: Rate in bit/s (0: unshaped) and Burst in bits
// (0: derive one).
type Direction struct {
	Rate, Burst uint64
}

// Request is what the attachment asks for, after validation.
type Request struct {
	Ingress Direction // traffic into the pod
	Egress  Direction // traffic out of the pod
	// From is where the values came from, for messages: "runtimeConfig.bandwidth" or
	// "" (plugin-level keys).
	From string
}

// Empty reports whether nothing is shaped: then the plugin does no netlink work.
func (r Request) Empty() bool { return r.Ingress.Rate == 0 && r.Egress.Rate == 0 }

// rawEntry holds the keys undecoded so every bad value gets a code-7 message naming it.
type rawEntry struct {
	IngressRate     json.RawMessage `json:"ingressRate"`
	IngressBurst    json.RawMessage `json:"ingressBurst"`
	EgressRate      json.RawMessage `json:"egressRate"`
	EgressBurst     json.RawMessage `json:"egressBurst"`
	UnshapedSubnets json.RawMessage `json:"unshapedSubnets"`
	ShapedSubnets   json.RawMessage `json:"shapedSubnets"`
}

type rawConf struct {
	rawEntry
	RuntimeConfig json.RawMessage `json:"runtimeConfig"`
}

// parseConf reads the bandwidth request from the network configuration. When
// runtimeConfig.bandwidth is present (the runtime passes it for a pod with bandwidth
// annotations) its rates and bursts win over the plugin-level ones as a whole;
// otherwise the plugin-level keys apply. Every problem with a value is a code-7 error
// naming the key.
//
// unshapedSubnets and shapedSubnets are refused wherever they are, for every pod: the
// plugin shapes all of a pod's traffic, so honouring them for some pods and not others
// would shape traffic the operator asked to leave alone, depending on whether the pod
// has annotations. (Until issue 17 the plugin-level keys were refused for pods without
// annotations and ignored for annotated ones.) The reference v1.10.0 does not know
// these keys and ignores them.
func parseConf(stdin []byte) (Request, error) {
	var c rawConf
	if err := json.Unmarshal(stdin, &c); err != nil {
		return Request{}, cniplumb.DecodeError("network configuration", err)
	}
	if err := refuseSubnets(c.rawEntry, ""); err != nil {
		return Request{}, err
	}
	entry, from := c.rawEntry, ""
	if !isNull(c.RuntimeConfig) {
		var rc struct {
			Bandwidth json.RawMessage `json:"bandwidth"`
		}
		if err := json.Unmarshal(c.RuntimeConfig, &rc); err != nil {
			return Request{}, cniplumb.ConfigError("runtimeConfig", "runtimeConfig must be an object: %v", err)
		}
		if !isNull(rc.Bandwidth) {
			from = "runtimeConfig.bandwidth"
			entry = rawEntry{}
			if err := json.Unmarshal(rc.Bandwidth, &entry); err != nil {
				return Request{}, cniplumb.ConfigError(from, "%s must be an object with ingressRate, ingressBurst, egressRate and egressBurst: %v", from, err)
			}
		}
	}
	return parseEntry(entry, from)
}

// refuseSubnets is the code-7 error for a non-empty unshapedSubnets or shapedSubnets
// in e (see parseConf).
func refuseSubnets(e rawEntry, from string) error {
	for _, s := range []struct {
		key string
		raw json.RawMessage
	}{{"unshapedSubnets", e.UnshapedSubnets}, {"shapedSubnets", e.ShapedSubnets}} {
		if !isNull(s.raw) && !bytes.Equal(bytes.TrimSpace(s.raw), []byte("[]")) {
			return cniplumb.ConfigError(keyOf(from, s.key),
				"%s is not supported by podwire's bandwidth plugin: it shapes all of a pod's traffic, for pods with and without bandwidth annotations (the reference v1.10.0 has no such key and shapes everything too); remove it", keyOf(from, s.key))
		}
	}
	return nil
}

func parseEntry(e rawEntry, from string) (Request, error) {
	r := Request{From: from}
	if err := refuseSubnets(e, from); err != nil {
		return r, err
	}
	var err error
	if r.Ingress, err = parseDirection(from, "ingress", e.IngressRate, e.IngressBurst); err != nil {
		return r, err
	}
	if r.Egress, err = parseDirection(from, "egress", e.EgressRate, e.EgressBurst); err != nil {
		return r, err
	}
	return r, nil
}

func parseDirection(from, dir string, rawRate, rawBurst json.RawMessage) (Direction, error) {
	rateKey, burstKey := keyOf(from, dir+"Rate"), keyOf(from, dir+"Burst")
	rate, err := parseUint(rateKey, rawRate, tc.MaxRate, "bits per second")
	if err != nil {
		return Direction{}, err
	}
	burst, err := parseUint(burstKey, rawBurst, tc.MaxBurst, "bits")
	if err != nil {
		return Direction{}, err
	}
	switch {
	case rate == 0 && burst != 0:
		// As the reference does: a burst without a rate is a mistake, not "unlimited".
		return Direction{}, cniplumb.ConfigError(burstKey, "%s is %d but %s is 0 (unshaped): set %s too, or remove %s", burstKey, burst, rateKey, rateKey, burstKey)
	case rate != 0 && rate < tc.MinRate:
		return Direction{}, cniplumb.ConfigError(rateKey, "%s is %d bit/s; the smallest rate is %d bit/s (1 kbit/s, as kubelet allows); use 0 for unshaped", rateKey, rate, tc.MinRate)
	}
	return Direction{Rate: rate, Burst: burst}, nil
}

// parseUint accepts a JSON number that is a whole number in [0, max]; absent and null
// are 0. Exponent forms (1e7) are accepted when they are whole.
func parseUint(key string, raw json.RawMessage, max uint64, unit string) (uint64, error) {
	s := string(bytes.TrimSpace(raw))
	if isNull(raw) {
		return 0, nil
	}
	bad := func(why string) error {
		return cniplumb.ConfigError(key, "%s is %s: %s; it must be a whole number of %s between 0 and %d", key, s, why, unit, max)
	}
	switch s[0] {
	case '"':
		return 0, bad("a string, not a number (quantities such as \"10M\" are kubelet's to convert)")
	case '-':
		return 0, bad("negative")
	case '{', '[', 't', 'f':
		return 0, bad("not a number")
	}
	if v, err := strconv.ParseUint(s, 10, 64); err == nil {
		if v > max {
			return 0, bad("too large")
		}
		return v, nil
	}
	f, _, err := big.ParseFloat(s, 10, 256, big.ToNearestEven)
	if err != nil {
		return 0, bad("not a number")
	}
	if !f.IsInt() {
		return 0, bad("not a whole number")
	}
	v, acc := f.Uint64()
	if acc != big.Exact || v > max {
		return 0, bad("too large")
	}
	return v, nil
}

func isNull(raw json.RawMessage) bool {
	s := bytes.TrimSpace(raw)
	return len(s) == 0 || bytes.Equal(s, []byte("null"))
}

func keyOf(from, key string) string {
	if from == "" {
		return key
	}
	return from + "." + key
}

func (d Direction) String() string {
	if d.Rate == 0 {
		return "unshaped"
	}
	return fmt.Sprintf("rate %d bit/s burst %d bits", d.Rate, d.Burst)
}
