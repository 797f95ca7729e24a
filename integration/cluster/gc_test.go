// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// TestGCReclaimsKilledSandbox kills a pod's sandbox under containerd behind the
// kubelet's back, as a crashed runtime loses it: the kubelet is stopped, the sandbox's
// processes are SIGKILLed, its containers and sandbox record are removed with ctr (no CRI
// StopPodSandbox, so no CNI DEL) and containerd is restarted, so its CRI store forgets the
// sandbox; then the kubelet starts again and gives the pod a new sandbox. The old
// attachment's lease, libcni cache entries, host veth and rules are then on the node
// with no sandbox behind them: the test asserts that first, then that podwire-agent's
// periodic GC (deploy/'s --gc-period and --gc-grace) removes them, while the live pod
// and the victim's new sandbox keep theirs.
func TestGCReclaimsKilledSandbox(t *testing.T) {
	p := needLab(t)
	n := p.Nodes[0]
	c, err := p.Client()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	period, grace, err := agentGCTimes(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if period == 0 {
		t.Fatal("deploy/'s DaemonSet disables the agent's GC (--gc-period=0)")
	}
	// kube-proxy in iptables mode, as on an iptables-only node; portmap's Auto backend
	// is then iptables (the node has the tools), so the victim's hostPort rules are in
	// iptables, where only an agent image with iptables tools can find and remove them.
	if p, err = SetProxyMode(p.Dir, "iptables"); err != nil {
		t.Fatal(err)
	}
	n = p.Nodes[0]
	checkAgentIPTables(t, p, n)
	f := newFixture(t, p)
	v := agnhost("victim", n.Name, nil)
	v.Spec.Containers[0].Ports[0].HostPort = 31580
	f.run(v, agnhost("live", n.Name, nil))
	// The GC keeps attachments younger than the grace; the victim's ADD is done now.
	added := time.Now()
	victim := attachmentOf(t, p, n, f.pods["victim"])
	live := attachmentOf(t, p, n, f.pods["live"])
	for _, a := range []attachment{victim, live} {
		if gone := a.missing(t, n); len(gone) > 0 {
			t.Fatalf("pod %s's attachment %s lacks %v before the test did anything", a.pod, a.id, gone)
		}
	}

	if r := victim.rules(t, n); len(r) == 0 || !strings.HasPrefix(r[0], "iptables-save: ") {
		t.Fatalf("the victim's hostPort made no iptables rules naming its sandbox %s (portmap picks iptables where it is installed): %q", victim.id, r)
	}
	rulesBefore := reclaimed(t, n, "rule")
	// The runtime's pin of the lost sandbox's netns is containerd's, not the CNI's: the
	// agent leaves it, the test removes it.
	t.Cleanup(func() { removeNetNSPin(t, n, victim.netns) })
	killSandbox(t, p, n, victim.id)

	// The leak is real: the runtime no longer has the sandbox, every object is still there.
	if out := ctr(t, p, n, "sandboxes", "ls"); strings.Contains(out, victim.id) {
		t.Fatalf("containerd still lists sandbox %s after its removal", victim.id)
	}
	if gone := victim.missing(t, n); len(gone) > 0 {
		t.Fatalf("the killed sandbox %s lost %v without GC: the kill ran a CNI DEL, so it leaks nothing", victim.id, gone)
	}
	// The kubelet gives the pod a new sandbox: one more live attachment.
	var reborn attachment
	eventually(t, 2*time.Minute, func() error {
		pod, err := c.CoreV1().Pods(f.ns).Get(ctx, "victim", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !podReady(pod) || pod.Status.PodIP == "" || pod.Status.PodIP == victim.ip {
			return fmt.Errorf("pod victim not Ready on a new sandbox yet (IP %q, was %s)", pod.Status.PodIP, victim.ip)
		}
		reborn = attachmentOf(t, p, n, pod)
		return nil
	})
	t.Logf("sandbox %s (%s, veth %s) leaked; pod victim runs again in %s (%s)", victim.id, victim.ip, victim.veth, reborn.id, reborn.ip)

	// GC runs every period and passes over attachments younger than the grace: the
	// first run after added+grace is at most one period later.
	deadline := added.Add(grace + period + time.Minute)
	t.Logf("waiting until %s at most (deploy/'s --gc-period %s, --gc-grace %s)", deadline.Format(time.TimeOnly), period, grace)
	var left []string
	for {
		if left = victim.present(t, n); len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Second)
	}
	if len(left) > 0 {
		t.Errorf("the agent's GC left the killed sandbox %s's %v on node %s after %s", victim.id, left, n.Name, time.Since(added).Round(time.Second))
	} else {
		t.Logf("the agent's GC reclaimed sandbox %s %s after its ADD", victim.id, time.Since(added).Round(time.Second))
	}
	// The agent counts what it reclaimed by listing the rules itself, in iptables too.
	if got := reclaimed(t, n, "rule"); got <= rulesBefore {
		t.Errorf("podwire_agent_gc_reclaimed_total{kind=\"rule\"} is %v, %v before the leak: the agent did not see the iptables rules it reclaimed", got, rulesBefore)
	}
	for _, a := range []attachment{live, reborn} {
		if gone := a.missing(t, n); len(gone) > 0 {
			t.Errorf("live pod %s's attachment %s lost %v", a.pod, a.id, gone)
		}
	}
}

// checkAgentIPTables requires the agent's image to have iptables tools in the node's
// mode: `iptables --version` in the agent's container names the same flavour (nf_tables
// or legacy) as the node's own iptables; its wrapper chose it from the node's rules.
func checkAgentIPTables(t *testing.T, p Plan, n Node) {
	t.Helper()
	host, err := run(inNode(n, "iptables", "--version")...)
	if err != nil {
		t.Fatal(err)
	}
	pod, err := p.Kubectl(nil, "-n", "podwire-system", "get", "pods", "-l", "app.kubernetes.io/name=podwire-agent",
		"--field-selector", "spec.nodeName="+n.Name, "-o", "jsonpath={.items[0].metadata.name}")
	if err != nil {
		t.Fatal(err)
	}
	got, err := p.Kubectl(nil, "-n", "podwire-system", "exec", strings.TrimSpace(pod), "--", "iptables", "--version")
	if err != nil {
		t.Fatalf("the agent's image has no working iptables (make image ships Debian's behind tools/iptables-wrapper): %v", err)
	}
	// "iptables v1.8.9 (nf_tables)": the versions may differ, the mode may not.
	flavour := func(v string) string { return v[strings.LastIndexByte(v, '(')+1:] }
	if got, host = strings.TrimSpace(got), strings.TrimSpace(host); !strings.Contains(host, "(") || flavour(got) != flavour(host) {
		t.Fatalf("the agent's iptables is %q, the node's %q: the wrapper chose the other mode", got, host)
	}
}

// reclaimed is the agent's podwire_agent_gc_reclaimed_total{kind} on n (hostNetwork,
// metrics on :9310).
func reclaimed(t *testing.T, n Node, kind string) float64 {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://%s:9310/metrics", n.IP))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	prefix := `podwire_agent_gc_reclaimed_total{kind="` + kind + `"} `
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, prefix); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	t.Fatalf("the agent on %s reports no %s", n.Name, prefix)
	return 0
}

