// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// nodeBlock marks a walkthrough block that runs on every node.
const nodeBlock = "# on each node, as root"

// walkBlock is one sh block of docs/agent.md's walkthrough.
type walkBlock struct {
	node bool
	cmds []string
}

// walkthrough returns the sh blocks of md's "## Walkthrough" section, in order: one
// command per line, comments dropped.
func walkthrough(md string) []walkBlock {
	var blocks []walkBlock
	var cur *walkBlock
	section := false
	sc := bufio.NewScanner(strings.NewReader(md))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		raw := sc.Text()
		line := strings.TrimSpace(raw)
		switch {
		case strings.HasPrefix(raw, "## "):
			section = strings.HasPrefix(raw, "## Walkthrough")
			continue
		case !section:
			continue
		case cur == nil && line == "```sh":
			cur = &walkBlock{}
			continue
		case cur != nil && strings.HasPrefix(line, "```"):
			blocks = append(blocks, *cur)
			cur = nil
			continue
		case cur == nil:
			continue
		}
		if line == nodeBlock && len(cur.cmds) == 0 {
			cur.node = true
			continue
		}
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		cur.cmds = append(cur.cmds, line)
	}
	return blocks
}

// TestAgentWalkthrough runs docs/agent.md's walkthrough against the lab, block by block,
// exactly as written (two lab facts rewritten: `-f deploy/` names a copy with the lab's
// --cluster-cidr, as step 1 tells a user to edit it, and node blocks run in each node's
// namespaces with the lab's ctr and a freshly built podwire on PATH), and checks each
// step: the image on every node, the agents rolled out with every node PodwireNetworkReady
// and Ready, a pod with an address in its node's pod CIDR, the routes, the upgrade's image
// on every agent, and after the uninstall nothing of podwire's on any node that the page
// says is removed. The lab is restored (deploy/ applied again, nodes uncordoned) at the
// end, also after a failure.
func TestAgentWalkthrough(t *testing.T) {
	p := needLab(t)
	md, err := os.ReadFile(filepath.Join(p.Repo, "docs", "agent.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := walkthrough(string(md))
	// The steps the page must have, by each block's first command: a block added,
	// removed or reordered in the page fails here until the test checks it too.
	want := []struct {
		node  bool
		first string
	}{
		{false, "make image IMAGE_NAME=docker.io/podwire/podwire-agent:dev IMAGE_TAR=dist/podwire-agent.oci.tar"},
		{true, "ctr -n k8s.io images import dist/podwire-agent.oci.tar"},
		{false, "kubectl apply -f deploy/"},
		{false, "kubectl get nodes -o "},
		{true, "ip route show proto 165"},
		{false, "kubectl delete pod podwire-check"},
		{false, "make image IMAGE_NAME=docker.io/podwire/podwire-agent:next "},
		{true, "ctr -n k8s.io images import dist/podwire-agent-next.oci.tar"},
		{false, "kubectl -n podwire-system set image daemonset/podwire-agent agent=docker.io/podwire/podwire-agent:next"},
		{false, "kubectl drain "},
		{true, "ip link delete cni0"},
	}
	if len(blocks) != len(want) {
		t.Fatalf("docs/agent.md's walkthrough has %d sh blocks, the test knows %d: %+v", len(blocks), len(want), blocks)
	}
	for i, w := range want {
		if blocks[i].node != w.node || !strings.HasPrefix(blocks[i].cmds[0], w.first) {
			t.Fatalf("walkthrough block %d is %+v, want one starting %q (node block: %v)", i+1, blocks[i], w.first, w.node)
		}
	}

	w := newWalker(t, p)
	ctx := context.Background()
	c, err := p.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.restore)

	// 1. The image, built and on every node.
	w.run(blocks[0])
	if _, err := os.Stat(filepath.Join(p.Repo, "dist", "podwire-agent.oci.tar")); err != nil {
		t.Fatal(err)
	}
	w.runNodes(blocks[1])
	w.imageOnNodes(AgentImage)

	// 2. Applied and rolled out (the page's waits are its own checks; they fail the run).
	w.run(blocks[2])

	// 3. Check: the columns, a pod in its node's pod CIDR, the routes, podwire inspect.
	out := w.run(blocks[3])
	cidrs := map[string]netip.Prefix{}
	for _, n := range p.Nodes {
		node, err := c.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cidrs[n.Name] = netip.MustParsePrefix(node.Spec.PodCIDR)
		if !containsLine(out, n.Name, node.Spec.PodCIDR, "True", `{"`+node.Spec.PodCIDR+`":`) {
			t.Errorf("kubectl get nodes shows no line with %s, %s, True and its free addresses:\n%s", n.Name, node.Spec.PodCIDR, out)
		}
	}
	pod, err := c.CoreV1().Pods("default").Get(ctx, "podwire-check", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ip, err := netip.ParseAddr(pod.Status.PodIP)
	if err != nil || !cidrs[pod.Spec.NodeName].Contains(ip) {
		t.Errorf("pod podwire-check on %s has address %q, not in its node's pod CIDR %s", pod.Spec.NodeName, pod.Status.PodIP, cidrs[pod.Spec.NodeName])
	}
	for n, o := range w.runNodes(blocks[4]) {
		for _, other := range p.Nodes {
			if other.Name != n.Name && !containsLine(o, cidrs[other.Name].String(), "via "+other.IP.String()) {
				t.Errorf("node %s has no proto 165 route to %s via %s:\n%s", n.Name, cidrs[other.Name], other.IP, o)
			}
		}
		if n.Name == pod.Spec.NodeName && !strings.Contains(o, pod.Status.PodIP) {
			t.Errorf("podwire inspect on %s does not list podwire-check's address %s:\n%s", n.Name, pod.Status.PodIP, o)
		}
	}
	w.run(blocks[5])

	// 4. Upgrade: every agent on the new image, rolled out.
	w.run(blocks[6])
	w.runNodes(blocks[7])
	w.imageOnNodes("docker.io/podwire/podwire-agent:next")
	w.run(blocks[8])
	ds, err := c.AppsV1().DaemonSets("podwire-system").Get(ctx, "podwire-agent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ds.Status.UpdatedNumberScheduled != ds.Status.DesiredNumberScheduled || ds.Status.NumberReady != ds.Status.DesiredNumberScheduled {
		t.Errorf("after the upgrade: %d of %d agents updated, %d ready", ds.Status.UpdatedNumberScheduled, ds.Status.DesiredNumberScheduled, ds.Status.NumberReady)
	}
	pods, err := c.CoreV1().Pods("podwire-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=podwire-agent"})
	if err != nil {
		t.Fatal(err)
	}
	for _, ap := range pods.Items {
		if img := ap.Spec.Containers[0].Image; img != "docker.io/podwire/podwire-agent:next" && ap.DeletionTimestamp == nil {
			t.Errorf("after the upgrade, agent %s runs %s", ap.Name, img)
		}
	}

	// 5. Uninstall: what the agents installed is recorded in their manifests.
	installed := map[string][]string{}
	for _, n := range p.Nodes {
		installed[n.Name] = manifestFiles(t, n)
	}
	// The page says `kubectl delete -f deploy/` alone leaves all of it on the nodes:
	// run that command (the block's last) alone, check, and apply deploy/ again.
	del := blocks[9].cmds[len(blocks[9].cmds)-1]
	if del != "kubectl delete -f deploy/" {
		t.Fatalf("the uninstall block ends with %q, not kubectl delete -f deploy/", del)
	}
	w.run(walkBlock{cmds: []string{del}})
	for _, n := range p.Nodes {
		left := strings.Join(podwireLeft(t, n, installed[n.Name]), "\n")
		for _, f := range installed[n.Name] {
			if !strings.Contains(left, "installed file "+f) {
				t.Errorf("node %s lost %s to kubectl delete -f deploy/ alone; the page says it stays", n.Name, f)
			}
		}
		for _, want := range []string{"routes proto 165", "table inet podwire_agent", "link cni0", "/var/lib/podwire-agent holds"} {
			if !strings.Contains(left, want) {
				t.Errorf("node %s has no %s after kubectl delete -f deploy/ alone; the page says it stays:\n%s", n.Name, want, left)
			}
		}
	}
	w.run(walkBlock{cmds: []string{"kubectl apply -f deploy/", "kubectl -n podwire-system set image daemonset/podwire-agent agent=docker.io/podwire/podwire-agent:next",
		"kubectl -n podwire-system rollout status daemonset/podwire-agent --timeout=5m"}})
	w.run(blocks[9])
	if _, err := c.CoreV1().Namespaces().Get(ctx, "podwire-system", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("namespace podwire-system after kubectl delete -f deploy/: %v", err)
	}
	w.runNodes(blocks[10])
	for _, n := range p.Nodes {
		for _, left := range podwireLeft(t, n, installed[n.Name]) {
			t.Errorf("node %s after the uninstall: %s", n.Name, left)
		}
	}
}

// walker runs walkthrough blocks against the lab.
type walker struct {
	t      *testing.T
	p      Plan
	deploy string // deploy/ with the lab's --cluster-cidr
	path   string // node blocks' PATH
}

func newWalker(t *testing.T, p Plan) *walker {
	tmp := t.TempDir()
	w := &walker{t: t, p: p, deploy: filepath.Join(tmp, "deploy") + "/"}
	manifests, err := p.deployManifests()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(w.deploy, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(w.deploy, "deploy.yaml"), []byte(manifests), 0o644); err != nil {
		t.Fatal(err)
	}
	// `make install`'s bin/podwire, built for the nodes.
	bin := filepath.Join(tmp, "bin")
	build := exec.Command("go", "build", "-o", bin+"/", "./cmd/podwire")
	build.Dir, build.Env = p.Repo, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building podwire: %v\n%s", err, out)
	}
	w.path = "PATH=" + p.ContainerdDir + ":" + bin + ":" + sbinPath
	t.Cleanup(func() {
		for _, f := range []string{"podwire-agent.oci.tar", "podwire-agent-next.oci.tar"} {
			_ = os.Remove(filepath.Join(p.Repo, "dist", f))
		}
	})
	return w
}

