// SPDX-License-Identifier: Apache-2.0

// Command lab brings podwire's Kubernetes lab up and down (make cluster, make
// cluster-down): see package integration/cluster.
//
//	go run ./integration/cluster/lab up      # PROXY_MODE=iptables|nftables NODES=1|2 LAB_DIR=/tmp/podwire-lab RUNTIMES=containerd,crio
//	go run ./integration/cluster/lab down
//	go run ./integration/cluster/lab restart pwlab-2-kubelet   # one daemon, as it was started
//	go run ./integration/cluster/lab stop kube-apiserver       # stop one (an outage); start brings it back
//	go run ./integration/cluster/lab snapshot > before.txt   # the machine's state the lab must leave as it was
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/podwire/podwire/integration/cluster"
)

func main() {
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: lab up|down|restart NAME|stop NAME|start NAME|snapshot   (environment: PROXY_MODE, NODES, LAB_DIR, RUNTIMES, LAB_E2E=0)")
	}
	flag.Parse()
	if err := runCmd(flag.Arg(0)); err != nil {
		fmt.Fprintln(os.Stderr, "lab:", err)
		os.Exit(1)
	}
}

func runCmd(verb string) error {
	repo, err := os.Getwd()
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(repo, "integration", "cluster")); err != nil {
		return fmt.Errorf("run the lab from podwire's checkout (make cluster): %w", err)
	}
	c := cluster.DefaultConfig(repo)
	if c, err = cluster.FromEnv(c); err != nil {
		return err
	}
	if os.Getenv("LAB_E2E") == "0" {
		c.E2E = false // no conformance binary: a quicker first build
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	switch verb {
	case "up":
		_, err := cluster.Up(ctx, c, os.Stdout)
		return err
	case "down":
		return cluster.Down(c.Dir, os.Stdout)
	case "conformance":
		// e2e.test's sig-network conformance specs, once per kube-proxy mode; the tables
		// go to stdout (docs/CONFORMANCE.md holds a run's).
		modes := []string{"iptables", "nftables"}
		if v := os.Getenv("CONFORMANCE_MODES"); v != "" {
			modes = strings.Split(v, ",")
		}
		passes := cluster.ConformancePasses
		if v := os.Getenv("CONFORMANCE_PASSES"); v != "" {
			passes = nil
			for _, name := range strings.Split(v, ",") {
				i := slices.IndexFunc(cluster.ConformancePasses, func(p cluster.Pass) bool { return p.Name == name })
				if i < 0 {
					return fmt.Errorf("CONFORMANCE_PASSES: no pass %q (conformance, serial, extra)", name)
				}
				passes = append(passes, cluster.ConformancePasses[i])
			}
		}
		for _, m := range modes {
			for _, pass := range passes {
				specs, err := cluster.RunConformance(c.Dir, m, pass, os.Stderr)
				if err != nil {
					return err
				}
				// Each table as soon as its pass ends: a long run shows progress.
				fmt.Println(cluster.ConformanceTable(m, pass.Name, specs))
			}
		}
		return nil
	case "restart":
		// One daemon, by its name in the state file: lab restart pwlab-2-kube-proxy.
		return cluster.Restart(c.Dir, flag.Arg(1))
	case "stop":
		return cluster.Stop(c.Dir, flag.Arg(1))
	case "start":
		return cluster.Start(c.Dir, flag.Arg(1))
	case "snapshot":
		snap, err := cluster.MachineSnapshot(c.Prefix, c.Dir)
		if err != nil {
			return err
		}
		fmt.Print(snap)
		return nil
	}
	flag.Usage()
	return fmt.Errorf("unknown verb %q", verb)
}
