// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Kubectl runs the lab's kubectl with the admin kubeconfig.
func (p Plan) Kubectl(stdin io.Reader, args ...string) (string, error) {
	cmd := exec.Command(p.bin("kubectl"), append([]string{"--kubeconfig=" + p.Kubeconfig}, args...)...)
	cmd.Stdin = stdin
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// coreDNS is CoreDNS as a Deployment behind the kube-dns Service at the cluster DNS
// address (what kubeadm installs, with the lab's image). The lab has no upstream
// resolver, so the Corefile serves the cluster zone only.
func (p Plan) coreDNS() string {
	return fmt.Sprintf(`apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects:
- {kind: ServiceAccount, name: coredns, namespace: kube-system}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  Corefile: |
    .:53 {
        errors
        health {
            lameduck 5s
        }
        ready
        kubernetes %[1]s in-addr.arpa ip6.arpa {
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
            ttl 30
        }
        prometheus :9153
        cache 30
        reload
        loadbalance
    }
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: coredns
  namespace: kube-system
  labels: {k8s-app: kube-dns}
spec:
  replicas: 2
  selector: {matchLabels: {k8s-app: kube-dns}}
  template:
    metadata: {labels: {k8s-app: kube-dns}}
    spec:
      serviceAccountName: coredns
      priorityClassName: system-cluster-critical
      dnsPolicy: Default
      tolerations:
      - {key: CriticalAddonsOnly, operator: Exists}
      - {key: node-role.kubernetes.io/control-plane, effect: NoSchedule}
      topologySpreadConstraints:
      - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: ScheduleAnyway, labelSelector: {matchLabels: {k8s-app: kube-dns}}}
      containers:
      - name: coredns
        image: %[2]s
        imagePullPolicy: Never
        args: ["-conf", "/etc/coredns/Corefile"]
        volumeMounts:
        - {name: config, mountPath: /etc/coredns, readOnly: true}
        ports:
        - {name: dns, containerPort: 53, protocol: UDP}
        - {name: dns-tcp, containerPort: 53, protocol: TCP}
        - {name: metrics, containerPort: 9153, protocol: TCP}
        livenessProbe:
          httpGet: {path: /health, port: 8080}
          initialDelaySeconds: 10
        readinessProbe:
          httpGet: {path: /ready, port: 8181}
        securityContext:
          allowPrivilegeEscalation: false
          capabilities: {add: [NET_BIND_SERVICE], drop: [ALL]}
      volumes:
      - name: config
        configMap: {name: coredns, items: [{key: Corefile, path: Corefile}]}
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {k8s-app: kube-dns, kubernetes.io/name: CoreDNS}
spec:
  selector: {k8s-app: kube-dns}
  clusterIP: %[3]s
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
  - {name: metrics, port: 9153, protocol: TCP}
`, clusterZone, CoreDNSImage, p.DNS)
}

// nodeReady is a Node's Ready condition as "True" / "False" plus its reason.
func nodeReady(n corev1.Node) (bool, string) {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue, c.Reason + ": " + c.Message
		}
	}
	return false, "no Ready condition yet"
}

// waitNodes polls the Nodes until every node of the plan is registered and want(ready)
// holds for all of them, printing each change of a Node's Ready condition to log.
func (p Plan) waitNodes(ctx context.Context, log io.Writer, d time.Duration, want func(ready bool) bool) error {
	c, err := p.Client()
	if err != nil {
		return err
	}
	last := map[string]string{}
	deadline := time.Now().Add(d)
	for {
		list, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		ok := err == nil && len(list.Items) == len(p.Nodes)
		if err == nil {
			sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
			for _, n := range list.Items {
				ready, why := nodeReady(n)
				state := "NotReady"
				if ready {
					state = "Ready"
				}
				if last[n.Name] != state {
					fmt.Fprintf(log, "%s  node %s %s (%s)\n", time.Now().Format("15:04:05"), n.Name, state, why)
					last[n.Name] = state
				}
				ok = ok && want(ready)
			}
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nodes not as wanted after %s (last: %v, %v); see the kubelet logs in %s", d, last, err, p.Logs)
		}
		time.Sleep(time.Second)
	}
}

// applyAddons applies deploy/ (podwire-agent), waits for the Nodes to turn Ready
// because of it, then CoreDNS, and waits for it to serve.
func (p Plan) applyAddons(ctx context.Context, log io.Writer) error {
	fmt.Fprintln(log, "kubectl apply -f deploy/")
	var out string
	var err error
	if p.ClusterCIDR == netip.MustParsePrefix(deployClusterCIDR) {
		out, err = p.Kubectl(nil, "apply", "-f", filepath.Join(p.Repo, "deploy"))
	} else {
		var m string
		if m, err = p.deployManifests(); err == nil {
			out, err = p.Kubectl(strings.NewReader(m), "apply", "-f", "-")
		}
	}
	if err != nil {
		return err
	}
	fmt.Fprint(log, out)
	if err := p.waitNodes(ctx, log, 3*time.Minute, func(ready bool) bool { return ready }); err != nil {
		return fmt.Errorf("podwire-agent did not make the nodes Ready: %w (kubectl -n podwire-system logs ds/podwire-agent)", err)
	}
	if _, err := p.Kubectl(strings.NewReader(p.coreDNS()), "apply", "-f", "-"); err != nil {
		return err
	}
	if _, err := p.Kubectl(nil, "-n", "kube-system", "rollout", "status", "deployment/coredns", "--timeout=3m"); err != nil {
		return fmt.Errorf("CoreDNS did not come up: %w", err)
	}
	fmt.Fprintln(log, "CoreDNS serving at", p.DNS)
	return nil
}
