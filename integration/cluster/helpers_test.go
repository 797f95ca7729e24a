// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// lab is the lab the tests drive: one that is up (PODWIRE_LAB names its run dir, as
// make cluster-check does) or, with PODWIRE_LAB_UP=1 or under CI, one of their own.
var lab struct {
	plan Plan
	own  bool
	err  error
}

func TestMain(m *testing.M) {
	code := func() int {
		if os.Geteuid() != 0 {
			lab.err = errNotRoot
			return m.Run()
		}
		if dir := os.Getenv("PODWIRE_LAB"); dir != "" {
			lab.plan, lab.err = Load(dir)
			return m.Run()
		}
		if os.Getenv("PODWIRE_LAB_UP") == "" && os.Getenv("CI") != "true" {
			lab.err = fmt.Errorf("no lab: make cluster && make cluster-check, or PODWIRE_LAB_UP=1 to bring one up")
			return m.Run()
		}
		repo, _ := filepath.Abs("../..")
		c := DefaultConfig(repo)
		c.Dir, c.Prefix = "/tmp/podwire-lab-test", "pwlt"
		c.Segment = netip.MustParsePrefix("10.252.0.0/24")
		// LAB_DIR, LAB_PREFIX, LAB_SEGMENT, LAB_CLUSTER_CIDR and NODES move it aside
		// (another lab on the machine); PROXY_MODE is the mode it starts in.
		if c, lab.err = FromEnv(c); lab.err != nil {
			return m.Run()
		}
		// The smoke needs no conformance binary (~7 CPU-minutes of build).
		c.E2E = os.Getenv("LAB_E2E") == "1"
		lab.own = true
		before, _ := MachineSnapshot(c.Prefix, c.Dir)
		lab.plan, lab.err = Up(context.Background(), c, os.Stdout)
		code := m.Run()
		if err := Down(c.Dir, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "tearing the lab down:", err)
			code = 1
		}
		after, _ := MachineSnapshot(c.Prefix, c.Dir)
		if d := labDiff(before, after, lab.plan); d != "" {
			fmt.Fprintf(os.Stderr, "the lab left the machine changed:\n%s", d)
			code = 1
		}
		return code
	}()
	os.Exit(code)
}

// needLab fails (under CI) or skips the test when there is no lab.
func needLab(t *testing.T) Plan {
	t.Helper()
	if lab.err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("the lab is required under CI=true: %v", lab.err)
		}
		t.Skip(lab.err)
	}
	return lab.plan
}

// fixture is a namespace of the test's own with its pods.
type fixture struct {
	t    *testing.T
	p    Plan
	c    *kubernetes.Clientset
	ns   string
	pods map[string]*corev1.Pod
}

func newFixture(t *testing.T, p Plan) *fixture {
	t.Helper()
	c, err := p.Client()
	if err != nil {
		t.Fatal(err)
	}
	var rnd [3]byte
	_, _ = rand.Read(rnd[:])
	f := &fixture{t: t, p: p, c: c, ns: "pwcheck-" + hex.EncodeToString(rnd[:]), pods: map[string]*corev1.Pod{}}
	ctx := context.Background()
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: f.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.t = t; f.deleteNamespace() })
	// The default ServiceAccount comes from kube-controller-manager; pods wait for it.
	eventually(t, 30*time.Second, func() error {
		_, err := c.CoreV1().ServiceAccounts(f.ns).Get(ctx, "default", metav1.GetOptions{})
		return err
	})
	return f
}

func (f *fixture) deleteNamespace() {
	ctx := context.Background()
	_ = f.c.CoreV1().Namespaces().Delete(ctx, f.ns, metav1.DeleteOptions{})
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		if _, err := f.c.CoreV1().Namespaces().Get(ctx, f.ns, metav1.GetOptions{}); err != nil {
			return
		}
		time.Sleep(time.Second)
	}
	f.t.Errorf("namespace %s still there after 2m", f.ns)
}

