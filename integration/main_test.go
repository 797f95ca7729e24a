// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/podwire/podwire/integration/nstest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	nstest.CleanupBinDir()
	if agentBinPath != "" {
		os.RemoveAll(filepath.Dir(agentBinPath))
	}
	os.Exit(code)
}
