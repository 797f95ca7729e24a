// Command bridge is podwire's drop-in replacement for the reference bridge plugin: it
// creates the node bridge, connects each pod with a veth pair, delegates addressing to
// an IPAM plugin and optionally masquerades pod traffic (iptables or nftables).
package main

import "github.com/podwire/podwire/pkg/cniplumb"

func main() {
	cniplumb.Main("bridge", cniplumb.Verbs{Add: add, Del: del, Check: check, GC: gc, Status: status})
}
