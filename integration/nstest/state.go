// SPDX-License-Identifier: Apache-2.0

package nstest

import (
	"os"
	"strings"
	"testing"
	"time"

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

// procsSettle is how long RequireNoNewProcs waits for processes a cleanup has just
// killed to be waited for by their owners' goroutines.
const procsSettle = 5 * time.Second

// RequireNoNewProcs records the test process's descendants now and registers a cleanup
// that fails the test when, after every cleanup registered later (a containerd or
// kube-apiserver the test keeps until its own cleanup included), a descendant that was
// not there now is left, alive or a zombie: when a plugin, a runtime or a helper exits,
// its work is done and no process it started is left. New calls it; a test without an
// H calls it first.
func RequireNoNewProcs(t testing.TB) {
	t.Helper()
	before, err := nodestate.Descendants(os.Getpid())
	if err != nil {
		t.Fatalf("listing the test's processes: %v", err)
	}
	t.Cleanup(func() {
		var left []nodestate.Proc
		for deadline := time.Now().Add(procsSettle); ; time.Sleep(50 * time.Millisecond) {
			now, err := nodestate.Descendants(os.Getpid())
			if err != nil {
				t.Errorf("listing the test's processes: %v", err)
				return
			}
			if left = nodestate.NewProcs(before, now); len(left) == 0 || time.Now().After(deadline) {
				break
			}
		}
		if len(left) > 0 {
			var lines []string
			for _, p := range left {
				lines = append(lines, p.String())
			}
			t.Errorf("%d processes this test started are left after all of its cleanups (%v after the last):\n%s",
				len(left), procsSettle, strings.Join(lines, "\n"))
		}
	})
}
