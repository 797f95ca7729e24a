// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/podwire/podwire/integration/nstest"
)

// logChain is the full chain with the opt-in log on every plugin entry (LOG is
// replaced by the log keys, or by nothing for the same chain without a log).
const logChain = `{"cniVersion":"1.1.0","name":"@PREFIX@net","plugins":[
 {"type":"bridge","bridge":"@PREFIX@br","isGateway":true,"ipMasq":true LOG,
  "ipam":{"type":"host-local","ranges":[[{"subnet":"10.27.0.0/24"}]],"dataDir":"@DATADIR@"}},
 {"type":"portmap","capabilities":{"portMappings":true} LOG},
 {"type":"bandwidth","capabilities":{"bandwidth":true} LOG}]}`

type logLine map[string]any

func readLog(t *testing.T, path string) []logLine {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("opening the log: %v", err)
	}
	defer f.Close()
	var out []logLine
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l logLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("log line %q is not JSON: %v", sc.Text(), err)
		}
		out = append(out, l)
	}
	return out
}

func (l logLine) steps() []string {
	var names []string
	s, _ := l["steps"].([]any)
	for _, e := range s {
		m := e.(map[string]any)
		if _, ok := m["ms"].(float64); ok {
			names = append(names, m["name"].(string))
		}
	}
	return names
}

// finals are the verbs' final lines (msg done or failed) of plugin for verb.
func finals(lines []logLine, plugin, verb string) []logLine {
	var out []logLine
	for _, l := range lines {
		if l["plugin"] == plugin && l["verb"] == verb && (l["msg"] == "done" || l["msg"] == "failed") {
			out = append(out, l)
		}
	}
	return out
}

// TestLogFileThroughLibcni runs the full chain through libcni with logFile on every
// plugin: each verb of each plugin leaves its line, with the attachment and the timed
// steps; the ADD result is the one the same chain without a log gives; and the node
// ends as it started.
func TestLogFileThroughLibcni(t *testing.T) {
	h := nstest.New(t)
	logFile := filepath.Join(t.TempDir(), "log", "cni.log")
	logged := h.Conflist(strings.ReplaceAll(logChain, " LOG", `,"logFile":"`+logFile+`","logLevel":"debug"`))
	plain := h.Conflist(strings.ReplaceAll(logChain, " LOG", ""))
	caps := nstest.WithCaps(map[string]any{
		"portMappings": []map[string]any{{"hostPort": 18181, "containerPort": 80, "protocol": "tcp"}},
		"bandwidth":    map[string]any{"ingressRate": 10_000_000, "ingressBurst": containerdBurst, "egressRate": 10_000_000, "egressBurst": containerdBurst},
	})

	// A first ADD/DEL makes the bridge, which stays by design.
	warm := h.NewPod()
	h.MustAdd(plain, h.RT(warm, "eth0", caps))
	h.MustDel(plain, h.RT(warm, "eth0", caps))
	settleBridge(t, h, h.Name("br"))
	before := h.Snapshot()

	pod := h.NewPod()
	rt := h.RT(pod, "eth0", caps)
	resPlain := h.MustAdd(plain, rt)
	h.MustDel(plain, rt)
	if _, err := os.Stat(logFile); err == nil {
		t.Fatal("the chain without logFile wrote the log")
	}
	resLogged := h.MustAdd(logged, rt)
	if a, b := resultShape(resPlain), resultShape(resLogged); a != b {
		t.Errorf("ADD result with the log differs from the one without:\n%s\nwithout:\n%s", b, a)
	}
	if err := h.Check(logged, rt); err != nil {
		t.Fatalf("CHECK: %v", err)
	}
	if err := h.Status(logged); err != nil {
		t.Fatalf("STATUS: %v", err)
	}
	h.MustDel(logged, rt)
	if err := h.GC(logged, nil); err != nil {
		t.Fatalf("GC: %v", err)
	}
	settleBridge(t, h, h.Name("br"))
	h.RequireUnchanged(before)

	lines := readLog(t, logFile)
	wantSteps := map[string][]string{
		"bridge/ADD":    {"ensure bridge", "create veth", "ipam host-local", "configure pod interface", "configure host", "ipMasq rules"},
		"portmap/ADD":   {"apply rules", "conntrack flush"},
		"bandwidth/ADD": {"plan", "apply tc"},
		"bridge/DEL":    {"delete links", "remove ipMasq rules", "ipam host-local"},
		"portmap/DEL":   {"remove rules"},
		"bandwidth/DEL": {"remove tc"},
	}
	for _, plugin := range []string{"bridge", "portmap", "bandwidth"} {
		for _, verb := range []string{"ADD", "CHECK", "DEL", "GC", "STATUS"} {
			f := finals(lines, plugin, verb)
			if len(f) != 1 {
				t.Errorf("%s %s: %d final lines, want 1", plugin, verb, len(f))
				continue
			}
			l := f[0]
			t.Logf("%s %s: %v ms, steps %v", plugin, verb, l["ms"], l.steps())
			if l["msg"] != "done" || l["level"] != "INFO" || l["network"] != h.Prefix+"net" || l["cniVersion"] != "1.1.0" {
				t.Errorf("%s %s: line %v, want a successful line for network %snet at 1.1.0", plugin, verb, l, h.Prefix)
			}
			if verb == "ADD" || verb == "CHECK" || verb == "DEL" {
				if l["containerID"] != rt.ContainerID || l["ifname"] != "eth0" {
					t.Errorf("%s %s: line %v lacks the attachment %s/eth0", plugin, verb, l, rt.ContainerID)
				}
			}
			for _, s := range wantSteps[plugin+"/"+verb] {
				if !slices.ContainsFunc(l.steps(), func(got string) bool { return strings.HasPrefix(got, s) }) {
					t.Errorf("%s %s: steps %v lack %q", plugin, verb, l.steps(), s)
				}
			}
		}
	}
	if res, _ := finals(lines, "bridge", "ADD")[0]["result"].(map[string]any); res == nil || !strings.Contains(fmt.Sprint(res["ips"]), "10.27.0.") {
		t.Errorf("bridge ADD line has no result with the pod's address: %v", res)
	}
	var decisions int
	for _, l := range lines {
		if l["msg"] == "shaping" && l["plugin"] == "bandwidth" {
			decisions++
		}
	}
	if decisions != 1 {
		t.Errorf("%d bandwidth shaping decisions logged, want 1", decisions)
	}
	// A failing verb: its CNI error and code are in the log, stdout is still the error.
	bad := h.Conflist(strings.ReplaceAll(strings.ReplaceAll(logChain, " LOG", `,"logFile":"`+logFile+`"`), `"10.27.0.0/24"`, `"10.27.0.0/33"`))
	if _, err := h.Add(bad, h.RT(h.NewPod(), "eth0")); err == nil {
		t.Fatal("ADD with a /33 subnet succeeded")
	}
	lines = readLog(t, logFile)
	last := lines[len(lines)-1]
	if last["msg"] != "failed" || last["level"] != "ERROR" || last["code"] != float64(7) {
		t.Errorf("last line after a failed ADD = %v, want a failure with code 7", last)
	}
	if st, err := os.Stat(logFile); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("log file mode: %v %v, want 0600", st, err)
	}
}