// lab rewrites a command for the lab: the edited copy of deploy/.
func (w *walker) lab(cmd string) string {
	return strings.ReplaceAll(cmd, " -f deploy/", " -f "+w.deploy)
}

// run runs an admin block in the checkout with the lab's kubeconfig and kubectl.
func (w *walker) run(b walkBlock) string {
	w.t.Helper()
	if b.node {
		w.t.Fatalf("block %q runs on the nodes", b.cmds)
	}
	var all strings.Builder
	for _, c := range b.cmds {
		cmd := exec.Command("sh", "-c", w.lab(c))
		cmd.Dir = w.p.Repo
		cmd.Env = append(os.Environ(), "KUBECONFIG="+w.p.Kubeconfig, "PATH="+w.p.BinDir+":"+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		w.t.Logf("$ %s\n%s", c, strings.TrimSpace(string(out)))
		if err != nil {
			w.t.Fatalf("%s: %v", c, err)
		}
		all.Write(out)
	}
	return all.String()
}

// runNodes runs a node block on every node; a failure is fatal, except rm's refusal to
// remove a directory the lab binds over (a lab node's own dirs are mount points).
func (w *walker) runNodes(b walkBlock) map[Node]string {
	w.t.Helper()
	if !b.node {
		w.t.Fatalf("block %q is not a node block", b.cmds)
	}
	outs := map[Node]string{}
	for _, n := range w.p.Nodes {
		for _, c := range b.cmds {
			argv := inNode(n, "env", w.path, "sh", "-c", "cd \"$1\" && "+c, "sh", w.p.Repo)
			out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
			w.t.Logf("%s# %s\n%s", n.Name, c, strings.TrimSpace(string(out)))
			if err != nil && !(strings.HasPrefix(c, "rm ") && onlyBusyBinds(string(out))) {
				w.t.Fatalf("node %s: %s: %v", n.Name, c, err)
			}
			outs[n] += string(out)
		}
	}
	return outs
}

func onlyBusyBinds(out string) bool {
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		busy := strings.Contains(l, "Device or resource busy")
		bound := false
		for _, d := range NodeDirs {
			bound = bound || strings.Contains(l, "'"+d+"'")
		}
		if !busy || !bound {
			return false
		}
	}
	return true
}

