// SPDX-License-Identifier: Apache-2.0

// Command demo is `make demo`: podwire's main job, end to end, in a minute. It builds
// the plugins into a private CNI bin dir, runs conf-examples/10-kubenet.conflist (bridge
// + host-local + portmap + bandwidth) and 99-loopback.conflist through libcni exactly
// as a runtime does, creates two pods, shows their addresses, pod-to-pod ping, an HTTP
// server in pod A reached through its hostPort from the node and from an outside
// client, pod B's throughput under a 10 Mbit/s limit, deletes both pods and shows that
// nothing of theirs is left.
//
// The "node" is a network namespace of its own, connected to an "outside client"
// namespace by a veth pair on 192.0.2.0/24 (TEST-NET-1): the machine's own interfaces,
// routes and rules are never touched, and everything is removed at the end, also on
// failure or Ctrl-C.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "demo: needs root (it creates network namespaces, links and rules); run `sudo make demo`")
		os.Exit(2)
	}
	d := &demo{start: time.Now()}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := d.run(ctx)
	d.teardown()
	if err != nil {
		fmt.Printf("\n✗ demo failed: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("\n✓ demo finished in %s; the machine is as it was.\n", time.Since(d.start).Round(10*time.Millisecond))
}

func (d *demo) run(ctx context.Context) error {
	steps := []struct {
		title string
		f     func(context.Context) error
	}{
		{"Check tools and build the plugins", d.build},
		{"Create the node, an outside client and two pod namespaces", d.world},
		{"ADD pod A (hostPort 8080 -> 80) and pod B (10 Mbit/s each way)", d.addPods},
		{"Pod-to-pod ping", d.ping},
		{"HTTP server in pod A through hostPort 8080", d.http},
		{"Pod B throughput under its 10 Mbit/s limit", d.throughput},
		{"DEL both pods and compare the node with before", d.delPods},
	}
	for i, s := range steps {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("interrupted: %w", err)
		}
		fmt.Printf("\n[%d/%d] %s\n", i+1, len(steps), s.title)
		t0 := time.Now()
		if err := s.f(ctx); err != nil {
			return fmt.Errorf("step %d (%s): %w", i+1, s.title, err)
		}
		fmt.Printf("      done in %s\n", time.Since(t0).Round(time.Millisecond))
	}
	return nil
}

func say(format string, a ...any) { fmt.Printf("      "+format+"\n", a...) }
