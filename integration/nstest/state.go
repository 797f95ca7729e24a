// SPDX-License-Identifier: Apache-2.0

package nstest

import (
	"github.com/podwire/podwire/integration/nodestate"
)

// Snapshot takes the host netns's node state plus the test's lease files.
func (h *H) Snapshot() nodestate.Snapshot {
	h.t.Helper()
	s, err := nodestate.Take(h.HostNS.Path(), h.DataDir)
	if err != nil {
		h.t.Fatalf("snapshot of node state: %v", err)
	}
	return s
}

// RequireUnchanged fails the test when the node state differs from before.
func (h *H) RequireUnchanged(before nodestate.Snapshot) {
	h.t.Helper()
	if d := nodestate.Diff(before, h.Snapshot()); d != "" {
		h.t.Fatalf("node state changed (- before, + after):\n%s", d)
	}
}
