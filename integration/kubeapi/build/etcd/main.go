// SPDX-License-Identifier: Apache-2.0

// Command etcd is etcd's own server, built from the Go module proxy for podwire's
// integration tests (integration/kubeapi); nothing of podwire is in it.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
