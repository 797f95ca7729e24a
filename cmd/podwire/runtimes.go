// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/containernetworking/cni/pkg/version"

	"github.com/podwire/podwire/pkg/agent/cri"
	"github.com/podwire/podwire/pkg/runtimes"
)

// defaultCRISockets are where the common runtimes listen.
var defaultCRISockets = []string{"/run/containerd/containerd.sock", "/var/run/crio/crio.sock", "/run/crio/crio.sock"}

// foundRuntime is a container runtime on this node and how it was found.
type foundRuntime struct {
	Name, Version string
	Via           string // "CRI <socket>", "binary <path>" or "--runtime"
}

func (r foundRuntime) String() string { return r.Name + " " + r.Version }

// runtimeFlags registers --cri and --runtime; detect then finds the runtimes.
type runtimeFlags struct {
	cri, given stringList
}

func (f *runtimeFlags) register(fs *flag.FlagSet) {
	fs.Var(&f.cri, "cri", "CRI socket to ask for the runtime's name and version (repeatable; default: containerd's and CRI-O's usual sockets)")
	fs.Var(&f.given, "runtime", "the node's runtime as NAME=VERSION (e.g. containerd=1.6.20), instead of finding it; \"none\" for no runtime check")
}

// detect returns the runtimes --runtime names ("none": no runtime), else those
// answering the CRI Version RPC on the sockets, else those whose binaries are in PATH.
func (f *runtimeFlags) detect(ctx context.Context) ([]foundRuntime, []error) {
	var out []foundRuntime
	for _, g := range f.given {
		if g == "none" {
			return nil, nil
		}
		name, ver, _ := strings.Cut(g, "=")
		out = append(out, foundRuntime{name, ver, "--runtime"})
	}
	if len(out) > 0 {
		return out, nil
	}
	socks := f.cri
	if len(socks) == 0 {
		socks = defaultCRISockets
	}
	var errs []error
	for _, s := range socks {
		if _, err := os.Stat(strings.TrimPrefix(s, "unix://")); err != nil {
			continue
		}
		name, ver, err := criVersion(ctx, s)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, foundRuntime{name, ver, "CRI " + s})
	}
	if len(out) > 0 {
		return out, errs
	}
	for _, bin := range []string{"containerd", "crio"} {
		path, err := exec.LookPath(bin)
		if err != nil {
			continue
		}
		b, err := exec.CommandContext(ctx, path, "--version").Output()
		if err != nil {
			continue
		}
		line, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
		name := map[string]string{"crio": "cri-o"}[bin]
		if name == "" {
			name = bin
		}
		out = append(out, foundRuntime{name, versionWord(line), "binary " + path + " (not running)"})
	}
	return out, errs
}

func criVersion(ctx context.Context, sock string) (name, ver string, err error) {
	c, err := cri.Dial(sock)
	if err != nil {
		return "", "", err
	}
	defer c.Close()
	return c.Version(ctx)
}

// criSandboxes lists the IDs of every pod sandbox the runtime knows, ready or not (a
// sandbox that still exists gets its DEL from the kubelet; its attachments are valid).
func criSandboxes(ctx context.Context, sock string) ([]string, error) {
	c, err := cri.Dial(sock)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	sbs, err := c.Sandboxes(ctx)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, s := range sbs {
		ids = append(ids, s.ID)
	}
	return ids, nil
}

// runtimeVerdicts judges cniVersion v for each runtime found, from pkg/runtimes'
// table: refusals are errors (every pod fails), skipped GC and STATUS are notes.
func runtimeVerdicts(found []foundRuntime, v string) (errs, notes []string) {
	for _, r := range found {
		c := runtimes.Lookup(r.Name, r.Version)
		if newer, err := version.GreaterThan(v, c.MaxCNIVersion); err == nil && newer {
			errs = append(errs, fmt.Sprintf("%s (%s, %s) accepts cniVersion up to %s and refuses %s for every pod: set \"cniVersion\": %q", r, r.Via, c.Source, c.MaxCNIVersion, v, c.MaxCNIVersion))
			continue
		}
		if below, _ := version.GreaterThan("1.1.0", v); below {
			notes = append(notes, fmt.Sprintf("at cniVersion %s libcni never calls GC or STATUS (they need 1.1.0); %s accepts up to %s", v, r, c.MaxCNIVersion))
		}
	}
	return errs, notes
}

// runtimeGC says whether the runtime calls GC and STATUS (pkg/runtimes).
func runtimeGC(r foundRuntime) string {
	c := runtimes.Lookup(r.Name, r.Version)
	status := "does not call STATUS"
	if c.CallsStatus {
		status = "calls STATUS"
	}
	gc := "never calls GC (run podwire gc, or the podwire agent)"
	switch c.GC {
	case runtimes.GCAtStartup:
		gc = "calls GC only at startup"
	case runtimes.GCPeriodic:
		gc = "calls GC periodically"
	}
	known := ""
	if !c.Known {
		known = " (not in podwire's table: assumed)"
	}
	return fmt.Sprintf("; accepts cniVersion up to %s, %s, %s%s", c.MaxCNIVersion, status, gc, known)
}
