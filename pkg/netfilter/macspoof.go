// SPDX-License-Identifier: Apache-2.0

package netfilter

import (
	"context"
	"fmt"
	"net"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"

	"github.com/podwire/podwire/pkg/cniplumb"
)

// This file is bridge's macspoofchk in the reference plugin's nftables layout
// (plugins v1.10.0, pkg/link/spoofcheck.go), with the bytecode nft generates for the
// reference's rules, on the nftables engine (nft_layout.go):
//
//	table bridge nat
//	  chain PREROUTING  (type filter hook prerouting priority -300; policy accept)
//	    iifname "<host veth>" jump cni-br-iface-<id>       comment "macspoofchk-<id>"
//	  chain cni-br-iface-<id>
//	    jump cni-br-iface-<id>-mac                          comment "macspoofchk-<id>"
//	  chain cni-br-iface-<id>-mac
//	    ether saddr <pod MAC> return                        comment "macspoofchk-<id>"
//	    drop                                                comment "macspoofchk-<id>"
//
// where <id> is "<containerID>-<ifname>". The reference's DEL finds the PREROUTING
// rule by its comment and deletes the two chains by name, so it removes what podwire
// made, and podwire's DEL removes what the reference made. The layout has no network
// name: GC tells this network's attachments by their host veth (MacSpoof.GC).

// The reference's macspoofchk objects.
const (
	spoofTableName  = "nat"
	spoofBaseChain  = "PREROUTING"
	spoofChainPfx   = "cni-br-iface-"
	spoofCommentPfx = "macspoofchk-"
	// nftMaxChainName is NFT_CHAIN_MAXNAMELEN less its NUL; nftMaxComment is the
	// longest comment the nft tool writes.
	nftMaxChainName = 255
	nftMaxComment   = 128
)

// MacSpoofPlan is one attachment's macspoofchk: frames that enter the bridge from the
// pod's host-side port must come from the pod interface's MAC, or they are dropped.
type MacSpoofPlan struct {
	Owner  Owner
	HostIf string           // the pod's host-side veth, the bridge port
	MAC    net.HardwareAddr // the pod interface's
}

// spoofID is the reference's identity of an attachment: "<containerID>-<ifname>".
func spoofID(o Owner) string { return o.ContainerID + "-" + o.IfName }

func spoofChains(id string) (iface, mac string) {
	return spoofChainPfx + id, spoofChainPfx + id + "-mac"
}

// Validate reports a plan that cannot be installed, before anything changes.
func (p MacSpoofPlan) Validate() error {
	if p.Owner.ContainerID == "" || p.Owner.IfName == "" || p.HostIf == "" {
		return fmt.Errorf("macspoofchk plan of %q lacks the container ID, interface or host veth", p.Owner)
	}
	if len(p.MAC) != 6 {
		return fmt.Errorf("macspoofchk of %s: %q is not an Ethernet MAC address", p.Owner, p.MAC)
	}
	if n := maxSpoofContainerID(p.Owner.IfName); len(p.Owner.ContainerID) > n {
		return fmt.Errorf("macspoofchk of %s: the reference's layout puts container ID and interface name into a rule comment of at most %d bytes; with interface %q the container ID may have at most %d bytes, not %d (turn macspoofchk off for such containers)", p.Owner, nftMaxComment, p.Owner.IfName, n, len(p.Owner.ContainerID))
	}
	return nil
}

// maxSpoofContainerID is the longest container ID whose names fit nftables with
// interface ifname: the comment "macspoofchk-<cid>-<ifname>" (the tighter limit) and
// the chain "cni-br-iface-<cid>-<ifname>-mac".
func maxSpoofContainerID(ifname string) int {
	_, mac := spoofChains("-" + ifname)
	return min(nftMaxComment-len(spoofCommentPfx+"-"+ifname), nftMaxChainName-len(mac))
}

// String renders the plan as the rules it installs.
func (p MacSpoofPlan) String() string {
	iface, mac := spoofChains(spoofID(p.Owner))
	return fmt.Sprintf("macspoofchk %s: bridge nat %s: iifname %q jump %s; %s: jump %s; %s: ether saddr %s return, drop\n",
		p.Owner, spoofBaseChain, p.HostIf, iface, iface, mac, mac, p.MAC)
}