// agnhost is a pod on node running agnhost netexec (HTTP 8080, UDP 8081).
func agnhost(name, node string, labels map[string]string) *corev1.Pod {
	grace := int64(1)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "agnhost", Image: defaultAgnhost, ImagePullPolicy: corev1.PullNever,
				Args: []string{"netexec", "--http-port=8080", "--udp-port=8081"},
				Ports: []corev1.ContainerPort{
					{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP},
					{Name: "udp", ContainerPort: 8081, Protocol: corev1.ProtocolUDP},
				},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
					Path: "/healthz", Port: intstr8080}}, PeriodSeconds: 1},
			}},
		},
	}
}

// run creates pods and waits until each is Ready, recording its IP.
func (f *fixture) run(pods ...*corev1.Pod) {
	f.t.Helper()
	ctx := context.Background()
	for _, pod := range pods {
		if _, err := f.c.CoreV1().Pods(f.ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			f.t.Fatalf("creating pod %s: %v", pod.Name, err)
		}
	}
	for _, pod := range pods {
		var got *corev1.Pod
		eventually(f.t, 2*time.Minute, func() error {
			var err error
			if got, err = f.c.CoreV1().Pods(f.ns).Get(ctx, pod.Name, metav1.GetOptions{}); err != nil {
				return err
			}
			for _, c := range got.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					return nil
				}
			}
			return fmt.Errorf("pod %s is %s: %v", pod.Name, got.Status.Phase, got.Status.Conditions)
		})
		f.pods[pod.Name] = got
	}
}

// exec runs a shell command in pod and returns its trimmed stdout.
func (f *fixture) exec(pod, cmd string) (string, error) {
	out, err := f.p.Kubectl(nil, "-n", f.ns, "exec", pod, "--", "sh", "-c", cmd)
	return strings.TrimSpace(out), err
}

// expect runs cmd in pod until its output satisfies ok (kube-proxy programs a new
// Service within its sync period, not at once).
func (f *fixture) expect(pod, cmd string, ok func(string) bool, what string) {
	f.t.Helper()
	var out string
	eventually(f.t, 30*time.Second, func() error {
		var err error
		out, err = f.exec(pod, cmd)
		if err != nil {
			return err
		}
		if !ok(out) {
			return fmt.Errorf("%s: got %q", what, out)
		}
		return nil
	})
}

func eventually(t *testing.T, d time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %v", d, err)
		}
		time.Sleep(time.Second)
	}
}

// labDiff is diffLines over what the lab could have left: whole sections that only the
// lab's programs touch on this machine (sysctls, bind-target dirs, the lab's processes),
// and elsewhere the lines naming the lab's prefix, run dir or addresses (other work on a
// shared machine changes links, mounts and rules of its own meanwhile).
func labDiff(before, after string, p Plan) string {
	// The service CIDR in the machine's own rules would be a kube-proxy leak from any
	// lab; the pod CIDRs are routed on each lab's own bridge (its prefix).
	seg := p.Segment.Masked().Addr().String()
	keys := []string{p.Prefix, p.Dir, seg[:strings.LastIndexByte(seg, '.')+1], "10.96."}
	var out strings.Builder
	for _, l := range strings.Split(diffLines(before, after), "\n") {
		if l == "" {
			continue
		}
		keep := strings.Contains(l, " = ") || strings.HasPrefix(l[2:], "/var/") || strings.HasPrefix(l[2:], "/etc/cni") ||
			strings.HasPrefix(l[2:], "/opt/") || strings.HasPrefix(l[2:], "/run/containerd") || strings.HasPrefix(l[2:], "/run/podwire") ||
			strings.HasPrefix(l[2:], "/run/crio")
		for _, k := range keys {
			keep = keep || strings.Contains(l, k)
		}
		if keep {
			out.WriteString(l + "\n")
		}
	}
	return out.String()
}

// diffLines lists the lines only in a ("-") or only in b ("+").
func diffLines(a, b string) string {
	count := map[string]int{}
	for _, l := range strings.Split(a, "\n") {
		count[l]++
	}
	for _, l := range strings.Split(b, "\n") {
		count[l]--
	}
	var out strings.Builder
	for l, n := range count {
		switch {
		case n > 0:
			fmt.Fprintf(&out, "- %s\n", l)
		case n < 0:
			fmt.Fprintf(&out, "+ %s\n", l)
		}
	}
	return out.String()
}
