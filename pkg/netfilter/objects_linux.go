// SPDX-License-Identifier: Apache-2.0

package netfilter

import (
	"context"
	"errors"
	"slices"
	"strings"

	"github.com/podwire/podwire/pkg/cniplumb"
)

// This file is the read-only side of GC for `podwire inspect` and `podwire gc
// --dry-run`: the same listings and the same planning functions the backends' GC
// runs (stalePick, planMasqXTGC, hpGCChange), returning what they pick instead of
// removing it. Nothing here changes the kernel or takes podwire's locks.

// Object is one attachment's rules in one layout: the unit GC removes and inspect
// lists.
type Object struct {
	What    string // "masquerade", "hostports" or "macspoof"
	Backend string // "nftables" or "iptables ipv4" / "iptables ipv6"
	// Key is the attachment's name in the layout: a masquerade chain, the reference's
	// nftables instance hash, podwire's owner ID or the reference's CNI-DN- chain.
	Key string
	// Owner is the attachment when the layout names it in full (a tag with its key,
	// the reference's iptables comments name network and container only); else zero.
	Owner Owner
	Rules []string // the rules' text, in listing order
	net   string   // the network as the layout names it: plain or one of its hashes
}

// InNetwork reports whether the object is of an attachment of network.
func (o Object) InNetwork(network string) bool {
	return o.net == network || o.net == masqNetHash(network) || o.net == hash8(network)
}

func (o Object) String() string { return o.What + " " + o.Backend + " " + o.Key }

// Of reports whether the object belongs to ow, under any layout's name for it.
func (o Object) Of(ow Owner) bool {
	switch o.Key {
	case masqInstance(ow), MasqChain(ow), string(IDOf(ow)), spoofID(ow):
		return true
	case HostPortChain(ow.Network, ow.ContainerID):
		return o.Owner == (Owner{}) || o.Owner == ow
	}
	return false
}

// ListMasq returns every attachment's masquerade in every backend the node offers;
// network "" is every network.
func ListMasq(ctx context.Context) ([]Object, error) {
	return masqObjects(ctx, func(key, net string) bool { return true }, nil)
}

// PlanGCMasq returns what GCMasq removes for network: in nftables the attachments
// stalePick selects, in iptables the chains planMasqXTGC picks.
func PlanGCMasq(ctx context.Context, network string, keep cniplumb.Owners) ([]Object, error) {
	return masqObjects(ctx, masqLayout().stalePick(network, keep), func(post []xtRule) []string {
		_, stale := planMasqXTGC(network, keep, post)
		return stale
	})
}