// agentGCTimes are the DaemonSet's --gc-period and --gc-grace (flag or PODWIRE_ env),
// else the agent's defaults.
func agentGCTimes(ctx context.Context, c *kubernetes.Clientset) (period, grace time.Duration, err error) {
	ds, err := c.AppsV1().DaemonSets("podwire-system").Get(ctx, "podwire-agent", metav1.GetOptions{})
	if err != nil {
		return 0, 0, err
	}
	vals := map[string]string{"gc-period": "5m", "gc-grace": "3m"}
	for _, ctn := range ds.Spec.Template.Spec.Containers {
		for _, e := range ctn.Env {
			for k := range vals {
				if e.Name == "PODWIRE_"+strings.ToUpper(strings.ReplaceAll(k, "-", "_")) {
					vals[k] = e.Value
				}
			}
		}
		for _, a := range ctn.Args {
			for k := range vals {
				if v, ok := strings.CutPrefix(a, "--"+k+"="); ok {
					vals[k] = v
				}
			}
		}
	}
	if period, err = time.ParseDuration(vals["gc-period"]); err != nil {
		return 0, 0, err
	}
	grace, err = time.ParseDuration(vals["gc-grace"])
	return period, grace, err
}

// attachment is what one sandbox's CNI ADD left on its node.
type attachment struct {
	pod, id string
	ip      string // host-local's lease file name
	veth    string // the host end
	netns   string // the runtime's pin of the sandbox's netns
}

