//go:build tools

// Package devcluster pins the control-plane commands this module builds, so
// that `go mod tidy` keeps every module they need in go.sum.
package devcluster

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