// imageOnNodes requires ref in every node's containerd.
func (w *walker) imageOnNodes(ref string) {
	w.t.Helper()
	for _, n := range w.p.Nodes {
		if out := ctr(w.t, w.p, n, "images", "ls", "-q", "name=="+ref); strings.TrimSpace(out) != ref {
			w.t.Errorf("node %s's containerd has no image %s: %q", n.Name, ref, out)
		}
	}
}

// restore puts the lab back as make cluster left it: deploy/ applied, nodes schedulable
// and Ready, CoreDNS rolled out.
func (w *walker) restore() {
	t := w.t
	k := func(args ...string) {
		if _, err := w.p.Kubectl(nil, args...); err != nil {
			t.Error(err)
		}
	}
	// A namespace still being deleted refuses new objects.
	eventually(t, 3*time.Minute, func() error {
		_, err := w.p.Kubectl(nil, "apply", "-f", w.deploy)
		return err
	})
	for _, n := range w.p.Nodes {
		k("uncordon", n.Name)
	}
	k("-n", "podwire-system", "rollout", "status", "daemonset/podwire-agent", "--timeout=5m")
	k("wait", "nodes", "--all", "--for=condition=Ready", "--timeout=5m")
	k("-n", "kube-system", "rollout", "status", "deployment/coredns", "--timeout=5m")
	_, _ = w.p.Kubectl(nil, "delete", "pod", "podwire-check", "--ignore-not-found")
}

