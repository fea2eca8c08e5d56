package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

// runAPIServer is kube-apiserver; its cobra command reads its flags from os.Args[1:].
func runAPIServer() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
