//go:build tools

// Package kueue pins the Kueue command this module builds, so that
// `go mod tidy` keeps every module it needs in go.sum.
package kueue

import _ "sigs.k8s.io/kueue/cmd/kueue"
