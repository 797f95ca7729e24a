// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/podwire/podwire/integration/nstest"
)

func TestMain(m *testing.M) {
	// Go's net package probes the IPv6 stack once per process, binding ::1 from whichever
	// thread first needs it (a dual-stack "[::]" listener, for one). Prime it here, in the
	// host's namespace: a test whose first such socket is in a namespace without lo up
	// would otherwise make every later "[::]" listener of this process IPv4-only.
	if l, err := net.Listen("tcp", "[::]:0"); err == nil {
		l.Close()
	}
	code := m.Run()
	nstest.CleanupBinDir()
	for _, bin := range []string{agentBinPath, initBinPath, pid1BinPath} {
		if bin != "" {
			os.RemoveAll(filepath.Dir(bin))
		}
	}
	os.Exit(code)
}
