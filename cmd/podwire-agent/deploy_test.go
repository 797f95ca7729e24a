// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// TestDeployManifests decodes deploy/*.yaml strictly into the API types (a misspelt
// field fails), and checks that the DaemonSet's args are flags the agent has, that it
// keeps the image's entrypoint (the agent under podwire-init), and that every volume
// mount has its volume. The API server's own check (server-side apply in
// dry-run mode) is in the integration tests.
func TestDeployManifests(t *testing.T) {
	files, _ := filepath.Glob("../../deploy/*.yaml")
	if len(files) == 0 {
		t.Fatal("no deploy/*.yaml")
	}
	kinds := map[string]int{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range bytes.Split(b, []byte("\n---\n")) {
			var meta struct{ Kind string }
			if err := yaml.Unmarshal(doc, &meta); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			kinds[meta.Kind]++
			var obj any
			switch meta.Kind {
			case "Namespace":
				obj = &corev1.Namespace{}
			case "ServiceAccount":
				obj = &corev1.ServiceAccount{}
			case "ClusterRole":
				obj = &rbacv1.ClusterRole{}
			case "ClusterRoleBinding":
				obj = &rbacv1.ClusterRoleBinding{}
			case "DaemonSet":
				obj = &appsv1.DaemonSet{}
			case "ValidatingAdmissionPolicy":
				obj = &admissionregistrationv1.ValidatingAdmissionPolicy{}
			case "ValidatingAdmissionPolicyBinding":
				obj = &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
			default:
				t.Fatalf("%s: unexpected kind %q", f, meta.Kind)
			}
			if err := yaml.UnmarshalStrict(doc, obj); err != nil {
				t.Fatalf("%s: %s: %v", f, meta.Kind, err)
			}
			if ds, ok := obj.(*appsv1.DaemonSet); ok {
				checkDaemonSet(t, ds)
			}
		}
	}
	for _, k := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
		if kinds[k] != 1 {
			t.Errorf("%d %s objects", kinds[k], k)
		}
	}
}

func checkDaemonSet(t *testing.T, ds *appsv1.DaemonSet) {
	spec := ds.Spec.Template.Spec
	if !spec.HostNetwork {
		t.Error("the DaemonSet must use hostNetwork")
	}
	c := spec.Containers[0]
	// The image's entrypoint is /podwire-init /podwire-agent (hack/mkimage): a command
	// here would replace it, and the agent would run as PID 1 without a reaper.
	if len(c.Command) != 0 {
		t.Errorf("the DaemonSet sets command %q: leave it to the image's entrypoint (/podwire-init /podwire-agent), or start it with those two", c.Command)
	}
	if spec.ShareProcessNamespace != nil && *spec.ShareProcessNamespace {
		t.Error("shareProcessNamespace: podwire-init is the container's PID 1 and reaper (cmd/podwire-agent/README.md, \"PID 1\")")
	}
	args := append([]string{}, c.Args...)
	if _, err := parseFlags(append(args, "--node-name=x")); err != nil {
		t.Errorf("the DaemonSet's args do not parse: %v", err)
	}
	vols := map[string]bool{}
	for _, v := range spec.Volumes {
		vols[v.Name] = true
	}
	for _, m := range c.VolumeMounts {
		if !vols[m.Name] {
			t.Errorf("mount %s has no volume", m.Name)
		}
	}
	caps := c.SecurityContext.Capabilities.Add
	if !strings.Contains(strings.Join(capNames(caps), ","), "NET_ADMIN") {
		t.Errorf("capabilities %v lack NET_ADMIN", caps)
	}
	if c.Env[0].ValueFrom == nil || c.Env[0].ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Error("NODE_NAME must come from spec.nodeName")
	}
}

func capNames(cs []corev1.Capability) []string {
	var out []string
	for _, c := range cs {
		out = append(out, string(c))
	}
	return out
}
