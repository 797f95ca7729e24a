// SPDX-License-Identifier: Apache-2.0

package main

import (
	"testing"

	"github.com/podwire/podwire/pkg/confkeys"
)

// podwire validate's key list for portmap is this plugin's config struct.
func TestConfKeys(t *testing.T) {
	if d := confkeys.Diff("portmap", rawConf{}); d != "" {
		t.Error(d)
	}
}
