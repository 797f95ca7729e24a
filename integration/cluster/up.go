// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/podwire/podwire/integration/containerd"
	"github.com/podwire/podwire/integration/kubeapi"
)

// defaultAgnhost is the agnhost name e2e.test v1.37.2 expects first; the lab asks
// e2e.test for the whole list when it has been built.
const defaultAgnhost = "registry.k8s.io/e2e-test-images/agnhost:2.66.1"

// Up brings the lab up, or reports it as it is when it is already up. A run dir left by
// a failed or interrupted Up is torn down first. The last two lines it writes to log are
// the exports that point kubectl at the lab.
func Up(ctx context.Context, c Config, log io.Writer) (Plan, error) {
	if os.Geteuid() != 0 {
		return Plan{}, errNotRoot
	}
	p, err := NewPlan(c)
	if err != nil {
		return Plan{}, err
	}
	if old, err := loadState(p.StateFile); err != nil {
		return Plan{}, err
	} else if old != nil {
		if old.running() && old.Plan.ProxyMode == p.ProxyMode && slices.Equal(old.Plan.runtimes(), p.runtimes()) {
			fmt.Fprintln(log, "the lab is already up (make cluster-down to remove it)")
			printExports(log, old.Plan)
			return old.Plan, nil
		}
		fmt.Fprintln(log, "removing the previous lab in", p.Dir)
		if err := Down(p.Dir, log); err != nil {
			return Plan{}, err
		}
	}
	start := time.Now()
	if p.BinDir, err = kubeapi.EnsureCluster(p.Repo, p.E2E); err != nil {
		return Plan{}, err
	}
	rt, err := containerd.EnsureContainerd2(p.Repo)
	if err != nil {
		return Plan{}, err
	}
	p.ContainerdDir = filepath.Dir(rt.Containerd)
	if err := ensureCRIO(&p); err != nil {
		return Plan{}, err
	}
	coredns, err := ensureCoreDNS(p.Repo)
	if err != nil {
		return Plan{}, err
	}
	fmt.Fprintf(log, "binaries ready in %s (%s)\n", time.Since(start).Round(time.Second), p.BinDir)
	if err := os.MkdirAll(filepath.Join(p.Dir, "images"), 0o755); err != nil {
		return Plan{}, err
	}
	images, err := buildImages(p, p.agnhostNames(), coredns)
	if err != nil {
		return Plan{}, err
	}
	fmt.Fprintf(log, "images ready at %s\n", time.Since(start).Round(time.Second))

	s := &State{Plan: p}
	if err := s.save(); err != nil {
		return Plan{}, err
	}
	steps := []struct {
		what string
		do   func() error
	}{
		{"pin dir", s.pinDir},
		{"segment", s.segment},
		{"certificates", func() error { return writePKI(p) }},
		{"control plane", func() error { return s.controlPlane(ctx) }},
	}
	for _, n := range p.Nodes {
		n := n
		steps = append(steps,
			struct {
				what string
				do   func() error
			}{"node " + n.Name, func() error {
				if err := s.nodeNetNS(n); err != nil {
					return err
				}
				if err := s.nodeMountNS(n); err != nil {
					return err
				}
				return s.startNode(ctx, n, images)
			}})
	}
	for _, st := range steps {
		if err := st.do(); err != nil {
			return p, fmt.Errorf("%s: %w (the lab is half up: make cluster-down removes it)", st.what, err)
		}
		fmt.Fprintf(log, "%s  %s up\n", time.Now().Format("15:04:05"), st.what)
	}
	// Registered but NotReady: no CNI config on the nodes yet.
	if err := p.waitNodes(ctx, log, 3*time.Minute, func(bool) bool { return true }); err != nil {
		return p, err
	}
	if err := s.hostRoutes(ctx); err != nil {
		return p, err
	}
	if c.Agent {
		if err := p.applyAddons(ctx, log); err != nil {
			return p, err
		}
	}
	fmt.Fprintf(log, "the lab is up in %s (kube-proxy mode %s, runtimes %s); make cluster-down removes it\n",
		time.Since(start).Round(time.Second), p.ProxyMode, strings.Join(p.runtimes(), ","))
	printExports(log, p)
	return p, nil
}

