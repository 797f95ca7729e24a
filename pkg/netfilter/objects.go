// SPDX-License-Identifier: Apache-2.0

package netfilter

import (
	"strings"

	"github.com/google/nftables"

	"github.com/podwire/podwire/pkg/cniplumb"
)

// The one read model of every layout: a layout's listing becomes Objects (pure, per
// layout below), and Stale picks from them what GC removes, for the backends' GC and
// the Lister alike, so a preview is what GC does.

// Object is one attachment's rules in one layout: the unit GC removes and inspect
// lists.
type Object struct {
	What    string // "masquerade", "hostports" or "macspoof"
	Backend string // "nftables", "nftables ip cni_hostport" (the reference portmap's), "iptables ipv4" ...
	// Key is the attachment's name in the layout: podwire's owner ID, the reference's
	// nftables masquerade instance hash, a masquerade or CNI-DN- chain, the
	// reference's macspoofchk "<cid>-<ifname>" or, in cni_hostport, the container ID.
	Key string
	// Owner is the attachment as far as the layout names it: in full for podwire's
	// tags and the reference's nftables masquerade, network and container in the
	// reference's iptables comments, the container alone in cni_hostport; else zero.
	Owner  Owner
	Rules  []string // the rules' text, in listing order
	layout layoutID
	net    string // the network as the layout names it: plain or one of its hashes
	cut    bool   // the reference's iptables masquerade comment was cut to fit
	hostIf string // macspoofchk: the host veth its PREROUTING rule matches
}

// layoutID says how a layout names owners and networks (ownerKeys, InNetwork).
type layoutID uint8

const (
	byTag      layoutID = iota + 1 // podwire's tags (podwire_hostport, tagged CNI-DN- rules)
	byMasqNFT                      // the reference's cni_plugins_masquerade
	byMasqXT                       // the reference's iptables masquerade chains
	byRefDN                        // the reference portmap's CNI-DN- chains
	byRefHPNFT                     // the reference portmap's cni_hostport: container ID only
	bySpoof                        // the reference's macspoofchk
)

// ownerKeys give an owner's Key in each layout.
var ownerKeys = map[layoutID]func(Owner) string{
	byTag: tagKey, byMasqNFT: masqInstance, byMasqXT: MasqChain, bySpoof: spoofID,
	byRefDN:    func(o Owner) string { return HostPortChain(o.Network, o.ContainerID) },
	byRefHPNFT: func(o Owner) string { return o.ContainerID },
}

func (o Object) String() string { return o.What + " " + o.Backend + " " + o.Key }

// Of reports whether the object belongs to ow. In the reference's layouts that key
// by container (its iptables CNI-DN- chains, cni_hostport) every interface of the
// container owns it, as the reference's DEL removes it for any of them.
func (o Object) Of(ow Owner) bool { return o.layout != 0 && ownerKeys[o.layout](ow) == o.Key }

// InNetwork reports whether the layout names network as the object's. The reference's
// macspoofchk and cni_hostport layouts name no network: false for them.
func (o Object) InNetwork(network string) bool {
	switch o.layout {
	case byTag:
		return o.net == hash8(network)
	case byMasqNFT:
		return o.net == masqNetHash(network)
	case byRefDN:
		return o.net == network && o.Key == HostPortChain(network, o.Owner.ContainerID)
	case byMasqXT:
		// Exactly, or, where masqComment had to cut the comment, by the network name
		// it always keeps at least half the room for.
		n := o.net
		return n == network && MasqChain(Owner{Network: network, ContainerID: o.Owner.ContainerID}) == o.Key ||
			o.cut && (n == network || len(n) >= masqCommentRoom/2 && strings.HasPrefix(network, n))
	}
	return false
}

// Stale picks what GC of network removes from objs: the objects of network's
// attachments that keep does not hold. macspoofchk's objects are network's when ours
// says their host veth is (bridge: absent, or a port of its bridge), and are kept
// when keep holds their container and interface in any network. cni_hostport's
// are never picked: the layout names only the container, which may be another
// network's live pod; libcni's GC DELs a stale attachment from its cache, and that
// DEL removes them by container.
func Stale(objs []Object, network string, keep cniplumb.Owners, ours func(hostIf string) bool) []Object {
	kept := map[layoutID]map[string]bool{}
	var out []Object
	for _, o := range objs {
		if !o.InNetwork(network) && (o.layout != bySpoof || ours == nil || !ours(o.hostIf)) {
			continue
		}
		if kept[o.layout] == nil {
			kept[o.layout] = map[string]bool{}
			for ow := range keep {
				if ow.Network == network || o.layout == bySpoof { // spoofIDs name no network
					kept[o.layout][ownerKeys[o.layout](ow)] = true
				}
			}
		}
		if !kept[o.layout][o.Key] {
			out = append(out, o)
		}
	}
	return out
}

// objects groups rules into Objects by backend and key, in order of first appearance.
type objects struct {
	out []Object
	at  map[string]int
}

