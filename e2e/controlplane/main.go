// Command controlplane is one multi-call binary holding the Kubernetes control-plane
// components tender's end-to-end tests run: an embedded etcd, kube-apiserver and
// kube-controller-manager, all built from the Kubernetes Go modules pinned in go.mod.
//
// Usage: controlplane etcd|kube-apiserver|kube-controller-manager [flags]
package main

import (
	"fmt"
	"os"
	"path/filepath"
	_ "time/tzdata"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() {
	name := filepath.Base(os.Args[0])
	args := os.Args[1:]
	if name == "controlplane" || name == "tender-controlplane" {
		if len(args) == 0 {
			usage()
		}
		name, args = args[0], args[1:]
	}
	switch name {
	case "etcd":
		os.Exit(runEtcd(args))
	case "kube-apiserver":
		cmd := apiserver.NewAPIServerCommand()
		cmd.SetArgs(args)
		os.Exit(cli.Run(cmd))
	case "kube-controller-manager":
		cmd := controllermanager.NewControllerManagerCommand()
		cmd.SetArgs(args)
		os.Exit(cli.Run(cmd))
	default:
		usage()
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: controlplane etcd|kube-apiserver|kube-controller-manager [flags]")
	os.Exit(2)
}
