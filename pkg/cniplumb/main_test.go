// SPDX-License-Identifier: Apache-2.0

package cniplumb

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/google/go-cmp/cmp"
)

// testVerbs are the test plugin's: its ADD echoes prevResult or makes a result, and
// fails or panics when the config says so.
var testVerbs = Verbs{
	Add: func(_ context.Context, in *Input) (types.Result, error) {
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
		if in.Prev != nil {
			return in.Prev, nil
		}
		return &current.Result{CNIVersion: current.ImplementedSpecVersion,
			Interfaces: []*current.Interface{{Name: in.IfName, Sandbox: in.Netns}},
			IPs:        []*current.IPConfig{{Interface: current.Int(0), Address: net.IPNet{IP: net.IPv4(10, 9, 8, 7).To4(), Mask: net.CIDRMask(24, 32)}}}}, nil
	},
	Del: func(context.Context, *Input) error { return nil },
	Status: func(context.Context, *Input) error {
		return NotAvailable("test says so")
	},
}

// The test binary doubles as a plugin: with PODWIRE_PLUMB_TEST=1 it runs Main, so the
// tests below exercise the real exec path (exit status, stdout) without root.
func TestMain(m *testing.M) {
	if os.Getenv("PODWIRE_PLUMB_TEST") == "1" {
		if vs := os.Getenv("PODWIRE_PLUMB_VERSIONS"); vs != "" {
			testVerbs.Versions = strings.Split(vs, ",")
		}
		Main("plumbtest", testVerbs)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

type runResult struct {
	stdout, stderr string
	exitCode       int
}

func runPlugin(t *testing.T, env map[string]string, stdin string) runResult {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = []string{"PODWIRE_PLUMB_TEST=1"}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running plugin: %v", err)
	}
	return runResult{out.String(), errb.String(), code}
}

func baseEnv(cmd string) map[string]string {
	return map[string]string{
		"CNI_COMMAND": cmd, "CNI_CONTAINERID": "c1", "CNI_IFNAME": "eth0",
		"CNI_NETNS": "/proc/self/ns/net", "CNI_PATH": "/nonexistent",
		// The test has no container netns without root; the plugin's own one stands in.
		"CNI_NETNS_OVERRIDE": "1",
	}
}

const goodConf = `{"cniVersion":"1.0.0","name":"net1","type":"plumbtest"}`

func TestBadInput(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cmd      string
		env      map[string]string // overrides; "" deletes
		stdin    string
		wantCode uint
		wantText string
	}{
		{name: "malformed JSON", stdin: `{"cniVersion":`, wantCode: 6, wantText: "network configuration"},
		{name: "empty stdin", stdin: ``, wantCode: 6, wantText: "stdin is empty"},
		{name: "unsupported version", stdin: `{"cniVersion":"9.9.9","name":"n"}`, wantCode: 1, wantText: `"9.9.9" is not supported`},
		{name: "version of another plugin", env: map[string]string{"PODWIRE_PLUMB_VERSIONS": "0.3.0,1.0.0"}, stdin: `{"cniVersion":"0.2.0","name":"n"}`, wantCode: 1, wantText: `"0.2.0" is not supported; this plugin supports [0.3.0 1.0.0]`},
		{name: "no cniVersion where 0.1.0 is not supported", env: map[string]string{"PODWIRE_PLUMB_VERSIONS": "0.3.0,1.0.0"}, stdin: `{"name":"n"}`, wantCode: 1, wantText: "no cniVersion, which means 0.1.0"},
		{name: "CHECK at 0.3.1", cmd: "CHECK", stdin: `{"cniVersion":"0.3.1","name":"n"}`, wantCode: 1, wantText: "CHECK"},
		{name: "STATUS at 0.2.0", cmd: "STATUS", stdin: `{"cniVersion":"0.2.0","name":"n"}`, wantCode: 1, wantText: "STATUS"},
		{name: "missing network name", stdin: `{"cniVersion":"1.0.0"}`, wantCode: 7, wantText: "network name is missing"},
		{name: "network name with path", stdin: `{"cniVersion":"1.0.0","name":"../../etc"}`, wantCode: 7, wantText: `"../../etc"`},
		{name: "container ID with slash", env: map[string]string{"CNI_CONTAINERID": "a/b"}, wantCode: 4, wantText: `"a/b" has '/'`},
		{name: "container ID dotdot", env: map[string]string{"CNI_CONTAINERID": ".."}, wantCode: 4, wantText: `".." has '.' at position 0`},
		{name: "container ID missing", env: map[string]string{"CNI_CONTAINERID": ""}, wantCode: 4, wantText: "container ID is empty"},
		{name: "ifname too long", env: map[string]string{"CNI_IFNAME": "abcdefghijklmnop"}, wantCode: 4, wantText: "16 bytes long; Linux allows at most 15"},
		{name: "ifname with slash", env: map[string]string{"CNI_IFNAME": "a/b"}, wantCode: 4, wantText: `has '/'`},
		{name: "ifname with colon", env: map[string]string{"CNI_IFNAME": "eth0:1"}, wantCode: 4, wantText: `has ':'`},
		{name: "ifname dot", env: map[string]string{"CNI_IFNAME": "."}, wantCode: 4, wantText: "not allowed"},
		{name: "netns missing", env: map[string]string{"CNI_NETNS": ""}, wantCode: 4, wantText: "CNI_NETNS is not set"},
		{name: "netns relative", env: map[string]string{"CNI_NETNS": "netns/x"}, wantCode: 4, wantText: "not absolute"},
		{name: "netns nonexistent", env: map[string]string{"CNI_NETNS": "/var/run/netns/podwire-does-not-exist"}, wantCode: 4, wantText: "cannot be used"},
		{name: "netns is the plugin's own", env: map[string]string{"CNI_NETNS_OVERRIDE": ""}, wantCode: 8, wantText: "plugin's own network namespace"},
		{name: "CNI_PATH missing", env: map[string]string{"CNI_PATH": ""}, wantCode: 4, wantText: "CNI_PATH is not set"},
		{name: "unknown command", cmd: "FROB", wantCode: 4, wantText: "FROB"},
		{name: "wrong type in config", stdin: `{"cniVersion":"1.0.0","name":"n","panic":"yes"}`, wantCode: 6, wantText: "panic"},
		{name: "panic becomes 999", stdin: `{"cniVersion":"1.0.0","name":"n","panic":true}`, wantCode: 999, wantText: "panic: assignment to entry in nil map"},
		{name: "plain error becomes 999", stdin: `{"cniVersion":"1.0.0","name":"n","fail":true}`, wantCode: 999, wantText: "plain failure"},
		{name: "bad prevResult", stdin: `{"cniVersion":"1.0.0","name":"n","prevResult":{"ips":[{"address":"nonsense"}]}}`, wantCode: 6, wantText: "prevResult"},
		{name: "status error 50", cmd: "STATUS", stdin: `{"cniVersion":"1.1.0","name":"n"}`, wantCode: 50, wantText: "test says so"},
		{name: "GC on old version", cmd: "GC", stdin: `{"cniVersion":"1.0.0","name":"n"}`, wantCode: 1, wantText: "GC"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := tc.cmd
			if cmd == "" {
				cmd = "ADD"
			}
			env := baseEnv(cmd)
			for k, v := range tc.env {
				if v == "" {
					delete(env, k)
				} else {
					env[k] = v
				}
			}
			stdin := tc.stdin
			if stdin == "" && tc.name != "empty stdin" {
				stdin = goodConf
			}
			r := runPlugin(t, env, stdin)
			if r.exitCode == 0 {
				t.Fatalf("exit status 0, want non-zero; stdout=%s", r.stdout)
			}
			var e types.Error
			if err := json.Unmarshal([]byte(r.stdout), &e); err != nil {
				t.Fatalf("stdout is not a JSON CNI error: %v\nstdout=%q\nstderr=%q", err, r.stdout, r.stderr)
			}
			if e.Code != tc.wantCode {
				t.Errorf("code = %d, want %d (msg %q details %q)", e.Code, tc.wantCode, e.Msg, e.Details)
			}
			if !strings.Contains(e.Msg+"; "+e.Details, tc.wantText) {
				t.Errorf("error %q does not mention %q", e.Msg+"; "+e.Details, tc.wantText)
			}
			if strings.Contains(r.stdout, "goroutine ") {
				t.Errorf("stdout carries a Go stack trace: %s", r.stdout)
			}
		})
	}
}

