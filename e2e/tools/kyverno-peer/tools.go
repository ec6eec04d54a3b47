//go:build tools

// Package tools pins Kyverno's admission and background controllers, which tender-bench
// builds as a peer (go build github.com/kyverno/kyverno/cmd/...).
package tools

import (
	_ "github.com/kyverno/kyverno/cmd/background-controller"
	_ "github.com/kyverno/kyverno/cmd/kyverno"
)
