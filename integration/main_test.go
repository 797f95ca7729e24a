// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"os"
	"testing"

	"github.com/podwire/podwire/integration/nstest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	nstest.CleanupBinDir()
	os.Exit(code)
}