func TestResultConvertedToCallerVersion(t *testing.T) {
	for _, v := range SupportedVersions {
		t.Run(v, func(t *testing.T) {
			r := runPlugin(t, baseEnv("ADD"), `{"cniVersion":"`+v+`","name":"n","type":"plumbtest"}`)
			if r.exitCode != 0 {
				t.Fatalf("exit %d: %s %s", r.exitCode, r.stdout, r.stderr)
			}
			var got struct {
				CNIVersion string `json:"cniVersion"`
			}
			if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || got.CNIVersion != v {
				t.Fatalf("result cniVersion = %q (err %v), want %q; stdout %s", got.CNIVersion, err, v, r.stdout)
			}
		})
	}
}

// TestLegacyVersions: 0.1.0, 0.2.0 and a configuration without cniVersion (0.1.0) work
// for every verb they allow, as in the reference plugins; their results are types/020.
func TestLegacyVersions(t *testing.T) {
	for _, tc := range []struct{ name, conf, want string }{
		{"0.1.0", `{"cniVersion":"0.1.0","name":"n","type":"plumbtest"}`, `"cniVersion": "0.1.0"`},
		{"0.2.0", `{"cniVersion":"0.2.0","name":"n","type":"plumbtest"}`, `"cniVersion": "0.2.0"`},
		{"no cniVersion", `{"name":"n","type":"plumbtest"}`, `"cniVersion": "0.1.0"`},
		{"empty cniVersion", `{"cniVersion":"","name":"n","type":"plumbtest"}`, `"cniVersion": "0.1.0"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runPlugin(t, baseEnv("ADD"), tc.conf)
			if r.exitCode != 0 || !strings.Contains(r.stdout, tc.want) || strings.Contains(r.stdout, "interfaces") {
				t.Fatalf("ADD: exit %d, stdout %s, want a types/020 result with %s; stderr %s", r.exitCode, r.stdout, tc.want, r.stderr)
			}
			if r := runPlugin(t, baseEnv("DEL"), tc.conf); r.exitCode != 0 {
				t.Fatalf("DEL: exit %d, stdout %s", r.exitCode, r.stdout)
			}
		})
	}
}

// TestPrevResultAtLegacyVersion: a 0.2.0 prevResult reaches the verb as Prev, unchanged,
// and as PrevResult in 1.x form.
func TestPrevResultAtLegacyVersion(t *testing.T) {
	conf := `{"cniVersion":"0.2.0","name":"n","type":"plumbtest","prevResult":{"cniVersion":"0.2.0",
		"ip4":{"ip":"10.1.2.3/24","gateway":"10.1.2.1","routes":[{"dst":"0.0.0.0/0"}]}}}`
	r := runPlugin(t, baseEnv("ADD"), conf)
	if r.exitCode != 0 {
		t.Fatalf("exit %d: %s %s", r.exitCode, r.stdout, r.stderr)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"cniVersion": "0.2.0", "dns": map[string]any{},
		"ip4": map[string]any{"ip": "10.1.2.3/24", "gateway": "10.1.2.1", "routes": []any{map[string]any{"dst": "0.0.0.0/0"}}}}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("prevResult not passed through unchanged (-want +got):\n%s", d)
	}
	in, err := parseInput("ADD", func(string) string { return "" }, []byte(conf))
	if err != nil || in.PrevResult == nil || len(in.PrevResult.IPs) != 1 || in.PrevResult.IPs[0].Address.String() != "10.1.2.3/24" {
		t.Fatalf("PrevResult = %+v, %v", in.PrevResult, err)
	}
}

// Main gives every verb the node's run directory and this binary's build stamp as
// values, never through package variables a test would have to set.
func TestInputCarriesRunDirAndBuildStamp(t *testing.T) {
	in, err := parseInput("ADD", func(string) string { return "" }, []byte(`{"cniVersion":"1.0.0","name":"n","type":"plumbtest"}`))
	if err != nil {
		t.Fatal(err)
	}
	if in.RunDir != DefaultRunDir || in.BuildStamp != BuildStamp || in.Verdicts().dir() != DefaultRunDir {
		t.Errorf("RunDir %q, BuildStamp %q, verdicts in %q; want %q, the linker's %q, %q", in.RunDir, in.BuildStamp, in.Verdicts().dir(), DefaultRunDir, BuildStamp, DefaultRunDir)
	}
}

func TestPrevResultPassedThrough(t *testing.T) {
	conf := `{"cniVersion":"0.4.0","name":"n","type":"plumbtest","prevResult":{"cniVersion":"0.4.0",
		"interfaces":[{"name":"eth0","sandbox":"/x"}],"ips":[{"version":"4","address":"10.1.2.3/24","interface":0}]}}`
	r := runPlugin(t, baseEnv("ADD"), conf)
	if r.exitCode != 0 {
		t.Fatalf("exit %d: %s %s", r.exitCode, r.stdout, r.stderr)
	}
	if !strings.Contains(r.stdout, `"10.1.2.3/24"`) || !strings.Contains(r.stdout, `"cniVersion": "0.4.0"`) {
		t.Fatalf("prevResult not passed through in 0.4.0 form: %s", r.stdout)
	}
}

func TestVersion(t *testing.T) {
	r := runPlugin(t, map[string]string{"CNI_COMMAND": "VERSION"}, "")
	if r.exitCode != 0 || !strings.Contains(r.stdout, `"1.1.0"`) || !strings.Contains(r.stdout, `"0.3.0"`) {
		t.Fatalf("VERSION: exit %d stdout %s", r.exitCode, r.stdout)
	}
}

func TestWrappedErrorKeepsCode(t *testing.T) {
	inner := ConfigError("mtu", "mtu %d is below 68", 10)
	err := toCNIError(errorsJoin("loading bridge config", inner))
	if err.Code != 7 || err.Msg != "loading bridge config: invalid mtu" || err.Details != "mtu 10 is below 68" {
		t.Fatalf("got %+v", err)
	}
}

func errorsJoin(ctx string, err error) error { return &wrapped{ctx, err} }

type wrapped struct {
	ctx string
	err error
}

func (w *wrapped) Error() string { return w.ctx + ": " + w.err.Error() }
func (w *wrapped) Unwrap() error { return w.err }

func TestKernelName(t *testing.T) {
	o := Owner{Network: "n", ContainerID: "c", IfName: "eth0"}
	name, err := o.KernelName("pw", 15)
	if err != nil || len(name) != 15 || name[:2] != "pw" {
		t.Fatalf("KernelName = %q, %v", name, err)
	}
	o2 := Owner{Network: "n", ContainerID: "c", IfName: "eth1"}
	if n2, _ := o2.KernelName("pw", 15); n2 == name {
		t.Fatalf("two owners share kernel name %q", name)
	}
	if _, err := o.KernelName("toolongprefix", 15); err == nil {
		t.Fatal("want error for a prefix leaving no room for the hash")
	}
}

func TestLoadArgs(t *testing.T) {
	type macArgs struct {
		types.CommonArgs
		MAC types.UnmarshallableString
	}
	for _, tc := range []struct {
		args, wantMAC string
		ok            bool
	}{
		{"", "", true},
		{"MAC=02:00:00:00:00:01", "02:00:00:00:00:01", true},
		{"IgnoreUnknown=1;K8S_POD_NAME=p;MAC=02:00:00:00:00:01", "02:00:00:00:00:01", true},
		{"K8S_POD_NAME=p;IgnoreUnknown=true", "", true},     // order does not matter
		{"mac=02:00:00:00:00:01;IgnoreUnknown=1", "", true}, // keys are case-sensitive: mac is not MAC
		{"mac=02:00:00:00:00:01", "", false},
		{"K8S_POD_NAME=p", "", false},
		{"ignoreunknown=1;K8S_POD_NAME=p", "", false},
		{"IgnoreUnknown=yes", "", false},
		{"garbage", "", false},
		{"MAC=a=b", "", false},
		{"MAC=02:00:00:00:00:01;", "", false}, // an empty entry
		{"CommonArgs=x", "", false},           // a field, but not a value
	} {
		var a macArgs
		err := LoadArgs("bridge", tc.args, &a)
		if (err == nil) != tc.ok || (tc.ok && string(a.MAC) != tc.wantMAC) {
			t.Errorf("LoadArgs(%q) = MAC %q, %v; want MAC %q, ok=%v", tc.args, a.MAC, err, tc.wantMAC, tc.ok)
		}
		if err != nil && (Code(err) != 4 || !strings.Contains(err.Error(), "bridge reads IgnoreUnknown, MAC")) {
			t.Errorf("LoadArgs(%q): %v; want code 4 naming the keys bridge reads", tc.args, err)
		}
	}
}