// manifestFiles are the host paths (as the node sees them) the agent on n recorded.
func manifestFiles(t *testing.T, n Node) []string {
	t.Helper()
	b, err := os.ReadFile(n.Path("fs", "/var/lib/podwire-agent", "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Files []struct{ Path string } `json:"files"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range m.Files {
		out = append(out, strings.TrimPrefix(f.Path, "/host"))
	}
	if len(out) == 0 {
		t.Fatalf("node %s's manifest lists nothing the agent installed", n.Name)
	}
	return out
}

// podwireLeft lists what of podwire's is still on n: the files the agent installed,
// its routes and table, cni0, and its state, lock and lease dirs (empty counts as gone:
// in the lab they are the node's bind mounts).
func podwireLeft(t *testing.T, n Node, installed []string) []string {
	t.Helper()
	var left []string
	for _, f := range installed {
		if _, err := os.Lstat(n.Path("fs", f)); err == nil {
			left = append(left, "installed file "+f)
		}
	}
	if out, err := run("nsenter", "--net="+n.NetNS, "--", "ip", "route", "show", "proto", "165"); err != nil || strings.TrimSpace(out) != "" {
		left = append(left, fmt.Sprintf("routes proto 165: %q %v", out, err))
	}
	if _, err := run("nsenter", "--net="+n.NetNS, "--", "nft", "list", "table", "inet", "podwire_agent"); err == nil {
		left = append(left, "table inet podwire_agent")
	}
	if _, err := run("nsenter", "--net="+n.NetNS, "--", "ip", "link", "show", "dev", "cni0"); err == nil {
		left = append(left, "link cni0")
	}
	for _, d := range []string{"/var/lib/podwire-agent", "/run/podwire", "/var/lib/cni/networks/podwire"} {
		if ents, err := os.ReadDir(n.Path("fs", d)); err == nil && len(ents) > 0 {
			left = append(left, fmt.Sprintf("%s holds %d entries", d, len(ents)))
		}
	}
	return left
}

// containsLine reports whether one line of out holds every one of parts.
func containsLine(out string, parts ...string) bool {
	for _, l := range strings.Split(out, "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(l, p)
		}
		if all {
			return true
		}
	}
	return false
}
