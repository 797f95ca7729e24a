// SPDX-License-Identifier: Apache-2.0

package cniplumb

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
)

func TestParseLogConf(t *testing.T) {
	for _, tc := range []struct {
		name, conf  string
		file        string
		level       slog.Level
		max         int64
		wantProblem string
	}{
		{name: "no keys", conf: `{}`},
		{name: "file only", conf: `{"logFile":"/var/log/podwire/cni.log"}`, file: "/var/log/podwire/cni.log", level: slog.LevelInfo, max: DefaultLogMaxBytes},
		{name: "debug", conf: `{"logFile":"/l","logLevel":"debug"}`, file: "/l", level: slog.LevelDebug, max: DefaultLogMaxBytes},
		{name: "level case", conf: `{"logFile":"/l","logLevel":"WARN"}`, file: "/l", level: slog.LevelWarn, max: DefaultLogMaxBytes},
		{name: "error and size", conf: `{"logFile":"/l","logLevel":"error","logMaxBytes":65536}`, file: "/l", level: slog.LevelError, max: 65536},
		{name: "level without file", conf: `{"logLevel":"debug"}`},
		{name: "empty file", conf: `{"logFile":""}`},
		{name: "relative", conf: `{"logFile":"cni.log"}`, wantProblem: "not a clean absolute path"},
		{name: "unclean", conf: `{"logFile":"/var/log/../tmp/x"}`, wantProblem: "not a clean absolute path"},
		{name: "not a string", conf: `{"logFile":3}`, wantProblem: "not a string"},
		{name: "bad level", conf: `{"logFile":"/l","logLevel":"verbose"}`, wantProblem: `"verbose" is not one of`},
		{name: "tiny max", conf: `{"logFile":"/l","logMaxBytes":10}`, wantProblem: "at least 4096"},
		{name: "negative max", conf: `{"logFile":"/l","logMaxBytes":-1}`, wantProblem: "at least"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r rawLogConf
			if err := json.Unmarshal([]byte(tc.conf), &r); err != nil {
				t.Fatal(err)
			}
			c := parseLogConf(r)
			if tc.wantProblem != "" {
				if c.File != "" || !strings.Contains(c.Problem, tc.wantProblem) {
					t.Fatalf("got %+v, want the log off with a problem mentioning %q", c, tc.wantProblem)
				}
				return
			}
			if c.Problem != "" || c.File != tc.file || (c.File != "" && (c.Level != tc.level || c.MaxBytes != tc.max)) {
				t.Fatalf("got %+v, want file %q level %v max %d", c, tc.file, tc.level, tc.max)
			}
		})
	}
}

// TestLogRotationConcurrent: writers standing in for concurrent plugin processes (each
// its own logWriter, its own open file) never lose or split a line, and the log and
// its one rotated file stay within bounds.
func TestLogRotationConcurrent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "cni.log")
	const max, writers, lines = 8 << 10, 8, 400
	var wg sync.WaitGroup
	for i := 0; i < writers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < lines; j++ {
				// A writer per "call", as each plugin process opens the file anew.
				w := &logWriter{path: path, maxBytes: max, plugin: "t"}
				line := fmt.Sprintf("{\"w\":%d,\"j\":%d,\"pad\":%q}\n", i, j, strings.Repeat("x", 40))
				if n, err := w.Write([]byte(line)); err != nil || n != len(line) || w.failed {
					t.Errorf("write: n=%d err=%v failed=%v", n, err, w.failed)
				}
				w.close()
			}
		}()
	}
	wg.Wait()
	total := 0
	for _, p := range []string{path, path + ".1"} {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		// Each of the writers may append one line past the check.
		if st.Size() > max+writers*100 {
			t.Errorf("%s is %d bytes, want at most about %d", p, st.Size(), max)
		}
		f, _ := os.Open(p)
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var v map[string]any
			if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
				t.Fatalf("%s has a broken line %q: %v", p, sc.Text(), err)
			}
			total++
		}
		f.Close()
	}
	if total == 0 || total >= writers*lines {
		t.Errorf("%d lines in the log and its rotation; want some, and fewer than the %d written (older rotations are dropped)", total, writers*lines)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Errorf("log mode %v, want 0600", st.Mode().Perm())
	}
}