// spoofLayout is the reference's table bridge nat: PREROUTING is shared (and also
// ebtables-nft's), every attachment has two chains of its own.
func spoofLayout() *nftLayout {
	t := &nftables.Table{Name: spoofTableName, Family: nftables.TableFamilyBridge}
	accept := nftables.ChainPolicyAccept
	base := &nftables.Chain{Name: spoofBaseChain, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRef(-300), Policy: &accept}
	return &nftLayout{
		id:     bySpoof,
		table:  t,
		chains: []*nftables.Chain{base},
		key:    spoofID,
		ruleKey: func(r *nftables.Rule) (string, string, bool) {
			id, ok := strings.CutPrefix(ruleComment(r), spoofCommentPfx)
			return id, "", ok && id != ""
		},
		ownerChains: func(id string) []*nftables.Chain {
			iface, mac := spoofChains(id)
			return []*nftables.Chain{{Name: iface, Table: t}, {Name: mac, Table: t}}
		},
	}
}

// spoofRules are p's four rules, in the reference's order.
func spoofRules(l *nftLayout, p MacSpoofPlan) []*nftables.Rule {
	id := spoofID(p.Owner)
	chains := l.ownerChains(id)
	iface, mac := chains[0], chains[1]
	ud := userdata.AppendString(nil, userdata.TypeComment, spoofCommentPfx+id)
	rule := func(c *nftables.Chain, e ...expr.Any) *nftables.Rule {
		return &nftables.Rule{Table: l.table, Chain: c, Exprs: e, UserData: ud}
	}
	return []*nftables.Rule{
		rule(l.chains[0], &expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifnameBytes(p.HostIf)},
			&expr.Verdict{Kind: expr.VerdictJump, Chain: iface.Name}),
		rule(iface, &expr.Verdict{Kind: expr.VerdictJump, Chain: mac.Name}),
		rule(mac, &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseLLHeader, Offset: 6, Len: 6},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte(p.MAC)},
			&expr.Verdict{Kind: expr.VerdictReturn}),
		rule(mac, &expr.Verdict{Kind: expr.VerdictDrop}),
	}
}

// spoofHostIf reads the host veth a PREROUTING rule matches, "" when it matches none.
func spoofHostIf(r *nftables.Rule) string {
	for i, e := range r.Exprs {
		if m, ok := e.(*expr.Meta); ok && m.Key == expr.MetaKeyIIFNAME && i+1 < len(r.Exprs) {
			if c, ok := r.Exprs[i+1].(*expr.Cmp); ok {
				return strings.TrimRight(string(c.Data), "\x00")
			}
		}
	}
	return ""
}

// MacSpoof is macspoofchk's backend: the reference's layout (see above) through
// netlink only. Apply and Remove are one atomic batch each; the table goes with its last
// attachment when nothing else (ebtables-nft's chains or rules) is in it.
type MacSpoof struct {
	s *nftSocket
}

// NewMacSpoofOn returns the backend on the connection c (a fake kernel in tests),
// without podwire's lock files.
func NewMacSpoofOn(c NFTConn) *MacSpoof { return &MacSpoof{s: nftSocketOn(c)} }

// Apply installs p, replacing what p.Owner had. An invalid plan fails before anything
// changes.
func (b *MacSpoof) Apply(_ context.Context, p MacSpoofPlan) error {
	if err := p.Validate(); err != nil {
		return err
	}
	l := spoofLayout()
	return l.apply(b.s, p.Owner, spoofRules(l, p))
}

// Check reports an error when p.Owner's rules differ from p; IsNotFound tells that
// none are there. Rules the reference plugin made are the same as podwire's and pass.
func (b *MacSpoof) Check(_ context.Context, p MacSpoofPlan) error {
	if err := p.Validate(); err != nil {
		return err
	}
	l := spoofLayout()
	return l.check(b.s, p.Owner, spoofRules(l, p))
}

// Remove deletes o's rules and chains, whichever plugin made them. Nothing to remove
// is success.
func (b *MacSpoof) Remove(_ context.Context, o Owner) error {
	l := spoofLayout()
	return l.remove(b.s, l.ownerPick(o), spoofID(o))
}

// GC removes the rules and chains of the attachments keep does not hold. The layout
// names no network, so an attachment is network's only when ours says its host veth
// is (bridge passes "absent, or a port of this network's bridge"): another network's
// attachments on another bridge are left alone.
func (b *MacSpoof) GC(_ context.Context, keep cniplumb.Owners, ours func(hostIf string) bool) error {
	return spoofLayout().gc(b.s, "", keep, ours)
}