// add appends rules to o's object, adding o first when it is new.
func (g *objects) add(o Object, rules ...string) {
	if g.at == nil {
		g.at = map[string]int{}
	}
	k := o.Backend + " " + o.Key
	i, ok := g.at[k]
	if !ok {
		i, g.at[k] = len(g.out), len(g.out)
		g.out = append(g.out, o)
	}
	g.out[i].Rules = append(g.out[i].Rules, rules...)
}

// objects groups a dump of l's chains by attachment.
func (l *nftLayout) objects(st nftState, what string) []Object {
	var g objects
	for _, r := range st.rules {
		k, net, ok := l.ruleKey(r)
		if !ok {
			continue
		}
		o := Object{What: what, Backend: "nftables", Key: k, layout: l.id, net: net}
		switch l.id {
		case byTag:
			t, _ := ParseTag(ruleComment(r))
			o.Owner = t.Owner
		case byMasqNFT:
			if ow, ok := parseMasqNFTComment(ruleComment(r)); ok && masqInstance(ow) == k {
				o.Owner = ow
			}
		case bySpoof:
			o.hostIf = spoofHostIf(r) // l.read dumps PREROUTING only
		}
		g.add(o, r.Chain.Name+": "+DescribeRule(r))
	}
	return g.out
}

// parseMasqNFTComment reads the owner from the reference's masq_checks comment
// (masqNFTComment); ok is false when it was cut or is not one.
func parseMasqNFTComment(c string) (Owner, bool) {
	_, rest, ok := strings.Cut(c, ", net: ")
	if !ok {
		return Owner{}, false
	}
	n, rest, ok := strings.Cut(rest, ", if: ")
	if !ok {
		return Owner{}, false
	}
	ifn, id, ok := strings.Cut(rest, ", id: ")
	return Owner{Network: n, ContainerID: id, IfName: ifn}, ok
}

// masqXTObjects are one family's masquerade chains, from its POSTROUTING: a chain per
// target of a jump with the reference's comment, with its jumps as rules.
func masqXTObjects(fam Family, post []xtRule) []Object {
	var g objects
	for _, r := range post {
		n, id, ok := parseMasqComment(r.comment)
		if !ok || r.chain != masqPostrouting || !strings.HasPrefix(r.target, "CNI-") {
			continue
		}
		g.add(Object{What: "masquerade", Backend: "iptables " + fam.String(), Key: r.target, layout: byMasqXT,
			Owner: Owner{Network: n, ContainerID: id}, net: n, cut: len(r.comment) == maxXTComment}, r.line)
	}
	return g.out
}

// hpXTObjects are one family's host-port attachments, from its CNI-HOSTPORT-DNAT:
// podwire's by their tags, the reference's by the CNI-DN- chain its jump comment
// names.
func hpXTObjects(fam Family, top chainListing) []Object {
	var g objects
	for _, r := range top.rules {
		o := Object{What: "hostports", Backend: "iptables " + fam.String()}
		switch n, cid, ok := refOwner(r.comment); {
		case r.ours:
			o.Key, o.Owner, o.net, o.layout = string(r.tag.ID), r.tag.Owner, r.tag.NetworkHash, byTag
		case ok && strings.HasPrefix(r.target, hostPortChainPrefix):
			o.Key, o.Owner, o.net, o.layout = r.target, Owner{Network: n, ContainerID: cid}, n, byRefDN
		default:
			continue
		}
		g.add(o, r.line)
	}
	return g.out
}

// The reference portmap's nftables layout (plugins v1.10.0, portmap_nftables.go): a
// table cni_hostport in each of families ip and ip6; per mapping a rule in chain
// hostports (DNAT) and, with SNAT, in masquerading, each commented with nothing but
// the container ID. hostip_hostports is where older versions put mappings with a
// hostIP; the reference's DEL still looks there. The base and helper chains
// (prerouting, output, postrouting, hostports_all) hold no container's rules.
const refNFTTable = "cni_hostport"

var refNFTChains = []string{"hostports", "hostip_hostports", "masquerading"}

// refNFTFamilies are the families of the cni_hostport tables, in listing order.
var refNFTFamilies = []nftables.TableFamily{nftables.TableFamilyIPv4, nftables.TableFamilyIPv6}

// refHPObjects groups the cni_hostport rules of each family (readRefHP) by container.
func refHPObjects(ref map[nftables.TableFamily][]*nftables.Rule) []Object {
	var g objects
	for _, fam := range refNFTFamilies {
		for _, r := range ref[fam] {
			if cid := ruleComment(r); cid != "" {
				g.add(Object{What: "hostports", Backend: "nftables " + NFTFamily(fam) + " " + refNFTTable, Key: cid,
					Owner: Owner{ContainerID: cid}, layout: byRefHPNFT}, r.Chain.Name+": "+DescribeRule(r))
			}
		}
	}
	return g.out
}
