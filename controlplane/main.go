// Command kube-controlplane is the real Kubernetes control plane in one binary, as k3s does it:
// each subcommand runs one component's own cobra command, so the shared packages (apiserver,
// client-go, the API types) are compiled once. The pin is k8s.io/kubernetes in go.mod.
//
//	kube-controlplane etcd --data-dir DIR --client-port N --peer-port M
//	kube-controlplane kube-apiserver ...            (kube-apiserver's own flags)
//	kube-controlplane kube-scheduler ...
//	kube-controlplane kube-controller-manager ...
//	kube-controlplane kubelet-api --port N --tls-cert-file F --tls-private-key-file K --client-ca-file CA --pods-dir DIR
//	kube-controlplane version
package main

import (
	"fmt"
	"os"
	"runtime/debug"
	_ "time/tzdata" // CronJob time zones, as kube-apiserver's and kube-controller-manager's mains do

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format, as each component's main
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func usage() {
	fmt.Fprintln(os.Stderr, "usage: kube-controlplane etcd|kube-apiserver|kube-scheduler|kube-controller-manager|kubelet-api|version [flags]")
}

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	name, args := os.Args[1], os.Args[2:]
	var command *cobra.Command
	switch name {
	case "etcd":
		os.Exit(runEtcd(args))
	case "kubelet-api":
		os.Exit(runKubeletAPI(args))
	case "version":
		printVersion()
		return
	case "kube-apiserver":
		command = apiserver.NewAPIServerCommand()
	case "kube-scheduler":
		command = scheduler.NewSchedulerCommand()
	case "kube-controller-manager":
		command = controllermanager.NewControllerManagerCommand()
	default:
		fmt.Fprintf(os.Stderr, "kube-controlplane: unknown component %q\n", name)
		usage()
		os.Exit(2)
	}
	// Present the component as if it were its own binary: it parses its own arguments, and
	// os.Args[0] is what client-go's DefaultKubernetesUserAgent (rest/config.go) puts first in
	// its User-Agent, which the apiserver takes as the field manager's name (apiserver
	// pkg/endpoints/handlers/create.go prefixFromUserAgent) and audit logs record. Without this
	// every component would write as "kube-controlplane".
	os.Args = append([]string{name}, args...)
	command.SetArgs(args)
	os.Exit(cli.Run(command))
}

// printVersion names the pinned modules, read from the build info (no hand-kept constant).
func printVersion() {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		fmt.Println("kube-controlplane (no build info)")
		return
	}
	for _, want := range []string{"k8s.io/kubernetes", "go.etcd.io/etcd/server/v3"} {
		for _, dep := range info.Deps {
			if dep.Path == want {
				fmt.Printf("%s %s\n", dep.Path, dep.Version)
			}
		}
	}
	fmt.Printf("go %s\n", info.GoVersion)
}