// attachmentOf reads pod's current sandbox's attachment from libcni's cache on n.
func attachmentOf(t *testing.T, p Plan, n Node, pod *corev1.Pod) attachment {
	t.Helper()
	ids := strings.Fields(ctr(t, p, n, "containers", "ls", "-q",
		fmt.Sprintf(`labels."io.kubernetes.pod.uid"==%s,labels."io.cri-containerd.kind"==sandbox`, pod.UID)))
	if len(ids) != 1 {
		t.Fatalf("pod %s has sandboxes %v on node %s, want one", pod.Name, ids, n.Name)
	}
	a := attachment{pod: pod.Name, id: ids[0], ip: pod.Status.PodIP}
	b, err := os.ReadFile(a.cacheFile(n))
	if err != nil {
		t.Fatal(err)
	}
	var e struct {
		NetNS  string `json:"netns"`
		Result struct {
			Interfaces []struct{ Name, Sandbox string } `json:"interfaces"`
		} `json:"result"`
	}
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("%s: %v", a.cacheFile(n), err)
	}
	a.netns = e.NetNS
	for _, i := range e.Result.Interfaces {
		if i.Sandbox == "" && strings.HasPrefix(i.Name, "veth") {
			a.veth = i.Name
		}
	}
	if a.veth == "" || a.netns == "" {
		t.Fatalf("%s names no host veth or netns: %s", a.cacheFile(n), b)
	}
	return a
}

func (a attachment) cacheFile(n Node) string {
	return n.Path("fs", "/var/lib/cni", "results", "podwire-"+a.id+"-eth0")
}

// objects reports which of the attachment's objects are on n.
func (a attachment) objects(t *testing.T, n Node) map[string]bool {
	t.Helper()
	has := map[string]bool{}
	lease, err := os.ReadFile(n.Path("fs", "/var/lib/cni", "networks", "podwire", a.ip))
	has["lease "+a.ip] = err == nil && strings.HasPrefix(string(lease), a.id)
	for _, f := range []string{a.cacheFile(n), n.Path("fs", "/var/lib/cni", "results", "cni-loopback-"+a.id+"-lo")} {
		_, err := os.Stat(f)
		has["cache entry "+filepath.Base(f)] = err == nil
	}
	_, err = run("nsenter", "--net="+n.NetNS, "--", "ip", "link", "show", "dev", a.veth)
	has["veth "+a.veth] = err == nil
	for _, r := range a.rules(t, n) {
		has["rule "+r] = true
	}
	return has
}

// rules are the node's netfilter lines naming the sandbox (podwire's rules carry the
// owner's container ID in their comments, in every layout).
func (a attachment) rules(t *testing.T, n Node) []string {
	t.Helper()
	var out []string
	for _, argv := range [][]string{{"iptables-save"}, {"ip6tables-save"}, {"nft", "list", "ruleset"}} {
		s, err := run(append([]string{"nsenter", "--net=" + n.NetNS, "--"}, argv...)...)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(s, "\n") {
			if strings.Contains(l, a.id) {
				out = append(out, argv[0]+": "+strings.TrimSpace(l))
			}
		}
	}
	return out
}