// agnhostNames are the names the agnhost image is imported under: the agnhost images
// e2e.test lists (its --list-images), the default first, and the e2e images whose specs
// need only what the agnhost image has (glibc-dns-testing: glibc's resolver and dig;
// busybox: sh and the busybox tools). Only the default when e2e.test cannot say.
func (p Plan) agnhostNames() []string {
	names := []string{defaultAgnhost}
	if !p.E2E {
		return names
	}
	out, err := run(p.bin("e2e.test"), "--list-images")
	if err != nil {
		return names
	}
	for _, l := range strings.Fields(out) {
		// Not gcr.io/k8s-authenticated-test/agnhost: specs expect that one to fail to pull.
		if l == defaultAgnhost {
			continue
		}
		if strings.HasPrefix(l, "registry.k8s.io/e2e-test-images/agnhost:") ||
			strings.HasPrefix(l, "registry.k8s.io/e2e-test-images/glibc-dns-testing:") ||
			strings.HasPrefix(l, "registry.k8s.io/e2e-test-images/busybox:") {
			names = append(names, l)
		}
	}
	return names
}

// runtimes is each node's runtime, in node order.
func (p Plan) runtimes() []string {
	var out []string
	for _, n := range p.Nodes {
		out = append(out, n.Runtime)
	}
	return out
}

func printExports(log io.Writer, p Plan) {
	fmt.Fprintf(log, "export KUBECONFIG=%s\n", p.Kubeconfig)
	fmt.Fprintf(log, "export PATH=%s:$PATH\n", p.BinDir)
}

// running reports whether every daemon the state lists is alive.
func (s *State) running() bool {
	if len(s.Procs) == 0 {
		return false
	}
	for _, p := range s.Procs {
		if !p.alive() {
			return false
		}
	}
	return true
}

// Load returns the plan of the lab that is up in dir.
func Load(dir string) (Plan, error) {
	s, err := loadState(filepath.Join(dir, "state.json"))
	if err != nil {
		return Plan{}, err
	}
	if s == nil || !s.running() {
		return Plan{}, fmt.Errorf("no lab is up in %s: run make cluster", dir)
	}
	return s.Plan, nil
}

// SetProxyMode restarts kube-proxy on every node of the lab in dir in mode. kube-proxy
// removes the other mode's rules itself when it starts.
func SetProxyMode(dir, mode string) (Plan, error) {
	s, err := loadState(filepath.Join(dir, "state.json"))
	if err != nil {
		return Plan{}, err
	}
	if s == nil || !s.running() {
		return Plan{}, fmt.Errorf("no lab is up in %s: run make cluster", dir)
	}
	c := s.Plan.Config
	c.ProxyMode = mode
	if _, err := NewPlan(c); err != nil {
		return Plan{}, err
	}
	if s.Plan.ProxyMode == mode {
		return s.Plan, nil
	}
	s.Plan.ProxyMode = mode
	p := s.Plan
	kept := s.Procs[:0]
	for _, pr := range s.Procs {
		if strings.HasSuffix(pr.Name, "-kube-proxy") {
			if err := pr.stop(10 * time.Second); err != nil {
				return p, err
			}
			continue
		}
		kept = append(kept, pr)
	}
	s.Procs = kept
	for _, n := range p.Nodes {
		if err := os.WriteFile(n.Path("kube-proxy.yaml"), []byte(p.kubeProxyConfig(n)), 0o644); err != nil {
			return p, err
		}
		if err := s.startProxy(n); err != nil {
			return p, err
		}
	}
	return p, s.save()
}
