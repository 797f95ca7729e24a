// SPDX-License-Identifier: Apache-2.0

package netfilter

import (
	"crypto/sha512"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// bridge's ipMasq, pure: MasqPlan, its kernel names, MasqBackend and the backend
// choice. The backends are in masq_xt.go and masq_nft_layout.go.
//
// ipMasq lives in no objects of podwire's own: it uses exactly the reference bridge
// plugin's layout (plugins v1.10.0, pkg/ip/ipmasq_*_linux.go), so a node can swap
// binaries under live pods: each binary's DEL finds what the other's ADD made, in
// either backend:
//
//	iptables: chain CNI-<sha512(network+containerID)[:24 hex]> in the nat table, with
//	          "-d <subnet> -j ACCEPT" per subnet and "! -d 224.0.0.0/4 -j MASQUERADE"
//	          (ff00::/8 in ip6tables); one jump per pod address from POSTROUTING,
//	          "-s <ip>/32 -j CNI-…". Every rule is commented `name: "<net>" id: "<cid>"`;
//	          no interface name anywhere (see MasqBackend).
//	nftables: table inet cni_plugins_masquerade, base chain postrouting (nat, srcnat)
//	          holding "ip daddr 224.0.0.0/4 return", "ip6 daddr ff00::/8 return" and
//	          "goto masq_checks"; per pod address in masq_checks
//	          "ip saddr <ip> ip daddr != <subnet> masquerade", commented
//	          "<sha512(net)[:16]>-<sha512(ifname:cid)[:16]>, net: …, if: …, id: …".

// MasqPlan is the masquerade of one attachment: traffic from each address to anything
// outside the address's subnet and not multicast leaves with the node's address.
type MasqPlan struct {
	Owner Owner
	// Addrs are the pod's addresses, each with its subnet's prefix length.
	Addrs []netip.Prefix
}

// Families returns the families of the plan's addresses.
func (p MasqPlan) Families() Families {
	var s Families
	for _, a := range p.Addrs {
		s |= FamilyOf(a.Addr()).bit()
	}
	return s
}

// removalFamilies are the families DEL looks in: those of addrs when known, else both.
func removalFamilies(addrs []netip.Prefix) Families {
	if len(addrs) == 0 {
		return All
	}
	return MasqPlan{Addrs: addrs}.Families()
}

// Validate reports a plan no backend could install; backends call it before touching
// the kernel.
func (p MasqPlan) Validate() error {
	if p.Owner.Network == "" || p.Owner.ContainerID == "" {
		return fmt.Errorf("masquerade plan without network name or container ID: %q", p.Owner)
	}
	for _, a := range p.Addrs {
		if !a.IsValid() || a.Addr().Is4In6() {
			return fmt.Errorf("masquerade of %s: %v is not a usable address with prefix length", p.Owner, a)
		}
	}
	return nil
}

// String renders the plan one address per line.
func (p MasqPlan) String() string {
	var b strings.Builder
	for _, a := range p.Addrs {
		fmt.Fprintf(&b, "masquerade %s from %s except to %s and %s\n", p.Owner, a.Addr(), a.Masked(), multicast[FamilyOf(a.Addr())])
	}
	return b.String()
}

var multicast = map[Family]netip.Prefix{IPv4: netip.MustParsePrefix("224.0.0.0/4"), IPv6: netip.MustParsePrefix("ff00::/8")}

func hostPrefix(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) }

// sha512Hex returns the first n hex digits of sha512(s), the reference's hash for
// chain names and nftables comments.
func sha512Hex(s string, n int) string {
	sum := sha512.Sum512([]byte(s))
	return hex.EncodeToString(sum[:])[:n]
}

// MasqChain is the reference's iptables chain for o's masquerade: "CNI-" + 24 hex
// digits of sha512(network + containerID), without the interface name.
func MasqChain(o Owner) string { return "CNI-" + sha512Hex(o.Network+o.ContainerID, 24) }