func (a attachment) present(t *testing.T, n Node) []string {
	var out []string
	for k, ok := range a.objects(t, n) {
		if ok {
			out = append(out, k)
		}
	}
	return out
}

// missing lists the lease, cache entries and veth the attachment lacks (rules are
// only what the pod asked for).
func (a attachment) missing(t *testing.T, n Node) []string {
	var out []string
	for k, ok := range a.objects(t, n) {
		if !ok && !strings.HasPrefix(k, "rule ") {
			out = append(out, k)
		}
	}
	return out
}

// killSandbox loses sandbox id under containerd as a crash does: no CRI call, so no
// CNI DEL. The kubelet is started again even when a step fails.
func killSandbox(t *testing.T, p Plan, n Node, id string) {
	t.Helper()
	kubelet := n.Name + "-kubelet"
	if err := Stop(p.Dir, kubelet); err != nil {
		t.Fatal(err)
	}
	started := false
	start := func() {
		if !started {
			started = true
			if err := Start(p.Dir, kubelet); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(start)
	// The sandbox's containers (its pause, the pod's app) by their sandbox label.
	members := strings.Fields(ctr(t, p, n, "containers", "ls", "-q", `labels."io.kubernetes.sandbox.id"==`+id))
	members = append(members, id)
	seen := map[string]bool{}
	for _, c := range members {
		if seen[c] {
			continue
		}
		seen[c] = true
		// A sandbox whose pause already exited has no task left to signal.
		if out, err := ctrErr(p, n, "tasks", "kill", "--signal", "SIGKILL", c); err != nil && !strings.Contains(out, "not found") {
			t.Fatal(err)
		}
	}
	for c := range seen {
		eventually(t, 30*time.Second, func() error {
			_, err := ctrErr(p, n, "tasks", "delete", c)
			if err != nil && !strings.Contains(err.Error(), "not found") {
				return err
			}
			return nil
		})
		if out, err := ctrErr(p, n, "containers", "delete", c); err != nil && !strings.Contains(out, "not found") {
			t.Fatal(err)
		}
	}
	// The sandbox controller's Shutdown finds its container gone; --force drops the record.
	if out, err := ctrErr(p, n, "sandboxes", "rm", "--force", id); err != nil && !strings.Contains(out, "not found") {
		t.Fatal(err)
	}
	// containerd's CRI keeps sandboxes in memory; a restart reloads them from the
	// records, which no longer hold this one.
	if err := Restart(p.Dir, n.Name+"-containerd"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error { _, err := ctrErr(p, n, "version"); return err })
	start()
}

// removeNetNSPin unmounts and removes the runtime's pin of a lost sandbox's netns.
func removeNetNSPin(t *testing.T, n Node, pin string) {
	t.Helper()
	pin = strings.Replace(pin, "/var/run/", "/run/", 1)
	if _, err := run(inNode(n, "sh", "-c", `umount "$1" && rm -f "$1"`, "sh", pin)...); err != nil {
		t.Log(err)
	}
}

func ctr(t *testing.T, p Plan, n Node, args ...string) string {
	t.Helper()
	out, err := ctrErr(p, n, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// ctrErr runs ctr in n; it returns stdout only (containerd 2.x warns on stderr about
// cgroup v1 at every call), stderr goes into the error.
func ctrErr(p Plan, n Node, args ...string) (string, error) {
	argv := inNode(n, append([]string{filepath.Join(p.ContainerdDir, "ctr"), "--address", criSocket, "--namespace", "k8s.io"}, args...)...)
	var stderr strings.Builder
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out) + stderr.String(), fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}
