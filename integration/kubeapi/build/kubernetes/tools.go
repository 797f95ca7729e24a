// SPDX-License-Identifier: Apache-2.0

//go:build tools

// Package kubernetes pins the Kubernetes programs podwire's integration tests and lab run
// (integration/kubeapi builds each of them in this module): the control plane, the node
// programs, kubectl, agnhost and the e2e.test conformance binary.
// k8s.io/kubernetes cannot be required as it is: its go.mod replaces each staging module
// with ./staging/src/k8s.io/..., which a dependency's replace cannot do; this go.mod
// replaces each with the same module at the matching v0.x release instead.
package kubernetes

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/test/e2e"
	_ "k8s.io/kubernetes/test/images/agnhost"
	_ "k8s.io/kubernetes/test/images/regression-issue-74839"
)