func TestLogWriteFailureNeverFails(t *testing.T) {
	dir := t.TempDir()
	// The log's directory is a file: open fails.
	blocker := filepath.Join(dir, "notadir")
	if err := os.WriteFile(blocker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	w := &logWriter{path: filepath.Join(blocker, "cni.log"), maxBytes: DefaultLogMaxBytes, plugin: "t"}
	if n, err := w.Write([]byte("x\n")); err != nil || n != 2 || !w.failed {
		t.Fatalf("Write = %d, %v, failed=%v; want success reported and the log off", n, err, w.failed)
	}
}

func readLogLines(t *testing.T, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading log: %v", err)
	}
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if l == "" {
			continue
		}
		var v map[string]any
		if err := json.Unmarshal([]byte(l), &v); err != nil {
			t.Fatalf("log line %q is not JSON: %v", l, err)
		}
		out = append(out, v)
	}
	return out
}

// TestLogThroughMain runs the test plugin as a process: a line per verb with the call's
// identity and outcome, stdout exactly what it is without a log.
func TestLogThroughMain(t *testing.T) {
	logFile := filepath.Join(t.TempDir(), "cni.log")
	withLog := `{"cniVersion":"1.0.0","name":"net1","type":"plumbtest","logFile":"` + logFile + `"}`

	plain := runPlugin(t, baseEnv("ADD"), goodConf)
	logged := runPlugin(t, baseEnv("ADD"), withLog)
	if plain.exitCode != 0 || logged.exitCode != 0 {
		t.Fatalf("ADD failed: %+v %+v", plain, logged)
	}
	if plain.stdout != logged.stdout {
		t.Fatalf("stdout differs with a log:\n%s\nwithout:\n%s", logged.stdout, plain.stdout)
	}
	if r := runPlugin(t, baseEnv("DEL"), withLog); r.exitCode != 0 {
		t.Fatalf("DEL failed: %+v", r)
	}
	fail := strings.Replace(withLog, `"type"`, `"fail":true,"type"`, 1)
	if r := runPlugin(t, baseEnv("ADD"), fail); r.exitCode == 0 {
		t.Fatal("failing ADD exited 0")
	}
	badVersion := strings.Replace(withLog, `"1.0.0"`, `"9.9.9"`, 1)
	runPlugin(t, baseEnv("ADD"), badVersion)
	badEnv := baseEnv("ADD")
	badEnv["CNI_IFNAME"] = "a/b"
	runPlugin(t, badEnv, withLog)

	lines := readLogLines(t, logFile)
	if len(lines) != 5 {
		t.Fatalf("got %d log lines, want 5 (ADD, DEL, failed ADD, refused version, refused env): %v", len(lines), lines)
	}
	want := []struct {
		verb, level, msg string
		code             float64
	}{
		{"ADD", "INFO", "done", 0}, {"DEL", "INFO", "done", 0}, {"ADD", "ERROR", "failed", 999},
		{"ADD", "ERROR", "failed", 1}, {"ADD", "ERROR", "failed", 4},
	}
	for i, w := range want {
		l := lines[i]
		if l["verb"] != w.verb || l["level"] != w.level || l["msg"] != w.msg || l["plugin"] != "plumbtest" {
			t.Errorf("line %d = %v, want verb %s level %s msg %s plugin plumbtest", i, l, w.verb, w.level, w.msg)
		}
		if w.code != 0 && l["code"] != w.code {
			t.Errorf("line %d code = %v, want %v", i, l["code"], w.code)
		}
		if _, ok := l["ms"].(float64); !ok {
			t.Errorf("line %d has no duration: %v", i, l)
		}
	}
	if lines[0]["network"] != "net1" || lines[0]["containerID"] != "c1" || lines[0]["ifname"] != "eth0" {
		t.Errorf("ADD line lacks the attachment: %v", lines[0])
	}
	if res, _ := lines[0]["result"].(map[string]any); res == nil || fmt.Sprint(res["ips"]) != "[10.9.8.7/24]" {
		t.Errorf("ADD line result = %v, want ips [10.9.8.7/24]", lines[0]["result"])
	}
}

