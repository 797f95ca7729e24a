// SPDX-License-Identifier: Apache-2.0

package delegate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/podwire/podwire/pkg/cniplumb"
)

// testVerbs are the test plugin's: ADD echoes prevResult or makes a result, and fails
// or panics when the config says so; STATUS always reports code 50.
var testVerbs = cniplumb.Verbs{
	Add: func(_ context.Context, in *cniplumb.Input) (types.Result, error) {
		var c struct {
			Panic bool `json:"panic"`
			Fail  bool `json:"fail"`
		}
		if err := in.Decode(&c); err != nil {
			return nil, err
		}
		if c.Panic {
			var m map[string]int
			m["boom"]++ // nil map write: a real runtime panic
		}
		if c.Fail {
			return nil, errors.New("plain failure")
		}
		if in.PrevResult != nil {
			return in.PrevResult, nil
		}
		return &current.Result{CNIVersion: current.ImplementedSpecVersion,
			Interfaces: []*current.Interface{{Name: in.IfName, Sandbox: in.Netns}},
			IPs:        []*current.IPConfig{{Address: net.IPNet{IP: net.IPv4(10, 1, 2, 3), Mask: net.CIDRMask(24, 32)}}}}, nil
	},
	Del: func(context.Context, *cniplumb.Input) error { return nil },
	Status: func(context.Context, *cniplumb.Input) error {
		return cniplumb.NotAvailable("test says so")
	},
}

// The test binary doubles as the delegated plugin: with PODWIRE_PLUMB_TEST=1 it runs
// cniplumb.Main with testVerbs, so the executed path is the real one.
func TestMain(m *testing.M) {
	if os.Getenv("PODWIRE_PLUMB_TEST") == "1" {
		cniplumb.Main("plumbtest", testVerbs)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// testStamp is a BuildStamp this test binary contains (as this literal), standing in
// for the one `make build` links into every plugin.
const testStamp = "podwire-build:unit-test-5c1e0a"

// delegateEnv points CNI_PATH at a directory whose "plumbtest" is this test binary
// (which runs testVerbs when executed) and sets the rest of a CNI call's environment.
func delegateEnv(t *testing.T, cmd string) (dir string, in func(stdin string) *cniplumb.Input) {
	t.Helper()
	dir = t.TempDir()
	if err := os.Symlink(os.Args[0], filepath.Join(dir, "plumbtest")); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"CNI_COMMAND": cmd, "CNI_CONTAINERID": "c1", "CNI_IFNAME": "eth0", "CNI_PATH": dir,
		// No container netns without root; the plugin's own one stands in.
		"CNI_NETNS": "/proc/self/ns/net", "CNI_NETNS_OVERRIDE": "1",
		"PODWIRE_PLUMB_TEST": "1",
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
	runDir := t.TempDir()
	return dir, func(stdin string) *cniplumb.Input {
		// An unstamped build, as a plain `go test` is; tests that delegate in-process
		// set BuildStamp.
		in := &cniplumb.Input{Command: cmd, ContainerID: env["CNI_CONTAINERID"], Netns: env["CNI_NETNS"],
			IfName: env["CNI_IFNAME"], Path: dir, Stdin: []byte(stdin), RunDir: runDir}
		if err := json.Unmarshal(in.Stdin, &in.Conf); err != nil {
			t.Fatalf("parsing input: %v", err)
		}
		return in
	}
}

func ownPackage(t *testing.T) string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		t.Fatal("no build info in the test binary: a module-mode `go test` always has it")
	}
	return bi.Path
}

// outcome renders what a delegated call returned: the result as JSON, or the error's
// type, code, message and details.
func outcome(r types.Result, err error) string {
	if err != nil {
		var e *types.Error
		if !errors.As(err, &e) {
			return "not a CNI error: " + err.Error()
		}
		return fmt.Sprintf("error %d | %s | %s", e.Code, e.Msg, e.Details)
	}
	if r == nil {
		return "ok"
	}
	b, _ := json.Marshal(r)
	return "version " + r.Version() + " " + string(b)
}

