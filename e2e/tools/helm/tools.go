//go:build tools

// Package tools pins the Helm CLI the chart tests build (go build helm.sh/helm/v3/cmd/helm).
package tools

import _ "helm.sh/helm/v3/cmd/helm"
