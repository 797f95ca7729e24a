// Command host-local is podwire's IPAM plugin: it leases addresses from node-local
// ranges, in the same on-disk format as the reference host-local.
package main

import "github.com/podwire/podwire/pkg/cniplumb"

func main() {
	cniplumb.Main("host-local", cniplumb.Verbs{Add: add, Del: del, Check: check, GC: gc, Status: status})
}
