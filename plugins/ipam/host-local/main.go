// SPDX-License-Identifier: Apache-2.0

// Command host-local is podwire's IPAM plugin: it leases addresses from node-local
// ranges, in the same on-disk format as the reference host-local.
package main

import (
	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/ipam/hostlocal"
)

func main() {
	cniplumb.Main("host-local", hostlocal.Verbs)
}