// masqObjects reads both backends, as GCMasq does. pick selects nftables rules by
// key; stale, when set, picks iptables chains from POSTROUTING (nil: every chain a
// masquerade comment names).
func masqObjects(ctx context.Context, pick func(key, net string) bool, stale func([]xtRule) []string) ([]Object, error) {
	p := ProbeHost()
	var out []Object
	var errs []error
	if p.NFTables {
		objs, err := nftObjects(hostNFTSocket(), masqLayout(), "masquerade", pick)
		out = append(out, objs...)
		errs = append(errs, err)
	}
	if p.IPTables {
		x := hostXTLayout("masq")
		for _, fam := range All.list() {
			if !x.xt.Installed(fam) {
				continue
			}
			post, err := x.list(ctx, fam, masqPostrouting)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			var picked []string
			if stale != nil {
				picked = stale(post.rules)
			}
			at := map[string]int{}
			for _, r := range post.rules {
				n, id, ok := parseMasqComment(r.comment)
				if !ok || !strings.HasPrefix(r.target, "CNI-") || stale != nil && !slices.Contains(picked, r.target) {
					continue
				}
				if _, dup := at[r.target]; dup {
					continue
				}
				at[r.target] = len(out)
				o := Object{What: "masquerade", Backend: "iptables " + fam.String(), Key: r.target,
					Owner: Owner{Network: n, ContainerID: id}, net: n}
				own, err := x.list(ctx, fam, r.target)
				errs = append(errs, err)
				for _, r := range own.rules {
					o.Rules = append(o.Rules, r.line)
				}
				out = append(out, o)
			}
		}
	}
	return out, errors.Join(errs...)
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

// nftObjects dumps l and groups the rules pick selects by attachment.
func nftObjects(s *nftSocket, l *nftLayout, what string, pick func(key, net string) bool) ([]Object, error) {
	c, done, err := s.conn()
	if err != nil {
		return nil, err
	}
	defer done()
	st, err := l.read(c)
	if err != nil {
		return nil, err
	}
	var g objects
	for _, r := range l.owned(st, pick) {
		k, net, _ := l.ruleKey(r)
		o := Object{What: what, Backend: "nftables", Key: k, net: net}
		if t, ok := decodeTag(r.UserData); ok {
			o.Owner = t.Owner
		} else if ow, ok := parseMasqNFTComment(ruleComment(r)); ok && masqInstance(ow) == k {
			o.Owner = ow
		}
		g.add(o, r.Chain.Name+": "+DescribeRule(r))
	}
	return g.out, nil
}

// ListHostPorts returns every attachment's host ports in backend k.
func ListHostPorts(ctx context.Context, k Kind) ([]Object, error) {
	return hostPortObjects(ctx, k, func(key, net string) bool { return true }, nil)
}

// PlanGCHostPorts returns what the HostPortBackend of kind k removes in GC for
// network: the attachments stalePick selects in nftables, and hpGCChange's owners and
// reference chains in iptables.
func PlanGCHostPorts(ctx context.Context, k Kind, network string, keep cniplumb.Owners) ([]Object, error) {
	return hostPortObjects(ctx, k, featureLayout(HostPortFeature).stalePick(network, keep), func(top chainListing) hpChange {
		return hpGCChange(top, network, keep)
	})
}

func hostPortObjects(ctx context.Context, k Kind, pick func(key, net string) bool, plan func(chainListing) hpChange) ([]Object, error) {
	if k == KindNFTables {
		return nftObjects(hostNFTSocket(), featureLayout(HostPortFeature), "hostports", pick)
	}
	x := hostXTLayout("hostport")
	var g objects
	var errs []error
	for _, fam := range All.list() {
		if !x.xt.Installed(fam) {
			continue
		}
		top, err := x.list(ctx, fam, HostPortDNATChain)
		if err != nil || !top.exists {
			errs = append(errs, err)
			continue
		}
		ch := hpChange{removeIDs: map[OwnerID]bool{}, chains: map[string]bool{}}
		if plan != nil {
			ch = plan(top)
		}
		for _, r := range top.rules {
			o := Object{What: "hostports", Backend: "iptables " + fam.String()}
			switch n, cid, ok := refOwner(r.comment); {
			case r.ours && (plan == nil || ch.removeIDs[r.tag.ID]):
				o.Key, o.Owner, o.net = string(r.tag.ID), r.tag.Owner, r.tag.NetworkHash
			case !r.ours && ok && (plan == nil || ch.chains[r.target]):
				o.Key, o.Owner, o.net = r.target, Owner{Network: n, ContainerID: cid}, n
			default:
				continue
			}
			g.add(o, r.line)
		}
	}
	return g.out, errors.Join(errs...)
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

// PlanGCMacSpoof returns what bridge's macspoofchk GC removes (nothing on a node
// without nf_tables, where bridge skips it): the attachments spoofStale picks.
func PlanGCMacSpoof(keep cniplumb.Owners, ours func(hostIf string) bool) ([]Object, error) {
	return macSpoofObjects(func(l *nftLayout, st nftState) func(key, net string) bool {
		stale := spoofStale(l, st, keep, ours)
		return func(id, _ string) bool { return stale[id] }
	})
}

// ListMacSpoof returns every attachment's macspoofchk rules. The reference's layout
// names no network: InNetwork is false for them, Of tells their owner.
func ListMacSpoof() ([]Object, error) {
	return macSpoofObjects(func(*nftLayout, nftState) func(key, net string) bool {
		return func(string, string) bool { return true }
	})
}

// macSpoofObjects returns the rules that pick, given a dump of the layout, selects.
func macSpoofObjects(pick func(*nftLayout, nftState) func(key, net string) bool) ([]Object, error) {
	if !ProbeHost().NFTables {
		return nil, nil
	}
	s, l := hostNFTSocket(), spoofLayout()
	c, done, err := s.conn()
	if err != nil {
		return nil, err
	}
	st, err := l.read(c)
	done()
	if err != nil {
		return nil, err
	}
	return nftObjects(s, l, "macspoof", pick(l, st))
}
