// SPDX-License-Identifier: Apache-2.0

package nstest

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// Run runs a command inside netns n and fails the test if it fails.
func (h *H) Run(n ns.NetNS, name string, args ...string) string {
	h.t.Helper()
	out, err := RunIn(n, name, args...)
	if err != nil {
		h.t.Fatalf("in %s: %s %s: %v\n%s", n.Path(), name, strings.Join(args, " "), err, out)
	}
	return out
}

// RunIn runs a command inside netns n (via nsenter) and returns its combined output.
func RunIn(n ns.NetNS, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	full := append([]string{"--net=" + n.Path(), name}, args...)
	out, err := exec.CommandContext(ctx, "nsenter", full...).CombinedOutput()
	return string(out), err
}

// Start starts a long-running command inside netns n; it is killed at cleanup.
func (h *H) Start(n ns.NetNS, name string, args ...string) *exec.Cmd {
	h.t.Helper()
	full := append([]string{"--net=" + n.Path(), name}, args...)
	cmd := exec.Command("nsenter", full...)
	if err := cmd.Start(); err != nil {
		h.t.Fatalf("starting %s in %s: %v", name, n.Path(), err)
	}
	h.t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd
}

// Ping sends a few pings from netns n to addr (IPv4 or IPv6) and returns an error when
// none is answered.
func Ping(n ns.NetNS, addr string) error {
	out, err := RunIn(n, "ping", "-c", "2", "-i", "0.2", "-W", "2", addr)
	if err != nil {
		return fmt.Errorf("ping %s from %s: %v\n%s", addr, n.Path(), err, out)
	}
	return nil
}

// MustPing is Ping that fails the test.
func (h *H) MustPing(n ns.NetNS, addr string) {
	h.t.Helper()
	if err := Ping(n, addr); err != nil {
		h.t.Fatal(err)
	}
}
