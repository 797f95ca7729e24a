// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/podwire/podwire/pkg/agent/kube"
)

// agentPod is one node's podwire-agent pod: its name, container ID and restart count.
type agentPod struct {
	name, containerID string
	restarts          int32
}

func agentPods(t *testing.T, f *fixture) map[string]agentPod {
	t.Helper()
	list, err := f.c.CoreV1().Pods("podwire-system").List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=podwire-agent"})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]agentPod{}
	for _, pod := range list.Items {
		a := agentPod{name: pod.Name}
		for _, cs := range pod.Status.ContainerStatuses {
			a.containerID, a.restarts = cs.ContainerID, cs.RestartCount
		}
		out[pod.Spec.NodeName] = a
	}
	return out
}

// networkCondition is node's PodwireNetworkReady condition.
func networkCondition(t *testing.T, f *fixture, node string) corev1.NodeCondition {
	t.Helper()
	n, err := f.c.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range n.Status.Conditions {
		if c.Type == kube.ConditionType {
			return c
		}
	}
	return corev1.NodeCondition{}
}

// apiOutage stops the API server for d: a pod on the first node keeps fetching from a pod
// on the last (its log is the record), every node keeps its routes and its kubelet and
// agent processes; afterwards the agents are the same containers, their condition never
// turned, and a Node made after the API server is back is routed.
func apiOutage(t *testing.T, f *fixture, d time.Duration, rep *upgradeReport) {
	p := f.p
	n1, n2 := p.Nodes[0], p.Nodes[len(p.Nodes)-1]
	f.run(agnhost("target", n2.Name, nil))
	prober := agnhost("prober", n1.Name, nil)
	prober.Spec.Containers[0].Command = []string{"/bin/sh", "-c", fmt.Sprintf(
		`while true; do if curl -sS --max-time 1 -o /dev/null http://%s:8080/hostname; then echo "$(date +%%s) ok"; else echo "$(date +%%s) fail"; fi; sleep 0.5; done`,
		f.pods["target"].Status.PodIP)}
	prober.Spec.Containers[0].Args, prober.Spec.Containers[0].ReadinessProbe = nil, nil
	f.run(prober)
	before := agentPods(t, f)
	conds := map[string]corev1.NodeCondition{}
	routes := map[string][]string{} // node -> "cidr via ip" of every other node
	for _, n := range p.Nodes {
		if c := networkCondition(t, f, n.Name); c.Status != corev1.ConditionTrue {
			t.Fatalf("node %s: %s is %q before the outage", n.Name, kube.ConditionType, c.Status)
		} else {
			conds[n.Name] = c
		}
		node, err := f.c.CoreV1().Nodes().Get(context.Background(), n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range p.Nodes {
			if m.Name != n.Name {
				routes[m.Name] = append(routes[m.Name], node.Spec.PodCIDR+" via "+n.IP.String())
			}
		}
	}
	kubelets := map[string]int{}
	for _, n := range p.Nodes {
		_, pr, err := daemon(p.Dir, n.Name+"-kubelet")
		if err != nil {
			t.Fatal(err)
		}
		kubelets[n.Name] = pr.Pid
	}
	agents := map[string]map[int]bool{}
	for _, n := range p.Nodes {
		agents[n.Name] = agentPids(n.NetNS)
	}
	time.Sleep(3 * time.Second) // a few probes before

	down := time.Now()
	if err := Stop(p.Dir, "kube-apiserver"); err != nil {
		t.Fatal(err)
	}
	restarted := false
	defer func() {
		if !restarted {
			_ = Start(p.Dir, "kube-apiserver")
		}
	}()
	stopped := time.Now()
	checks, broken := 0, 0
	for time.Since(stopped) < d {
		checks++
		for _, n := range p.Nodes {
			var errs []string
			if _, err := f.c.Discovery().ServerVersion(); err == nil {
				errs = append(errs, "the API server still answers")
			}
			for _, r := range routes[n.Name] {
				cidr, via, _ := strings.Cut(r, " ")
				out, err := run(inNode(n, "ip", "-4", "route", "show", cidr)...)
				if err != nil || !strings.Contains(out, via) {
					errs = append(errs, fmt.Sprintf("route %s gone: %q %v", r, out, err))
				}
			}
			_, kl, _ := daemon(p.Dir, n.Name+"-kubelet")
			if !kl.alive() || kl.Pid != kubelets[n.Name] {
				errs = append(errs, "its kubelet exited")
			}
			if got := agentPids(n.NetNS); fmt.Sprint(got) != fmt.Sprint(agents[n.Name]) {
				errs = append(errs, fmt.Sprintf("agent processes %v, before %v", got, agents[n.Name]))
			}
			if len(errs) > 0 {
				broken++
				t.Errorf("node %s %s into the outage: %s", n.Name, time.Since(down).Round(time.Second), strings.Join(errs, "; "))
			}
		}
		time.Sleep(2 * time.Second)
	}
	if err := Start(p.Dir, "kube-apiserver"); err != nil {
		t.Fatal(err)
	}
	restarted = true
	outage, stopTook := time.Since(stopped), stopped.Sub(down)
	up := time.Now()
	eventually(t, 3*time.Minute, func() error {
		_, err := f.c.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
		return err
	})
	back := time.Since(up)
	// The agent reaches the API server through the kubernetes Service, as in-cluster
	// clients do: the API server removed its endpoint when it stopped, and kube-proxy
	// rejects the ClusterIP until it has watched the endpoint come back.
	cipBack := map[string]time.Duration{}
	eventually(t, 3*time.Minute, func() error {
		for _, n := range p.Nodes {
			if _, done := cipBack[n.Name]; done {
				continue
			}
			if _, err := run(inNode(n, "bash", "-c", fmt.Sprintf("exec 3<>/dev/tcp/%s/443", p.ServiceAPI))...); err != nil {
				return fmt.Errorf("node %s: the kubernetes Service %s:443: %w", n.Name, p.ServiceAPI, err)
			}
			cipBack[n.Name] = time.Since(up)
		}
		return nil
	})

	// The prober's log over the outage.
	var ok, fail, during int
	eventually(t, time.Minute, func() error {
		b, err := f.c.CoreV1().Pods(f.ns).GetLogs("prober", &corev1.PodLogOptions{Container: "agnhost"}).DoRaw(context.Background())
		if err != nil {
			return err
		}
		ok, fail, during = 0, 0, 0
		for _, l := range strings.Split(string(b), "\n") {
			var ts int64
			var res string
			if _, err := fmt.Sscanf(l, "%d %s", &ts, &res); err != nil {
				continue
			}
			at := time.Unix(ts, 0)
			if at.Before(down.Truncate(time.Second)) || at.After(up) {
				continue
			}
			during++
			if res == "ok" {
				ok++
			} else {
				fail++
			}
		}
		return nil
	})
	if fail > 0 || ok < int(d/time.Second) {
		t.Errorf("pod to pod (%s → %s) during the outage: %d ok, %d failed, want none failed and at least %d ok", n1.Name, n2.Name, ok, fail, int(d/time.Second))
	}

	// Recovery: the same agent containers, the condition never turned, and a Node change
	// made now is acted on.
	after := agentPods(t, f)
	for node, a := range before {
		if b := after[node]; b.containerID != a.containerID || b.restarts != a.restarts {
			t.Errorf("node %s: agent container %s (restarts %d) before, %s (restarts %d) after the outage", node, a.containerID, a.restarts, b.containerID, b.restarts)
		}
	}
	t0 := time.Now()
	_, route, remove := probeNode(t, f.c, p)
	// Bounded by client-go's reflector: while the API server is gone the agent's Node
	// watch retries at most every [30, 60) s; the first retry after the Service is back
	// relists.
	eventually(t, 3*time.Minute, func() error { return routed(p, route, true) })
	routedAfter := time.Since(t0)
	remove()
	eventually(t, 2*time.Minute, func() error { return routed(p, route, false) })
	for _, n := range p.Nodes {
		c := networkCondition(t, f, n.Name)
		if c.Status != corev1.ConditionTrue || !c.LastTransitionTime.Time.Equal(conds[n.Name].LastTransitionTime.Time) {
			t.Errorf("node %s: %s %s since %s after the outage; before: True since %s", n.Name, kube.ConditionType, c.Status, c.LastTransitionTime, conds[n.Name].LastTransitionTime)
		}
	}
	restarts := 0
	for _, a := range after {
		restarts += int(a.restarts)
	}
	var cips []string
	for _, n := range p.Nodes {
		cips = append(cips, fmt.Sprintf("%s %s", n.Name, cipBack[n.Name].Round(100*time.Millisecond)))
	}
	rep.add("API server stopped (SIGTERM through the lab's state; %s until it exited) and kept down for %s, answering again %s after its start: %d checks every 2 s on every node found its routes to the other nodes' pod CIDRs, "+
		"its kubelet and its agent process in place (%d broken); a pod on %s fetching from a pod on %s every 0.5 s logged %d successes and %d failures over the outage. "+
		"Afterwards the agents were the same containers (restart counts unchanged, %d in all), %s stayed True (transition time unchanged), "+
		"and a Node created once the Service connected again from every node was routed on every node %s later and unrouted after its deletion. "+
		"The agent reaches the API server through the kubernetes Service (in-cluster config): the stopping API server removed its endpoint, kube-proxy rejected %s:443 "+
		"until it saw the endpoint again (connectable again after the API server's start on: %s), and the agent's Node watch retries with a backoff that grows to [30, 60) s over a long outage (client-go's reflector); "+
		"the route's wait is those two.",
		stopTook.Round(100*time.Millisecond), outage.Round(time.Second), back.Round(100*time.Millisecond), checks*len(p.Nodes), broken, n1.Name, n2.Name, ok, fail,
		restarts, kube.ConditionType, routedAfter.Round(10*time.Millisecond), p.ServiceAPI, strings.Join(cips, ", "))
}

// killedMidInstall rolls back to the lab's own image and SIGKILLs the first new agent
// while it copies the plugins: the kubelet restarts it, and that start must complete the
// install (every plugin v1, no temporary file, the conflist in place) and pods must work.
func killedMidInstall(t *testing.T, f *fixture, v1, v2 build, rep *upgradeReport) {
	p := f.p
	type kill struct {
		node    Node
		pid     int
		lag     time.Duration
		state   map[string]string
		temps   []string
		killErr error
	}
	done := make(chan struct{})
	var once sync.Once
	var got *kill
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, n := range p.Nodes {
		old := agentPids(n.NetNS)
		wg.Add(1)
		go func() {
			defer wg.Done()
			pid, lag, err := killMidInstall(n.NetNS, n.Path("fs", podCNIBin), old, 5*time.Minute, done)
			if err != nil {
				mu.Lock()
				if got == nil && !strings.Contains(err.Error(), "stopped") {
					got = &kill{node: n, killErr: err}
				}
				mu.Unlock()
				return
			}
			once.Do(func() { close(done) })
			// What the crash leaves, before the kubelet starts the container again.
			for i := 0; i < 50 && agentPids(n.NetNS)[pid]; i++ {
				time.Sleep(20 * time.Millisecond)
			}
			k := &kill{node: n, pid: pid, lag: lag}
			k.state, k.temps, k.killErr = dirState(n.Path("fs", podCNIBin), v1, v2)
			mu.Lock()
			got = k
			mu.Unlock()
		}()
	}
	took := setAgentImage(t, p, AgentImage)
	once.Do(func() { close(done) })
	wg.Wait()
	if got == nil || got.killErr != nil {
		t.Fatalf("no agent killed mid-install: %+v", got)
	}
	var residue []string
	mixed := false
	for name, v := range got.state {
		residue = append(residue, name+"="+v)
		mixed = mixed || v != "v1"
	}
	if !mixed && len(got.temps) == 0 {
		t.Errorf("the kill on %s landed after the install: %v", got.node.Name, got.state)
	}
	for _, n := range p.Nodes {
		state, temps, err := dirState(n.Path("fs", podCNIBin), v1, v2)
		if err != nil {
			t.Fatal(err)
		}
		for name, v := range state {
			if v != "v1" {
				t.Errorf("node %s after the restart: %s is %s, want v1", n.Name, name, v)
			}
		}
		if len(temps) > 0 {
			t.Errorf("node %s after the restart: temporary files left %v", n.Name, temps)
		}
		if _, err := os.Stat(filepath.Join(n.Path("fs", podCNIConf), "10-podwire.conflist")); err != nil {
			t.Errorf("node %s: %v", n.Name, err)
		}
	}
	after := agentPods(t, f)
	killed := after[got.node.Name]
	if killed.restarts < 1 {
		t.Errorf("node %s: the killed agent's pod %s shows %d restarts", got.node.Name, killed.name, killed.restarts)
	}
	logs, err := p.Kubectl(nil, "-n", "podwire-system", "logs", killed.name)
	if err != nil {
		t.Fatal(err)
	}
	for _, tmp := range got.temps {
		if !strings.Contains(logs, tmp) || !strings.Contains(logs, "swept") {
			t.Errorf("the restarted agent's log does not say it removed %s:\n%s", tmp, logs)
		}
	}
	// Pods work on the completed install.
	n1, n2 := p.Nodes[0], p.Nodes[len(p.Nodes)-1]
	f.run(agnhost("after1", n1.Name, nil), agnhost("after2", n2.Name, nil))
	f.expect("after1", "curl -sS --max-time 3 http://"+f.pods["after2"].Status.PodIP+":8080/hostname", func(s string) bool { return s == "after2" }, "pod to pod after the restart")
	rep.add("Rollback v2 → v1 with the first new agent SIGKILLed (from the machine, %s after a temporary file showed in %s's /opt/cni/bin): "+
		"it left %s and temporary files %v; the kubelet started the container again (restarts %d), which removed the temporary files (logged as swept), completed the install "+
		"(every plugin v1 on every node, none left, conflist in place) and a new pod on each node reached the other; the rollback took %s.",
		got.lag.Round(time.Microsecond), got.node.Name, strings.Join(slices.Sorted(slices.Values(residue)), " "), got.temps, killed.restarts, took.Round(time.Second))
}