// resultShape is a result without what differs between two ADDs of one attachment
// (MACs, the netns path, the address host-local picks next in the range).
func resultShape(r *current.Result) string {
	var b strings.Builder
	for _, i := range r.Interfaces {
		fmt.Fprintf(&b, "if %s pod=%v\n", i.Name, i.Sandbox != "")
	}
	for _, ip := range r.IPs {
		subnet := net.IPNet{IP: ip.Address.IP.Mask(ip.Address.Mask), Mask: ip.Address.Mask}
		fmt.Fprintf(&b, "ip in %s gw %s if %v\n", subnet.String(), ip.Gateway, *ip.Interface)
	}
	for _, rt := range r.Routes {
		fmt.Fprintf(&b, "route %s via %s\n", rt.Dst.String(), rt.GW)
	}
	fmt.Fprintf(&b, "dns %v\n", r.DNS)
	return b.String()
}

// TestLogFileRotationBounded: many verbs of concurrent plugin processes against a small
// logMaxBytes leave a log and one rotated file, each within the bound, with whole
// lines only.
func TestLogFileRotationBounded(t *testing.T) {
	h := nstest.New(t)
	const max = 4096
	logFile := filepath.Join(t.TempDir(), "cni.log")
	list := h.Conflist(`{"cniVersion":"1.1.0","name":"@PREFIX@lo","plugins":[{"type":"loopback","logFile":"` + logFile + `","logLevel":"debug","logMaxBytes":4096}]}`)
	const workers, rounds = 4, 15
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		pod := h.NewPod()
		go func() {
			var err error
			for i := 0; i < rounds && err == nil; i++ {
				rt := h.RT(pod, "lo", nstest.WithContainerID(fmt.Sprintf("%s-%d", filepath.Base(pod.Path()), i)))
				if _, err = h.Add(list, rt); err == nil {
					err = h.Del(list, rt)
				}
			}
			errs <- err
		}()
	}
	for w := 0; w < workers; w++ {
		if err := <-errs; err != nil {
			t.Fatalf("loopback ADD/DEL: %v", err)
		}
	}
	total := 0
	for _, p := range []string{logFile, logFile + ".1"} {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatalf("after %d verbs: %v", 2*workers*rounds, err)
		}
		// One line per concurrent process may land past the check.
		if st.Size() > max+workers*1024 {
			t.Errorf("%s is %d bytes; logMaxBytes is %d", p, st.Size(), max)
		}
		total += len(readLog(t, p))
	}
	if total >= 2*workers*rounds*2 {
		t.Errorf("%d lines kept of the %d written: nothing was dropped by rotation", total, 2*workers*rounds*2)
	}
	t.Logf("%d lines in %s and %s.1", total, logFile, logFile)
}