func TestLogProblemWarnsOnStderr(t *testing.T) {
	conf := `{"cniVersion":"1.0.0","name":"net1","type":"plumbtest","logFile":"relative.log"}`
	r := runPlugin(t, baseEnv("ADD"), conf)
	if r.exitCode != 0 {
		t.Fatalf("a bad logFile failed the verb: %+v", r)
	}
	if !strings.Contains(r.stderr, "not a clean absolute path") || strings.Count(r.stderr, "log:") != 1 {
		t.Errorf("stderr = %q, want one warning about the path", r.stderr)
	}
	if strings.Contains(r.stdout, "relative") {
		t.Errorf("the warning reached stdout: %s", r.stdout)
	}
}

// TestCallLogStepsAndLevels: steps end up in the final line in the order they ended,
// decisions are lines of their own at info, steps have their own lines only at debug,
// and at "error" only a failure is written.
func TestCallLogStepsAndLevels(t *testing.T) {
	env := func(k string) string { return map[string]string{"CNI_CONTAINERID": "c9", "CNI_IFNAME": "eth1"}[k] }
	conf := types.PluginConf{CNIVersion: "1.1.0", Name: "n9"}
	for _, tc := range []struct {
		level slog.Level
		fail  bool
		want  []string // msg of each line
	}{
		{slog.LevelDebug, false, []string{"chose", "step", "step", "done"}},
		{slog.LevelInfo, false, []string{"chose", "done"}},
		{slog.LevelWarn, false, nil},
		{slog.LevelError, true, []string{"failed"}},
	} {
		t.Run(tc.level.String(), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "cni.log")
			cl := newCallLog("p", LogConf{File: path, Level: tc.level, MaxBytes: DefaultLogMaxBytes}, "ADD", env, conf)
			ctx := WithLog(context.Background(), cl)
			Log(ctx).Decision("chose", "backend", "nftables")
			end := Log(ctx).Step("first")
			Log(ctx).Step("second")()
			end()
			var err error
			if tc.fail {
				err = ConfigError("x", "bad x")
			}
			cl.finish(nil, err)
			var lines []map[string]any
			if _, serr := os.Stat(path); serr == nil {
				lines = readLogLines(t, path)
			}
			var got []string
			for _, l := range lines {
				got = append(got, l["msg"].(string))
				if l["containerID"] != "c9" || l["ifname"] != "eth1" || l["network"] != "n9" || l["verb"] != "ADD" {
					t.Errorf("line lacks the call's identity: %v", l)
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("lines %v, want %v", got, tc.want)
			}
			if len(lines) == 0 {
				return
			}
			last := lines[len(lines)-1]
			if tc.fail {
				if last["code"] != float64(7) || last["error"] != "invalid x" {
					t.Errorf("failure line %v, want code 7 and the message", last)
				}
				return
			}
			steps, _ := last["steps"].([]any)
			if len(steps) != 2 || steps[0].(map[string]any)["name"] != "second" || steps[1].(map[string]any)["name"] != "first" {
				t.Errorf("steps %v, want second then first", last["steps"])
			}
		})
	}
	// No log: every method is a no-op on nil.
	var none *CallLog
	none.Step("x")()
	none.Decision("x")
	none.finish(nil, nil)
	if Log(context.Background()) != nil {
		t.Error("Log of a plain context is not nil")
	}
}
