//go:build tools

// Package tools pins Flux's kustomize-controller, which tender-bench builds as a peer
// (go build github.com/fluxcd/kustomize-controller).
package tools

import _ "github.com/fluxcd/kustomize-controller"
