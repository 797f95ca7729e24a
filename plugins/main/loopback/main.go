// SPDX-License-Identifier: Apache-2.0

// Command loopback brings up the lo interface inside a container's network namespace.
package main

import "github.com/podwire/podwire/pkg/cniplumb"

func main() {
	cniplumb.Main("loopback", cniplumb.Verbs{Add: add, Del: del, Check: check, Status: status, GC: gc})
}
