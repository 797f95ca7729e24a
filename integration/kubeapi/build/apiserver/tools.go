// SPDX-License-Identifier: Apache-2.0

//go:build tools

// Package apiserver pins kube-apiserver for podwire's integration tests
// (integration/kubeapi builds k8s.io/kubernetes/cmd/kube-apiserver in this module).
// k8s.io/kubernetes cannot be required as it is: its go.mod replaces each staging module
// with ./staging/src/k8s.io/..., which a dependency's replace cannot do; this go.mod
// replaces each with the same module at the matching v0.x release instead.
package apiserver

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
