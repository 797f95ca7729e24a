// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/podwire/podwire/integration/nstest"
)

// The podwire CLI's JSON output, as the tests read it (cmd/podwire is package main).
type cliAttachment struct {
	Network       string     `json:"network"`
	ContainerID   string     `json:"containerID"`
	IfName        string     `json:"ifName"`
	Addresses     []string   `json:"addresses"`
	LeaseFiles    []string   `json:"leaseFiles"`
	HostVeth      string     `json:"hostVeth"`
	NetNS         string     `json:"netns"`
	HostPorts     []cliRules `json:"hostPorts"`
	PortmapMarker string     `json:"portmapMarker"`
	Masquerade    []cliRules `json:"masquerade"`
	MacSpoof      []cliRules `json:"macspoof"`
	Qdiscs        []string   `json:"qdiscs"`
	IFB           string     `json:"ifb"`
	Problems      []string   `json:"problems"`
}

type cliRules struct {
	Backend string   `json:"backend"`
	Key     string   `json:"key"`
	Rules   []string `json:"rules"`
}

type cliOrphan struct {
	Network, Kind, Name, Detail string
}

type cliInventory struct {
	Attachments []cliAttachment `json:"attachments"`
	Orphans     []cliOrphan     `json:"orphans"`
}

type cliRemoval struct {
	Network, Plugin, Kind, Name, Owner string
}

type cliPlan struct {
	Removals []cliRemoval `json:"removals"`
	Notes    []string     `json:"notes"`
}

type cliCheck struct {
	Name   string `json:"check"`
	Status string `json:"status"`
	Detail string `json:"detail"`
}

var (
	cliOnce sync.Once
	cliPath string
	cliErr  error
)

// podwireCLI builds cmd/podwire once per test binary (or takes it from
// PODWIRE_BIN_DIR, beside the plugins `make build` put there).
func podwireCLI(t *testing.T) string {
	t.Helper()
	cliOnce.Do(func() {
		if d := os.Getenv("PODWIRE_BIN_DIR"); d != "" {
			cliPath = filepath.Join(d, "podwire")
			return
		}
		root, err := nstest.RepoRoot()
		if err != nil {
			cliErr = err
			return
		}
		dir, err := os.MkdirTemp("", "podwire-cli-")
		if err != nil {
			cliErr = err
			return
		}
		cliPath = filepath.Join(dir, "podwire")
		cmd := exec.Command("go", "build", "-o", cliPath, "./cmd/podwire")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			cliErr = fmt.Errorf("building cmd/podwire: %v\n%s", err, out)
		}
	})
	if cliErr != nil {
		t.Fatal(cliErr)
	}
	return cliPath
}

// runCLI runs podwire in network namespace nsPath ("" for the test's own) and returns
// stdout, stderr and the exit status.
func runCLI(t *testing.T, nsPath string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bin := podwireCLI(t)
	var cmd *exec.Cmd
	if nsPath != "" {
		cmd = exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + nsPath, bin}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, bin, args...)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running podwire %s: %v", strings.Join(args, " "), err)
	}
	return out.String(), errb.String(), code
}

// cliJSON runs podwire and decodes its stdout into v; the command must exit 0.
func cliJSON(t *testing.T, nsPath string, v any, args ...string) {
	t.Helper()
	out, errs, code := runCLI(t, nsPath, args...)
	if code != 0 {
		t.Fatalf("podwire %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, out, errs)
	}
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("podwire %s: output is not JSON: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func cliJSONText(t *testing.T, out string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out)
	}
}
