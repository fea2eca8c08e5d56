package main

import (
	"fmt"

	"k8s.io/component-base/version"
)

// runVersion prints the Kubernetes release the binary was stamped with (build-kube.sh sets
// it with -ldflags -X k8s.io/component-base/version.gitVersion=...).
func runVersion() {
	fmt.Println(version.Get().GitVersion)
}