// masqComment is the reference's iptables comment on every masquerade rule of o,
// `name: "<network>" id: "<containerID>"` (Go-quoted strings). An iptables comment
// holds at most 255 bytes; where network and container ID do not fit (the reference's
// ADD fails there), they are cut, the network last, so the comment still parses. The
// rules are found through the chain name, which hashes both in full.
func masqComment(o Owner) string {
	net, id := o.Network, o.ContainerID
	if len(net)+len(id) > masqCommentRoom {
		net = net[:min(len(net), max(masqCommentRoom-len(id), masqCommentRoom/2))]
		id = id[:masqCommentRoom-len(net)]
	}
	return "name: " + strconv.Quote(net) + " id: " + strconv.Quote(id)
}

// masqCommentRoom is what a masqComment has for network name and container ID.
const masqCommentRoom = maxXTComment - len(`name: "" id: ""`)

// parseMasqComment reads network and container ID back from a masqComment.
func parseMasqComment(c string) (network, containerID string, ok bool) {
	rest, found := strings.CutPrefix(c, "name: ")
	if !found {
		return "", "", false
	}
	q, err := strconv.QuotedPrefix(rest)
	if err != nil {
		return "", "", false
	}
	network, _ = strconv.Unquote(q)
	rest, found = strings.CutPrefix(rest[len(q):], " id: ")
	if !found {
		return "", "", false
	}
	q, err = strconv.QuotedPrefix(rest)
	if err != nil || len(q) != len(rest) {
		return "", "", false
	}
	containerID, _ = strconv.Unquote(q)
	return network, containerID, true
}

// masqNetHash is the reference's nftables hash of a network: 16 hex digits.
func masqNetHash(network string) string { return sha512Hex(network, 16) }

// masqInstance is the reference's nftables identity of o: every masq_checks rule of o
// has a comment starting with it.
func masqInstance(o Owner) string {
	return masqNetHash(o.Network) + "-" + sha512Hex(o.IfName+":"+o.ContainerID, 16)
}

const masqInstanceLen = 16 + 1 + 16

// masqNFTComment is the reference's comment on o's masq_checks rules, cut to
// nftMaxComment as knftables (CommentLengthMax) cuts it.
func masqNFTComment(o Owner) string {
	strip := func(s string) string { return strings.ReplaceAll(s, `"`, "") }
	c := fmt.Sprintf("%s, net: %s, if: %s, id: %s", masqInstance(o), strip(o.Network), strip(o.IfName), strip(o.ContainerID))
	return c[:min(len(c), nftMaxComment)]
}

// MasqBackend installs and removes masquerades in the reference plugin's layout of
// one backend. Apply gives p.Owner p's rules: iptables adds what is missing (as the
// reference's AppendUnique), nftables replaces the owner's rules in one batch.
// Removal knows the pod's addresses when prevResult has them: iptables then touches
// only their families and jumps, telling apart by source address the attachments of
// one network in one container, which share a chain (it stays while another's jump
// uses it); without them all of the owner's goes, in both families. For the same
// reason iptables GC keeps an attachment when keep holds any interface of its
// container in network.
type MasqBackend = Backend[MasqPlan, []netip.Prefix]

// NewMasqOn returns the ipMasq backend of kind k on the given seams (a fake kernel in
// tests), without podwire's lock files.
func NewMasqOn(k Kind, xt XTables, nc NFTConn) MasqBackend {
	if k == KindNFTables {
		return &MasqNFTables{s: nftSocketOn(nc)}
	}
	return &MasqIPTables{xtLayout{xt, func() (func(), error) { return noLock("") }}}
}

// MasqProbe is what the host offers for ipMasq, as OpenMasq probes it.
type MasqProbe struct {
	Probe
	// RefNFT says the reference plugin could use nftables here: an `nft` binary of
	// version 1.0.1 or later is installed (the reference drives nftables through it).
	RefNFT bool
}

// PickMasq chooses the ipMasq backend. A configured backend must be available (code 50
// otherwise, as Pick). Auto picks nftables only when the reference plugin could remove
// its rules too (RefNFT): then either binary can delete the other's pods whatever each
// picks, and podwire saves the iptables execs. Otherwise it falls back to the
// reference's own choice, iptables unless only nftables is available.
func PickMasq(want Kind, p MasqProbe) (Kind, error) {
	if want != Auto {
		return Pick(want, p.Probe)
	}
	switch {
	case p.NFTables && p.RefNFT:
		return KindNFTables, nil
	case p.IPTables:
		return KindIPTables, nil
	}
	return Pick(Auto, p.Probe)
}
