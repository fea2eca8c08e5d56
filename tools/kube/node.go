package main

import (
	"context"
	"os"

	"k8s.io/component-base/cli"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

// The components that make pods run: each cobra command reads its flags from os.Args[1:],
// as its own main does.

func runKubelet() {
	os.Exit(cli.Run(kubelet.NewKubeletCommand(context.Background())))
}

func runScheduler() {
	os.Exit(cli.Run(scheduler.NewSchedulerCommand()))
}

func runControllerManager() {
	os.Exit(cli.Run(controllermanager.NewControllerManagerCommand()))
}

func runProxy() {
	os.Exit(cli.Run(proxy.NewProxyCommand()))
}
