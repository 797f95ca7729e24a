// SPDX-License-Identifier: Apache-2.0

// Command bridge is podwire's drop-in replacement for the reference bridge plugin: it
// creates the node bridge, connects each pod with a veth pair, delegates addressing to
// an IPAM plugin and optionally masquerades pod traffic (iptables or nftables).
//
// Each verb parses the configuration, plans (plan.go, pure), then applies the plan
// through the backends of plugin (deps.go): links (pkg/link), ipMasq and macspoofchk
// (pkg/netfilter) and the IPAM plugin (pkg/delegate). Tests run the same verbs on
// fakes of all of them.
package main

import (
	"os"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/delegate"
	"github.com/podwire/podwire/pkg/ipam/hostlocal"
	"github.com/podwire/podwire/pkg/link"
	"github.com/podwire/podwire/pkg/netfilter"
)

func main() {
	p := &plugin{links: link.NewNetlink(), ipam: ipamPlugins, masq: hostMasq{}, spoof: hostSpoof{netfilter.NewMacSpoof()},
		random: link.RandomMAC, stderr: os.Stderr}
	cniplumb.Main("bridge", cniplumb.Verbs{Add: p.add, Del: p.del, Check: p.check, GC: p.gc, Status: p.status})
}

// ipamPlugins delegates to the IPAM plugin named in ipam.type. podwire's own
// host-local, when it is the one CNI_PATH names and was built from the same sources as
// this binary, runs in this process: the same code on the same input, without the
// cost of starting a second process on every ADD and DEL.
var ipamPlugins = delegate.Delegator{
	Builtin: map[string]delegate.Builtin{"host-local": {Verbs: hostlocal.Verbs, Package: "github.com/podwire/podwire/plugins/ipam/host-local"}},
}
