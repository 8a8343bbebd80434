//go:build tools

// Package coscheduling pins the commands this module builds, so that `go mod tidy`
// keeps every module they need in go.sum.
package coscheduling

import _ "sigs.k8s.io/scheduler-plugins/cmd/scheduler"
import _ "sigs.k8s.io/scheduler-plugins/cmd/controller"
