//go:build tools

// Package volcano pins the command this module builds, so that `go mod tidy`
// keeps every module it needs in go.sum.
package volcano

import _ "volcano.sh/volcano/cmd/scheduler"