// TestDelegatorInProcessMatchesExec runs the same calls through an executed plugin and
// in-process, and requires identical results and errors, panics included.
func TestDelegatorInProcessMatchesExec(t *testing.T) {
	pkg := ownPackage(t)
	cases := []struct {
		name, cmd, stdin string
	}{
		{"ADD 1.0.0", "ADD", `{"cniVersion":"1.0.0","name":"n","type":"x","ipam":{"type":"plumbtest"}}`},
		{"ADD 0.3.1 (converted)", "ADD", `{"cniVersion":"0.3.1","name":"n","type":"x"}`},
		{"ADD error", "ADD", `{"cniVersion":"1.0.0","name":"n","fail":true}`},
		{"ADD panic", "ADD", `{"cniVersion":"1.0.0","name":"n","panic":true}`},
		{"ADD decode error", "ADD", `{"cniVersion":"1.0.0","name":"n","fail":"yes"}`},
		{"DEL", "DEL", `{"cniVersion":"1.0.0","name":"n"}`},
		{"CHECK (none implemented)", "CHECK", `{"cniVersion":"1.0.0","name":"n"}`},
		{"STATUS 50", "STATUS", `{"cniVersion":"1.1.0","name":"n"}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, input := delegateEnv(t, tc.cmd)
			in := input(tc.stdin)
			call := func(d Delegator) string {
				ctx := context.Background()
				switch tc.cmd {
				case "ADD":
					return outcome(d.Add(ctx, in, "plumbtest"))
				case "DEL":
					return outcome(nil, d.Del(ctx, in, "plumbtest"))
				case "CHECK":
					return outcome(nil, d.Check(ctx, in, "plumbtest"))
				default:
					return outcome(nil, d.Status(ctx, in, "plumbtest"))
				}
			}
			executed := call(Delegator{})
			in.BuildStamp = testStamp
			d := Delegator{Builtin: map[string]Builtin{"plumbtest": {Verbs: testVerbs, Package: pkg}}}
			if !d.InProcess(in, "plumbtest") {
				t.Fatal("the test binary under its own stamp is not taken as the same build")
			}
			local := call(d)
			if local != executed {
				t.Errorf("in-process and executed differ:\n in-process: %s\n executed:   %s", local, executed)
			}
		})
	}
}

// TestDelegatorExecutesOtherBuilds: a plugin runs in-process only when the file is the
// same build; everything else is executed, and the verdict follows the file.
func TestDelegatorExecutesOtherBuilds(t *testing.T) {
	pkg := ownPackage(t)
	dir, input := delegateEnv(t, "ADD")
	in := input(`{"cniVersion":"1.0.0","name":"n"}`)
	d := Delegator{Builtin: map[string]Builtin{"plumbtest": {Verbs: testVerbs, Package: pkg}}}

	in.BuildStamp = ""
	if d.InProcess(in, "plumbtest") {
		t.Error("an unstamped build runs plugins in-process")
	}
	in.BuildStamp = fmt.Sprintf("podwire-build:absent-%d", time.Now().UnixNano()) // made at run time: not in the file
	if d.InProcess(in, "plumbtest") {
		t.Error("a file without this build's stamp is taken as the same build")
	}
	in.BuildStamp = testStamp
	other := Delegator{Builtin: map[string]Builtin{"plumbtest": {Verbs: testVerbs, Package: "github.com/podwire/podwire/plugins/ipam/host-local"}}}
	if other.InProcess(in, "plumbtest") {
		t.Error("a binary of another main package is taken as the plugin")
	}
	if !d.InProcess(in, "plumbtest") {
		t.Fatal("the same build is not run in-process")
	}
	if b, err := os.ReadFile(filepath.Join(in.RunDir, "delegate-plumbtest")); err != nil || !strings.HasSuffix(string(b), "\nyes\n") {
		t.Errorf("verdict cache: %q, %v", b, err)
	}
	if (Delegator{Builtin: map[string]Builtin{}}).InProcess(in, "plumbtest") {
		t.Error("a plugin without builtin verbs runs in-process")
	}

	// The file is replaced by a script of the same name: executed from then on, even
	// though the cache said "same" for the old file.
	link := filepath.Join(dir, "plumbtest")
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(link, []byte("#!/bin/sh\necho '"+testStamp+"'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if d.InProcess(in, "plumbtest") {
		t.Error("a replaced file kept the cached verdict")
	}
	// Not executable: executing it reports the error, so it must not run in-process.
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	exe, _ := os.ReadFile(os.Args[0])
	if err := os.WriteFile(link, exe, 0o644); err != nil {
		t.Fatal(err)
	}
	if d.InProcess(in, "plumbtest") {
		t.Error("a file without exec permission runs in-process")
	}
	now := time.Now()
	if err := os.Chmod(link, 0o755); err != nil {
		t.Fatal(err)
	}
	_ = os.Chtimes(link, now, now)
	if !d.InProcess(in, "plumbtest") {
		t.Error("an executable copy of the same build is not run in-process")
	}
}
