//go:build tools

// Package tools pins controller-gen, which the chart tests run on the prometheus-operator
// monitoring types to make the ServiceMonitor, PodMonitor and PrometheusRule CRDs.
package tools

import _ "sigs.k8s.io/controller-tools/cmd/controller-gen"
