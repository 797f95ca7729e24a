// SPDX-License-Identifier: Apache-2.0

package main

import (
	"net/netip"
	"strings"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/netfilter"
)

// conditionsV4/conditionsV6 are raw iptables arguments (or nftables expressions) in the
// reference, pasted into its rules unchecked: a value such as "-j ACCEPT" or an
// embedded newline rewrites the node's firewall. podwire parses them instead, with a
// small grammar that covers what they are used for (restricting host ports to some
// sources, destinations or an input interface), renders them itself for either
// backend, and rejects everything else with a code-7 error.
//
// iptables form:   [!] -s|--source|--src PREFIX   [!] -d|--destination|--dst PREFIX
//                  -i|--in-interface NAME
// nftables form:   ip|ip6 saddr|daddr [==|!=] PREFIX   iifname [==] NAME
//
// Elements are split on white space, so ["-s", "10.0.0.0/8"] and ["ip saddr
// 10.0.0.0/8"] both work. Each of source, destination and interface may appear once.
// An interface condition never matches connections from the node itself (they have no
// input interface), as in the reference.

const conditionsGrammar = `"[!] -s PREFIX", "[!] -d PREFIX", "-i NAME" (iptables form) or "ip saddr [!=] PREFIX", "ip daddr [!=] PREFIX", "iifname NAME" (nftables form; "ip6" in conditionsV6)`

// parseConditions parses one family's conditions; ok is false when there are none.
func parseConditions(key string, fam netfilter.Family, list []string) (m netfilter.Match, ok bool, err error) {
	var toks []string
	for _, e := range list {
		toks = append(toks, strings.Fields(e)...)
	}
	if len(toks) == 0 {
		return m, false, nil
	}
	bad := func(format string, a ...any) error {
		return cniplumb.ConfigError(key, key+" "+format+"; podwire accepts only "+conditionsGrammar, a...)
	}
	for _, t := range toks {
		for _, r := range t {
			if r < 0x21 || r > 0x7e {
				return m, false, bad("contains %q, which no condition uses", t)
			}
		}
	}
	var src, dst, iif bool
	setSrc := func(p netip.Prefix, neg bool) error {
		if src {
			return bad("matches the source twice")
		}
		src, m.Src, m.NotSrc = true, p, neg
		return nil
	}
	setDst := func(p netip.Prefix, neg bool) error {
		if dst {
			return bad("matches the destination twice")
		}
		dst, m.Dst, m.NotDst = true, p, neg
		return nil
	}
	setIif := func(name string) error {
		if iif {
			return bad("matches the input interface twice")
		}
		if !validIfName(name) {
			return bad("names the interface %q: use a plain interface name of 1-15 letters, digits, '_', '-' or '.' (no wildcards)", name)
		}
		iif, m.InIface = true, name
		return nil
	}
	prefix := func(s string) (netip.Prefix, error) {
		p, err := parsePrefix(s)
		if err != nil {
			return p, bad("has %q, which is not an address or prefix", s)
		}
		if netfilter.FamilyOf(p.Addr()) != fam {
			return p, bad("has %s, which is not an %s address (conditionsV4 takes IPv4, conditionsV6 IPv6)", s, fam)
		}
		return p, nil
	}
	nftFamily := "ip"
	if fam == netfilter.IPv6 {
		nftFamily = "ip6"
	}

	for i := 0; i < len(toks); {
		t := toks[i]
		switch {
		case t == "!" || strings.HasPrefix(t, "-"):
			neg := false
			if t == "!" {
				neg = true
				i++
				if i >= len(toks) {
					return m, false, bad("ends with \"!\"")
				}
				t = toks[i]
			}
			if i+1 >= len(toks) {
				return m, false, bad("has %q without a value", t)
			}
			v := toks[i+1]
			i += 2
			switch t {
			case "-s", "--source", "--src":
				p, err := prefix(v)
				if err != nil {
					return m, false, err
				}
				if err := setSrc(p, neg); err != nil {
					return m, false, err
				}
			case "-d", "--destination", "--dst":
				p, err := prefix(v)
				if err != nil {
					return m, false, err
				}
				if err := setDst(p, neg); err != nil {
					return m, false, err
				}
			case "-i", "--in-interface":
				if neg {
					return m, false, bad("negates the input interface, which podwire does not support")
				}
				if err := setIif(v); err != nil {
					return m, false, err
				}
			default:
				return m, false, bad("has the option %q", t)
			}
		case t == "ip" || t == "ip6":
			if t != nftFamily {
				return m, false, bad("uses %q; %s conditions use %q", t, fam, nftFamily)
			}
			if i+2 >= len(toks) {
				return m, false, bad("has an incomplete %q expression", t)
			}
			field := toks[i+1]
			i += 2
			neg := false
			if toks[i] == "!=" || toks[i] == "==" {
				neg = toks[i] == "!="
				i++
				if i >= len(toks) {
					return m, false, bad("has an incomplete %q expression", t)
				}
			}
			p, err := prefix(toks[i])
			if err != nil {
				return m, false, err
			}
			i++
			switch field {
			case "saddr":
				err = setSrc(p, neg)
			case "daddr":
				err = setDst(p, neg)
			default:
				err = bad("has %s %q; only saddr and daddr are supported", t, field)
			}
			if err != nil {
				return m, false, err
			}
		case t == "iifname":
			i++
			if i < len(toks) && toks[i] == "==" {
				i++
			}
			if i >= len(toks) {
				return m, false, bad("has \"iifname\" without a name")
			}
			if toks[i] == "!=" {
				return m, false, bad("negates the input interface, which podwire does not support")
			}
			if err := setIif(strings.Trim(toks[i], `"`)); err != nil {
				return m, false, err
			}
			i++
		default:
			return m, false, bad("has %q", t)
		}
	}
	return m, true, nil
}

// parsePrefix accepts "ADDR" (a host) or "ADDR/LEN", without zones.
func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return p, err
		}
		return netip.PrefixFrom(p.Addr().Unmap(), p.Bits()).Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Prefix{}, errBadAddr
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

type badAddr struct{}

func (badAddr) Error() string { return "not an address" }

var errBadAddr error = badAddr{}

func validIfName(s string) bool {
	if s == "" || len(s) > 15 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-' || r == '.') {
			return false
		}
	}
	return true
}
