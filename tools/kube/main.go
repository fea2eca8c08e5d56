// Command kube is etcd, kube-apiserver and kubectl in one binary, for poolkeeper's tests,
// and the node's components: kubelet, kube-scheduler, kube-controller-manager, kube-proxy.
//
// It picks the program by the name it was started as (symlinks named etcd, kube-apiserver,
// kubectl, kubelet, ...) or, when started as kube, by its first argument:
//
//	kube etcd --data-dir ...
//	kube apiserver --etcd-servers ...   (or kube-apiserver)
//	kube kubectl get ns                 (or kube kubectl version)
//	kube version
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// programs maps each name the binary answers to onto its entry point. Each entry point
// reads os.Args as if it were that program's own main (os.Args[0] is the program name).
var programs = map[string]func(){
	"etcd":           runEtcd,
	"kube-apiserver": runAPIServer,
	"apiserver":      runAPIServer,
	"kubectl":        runKubectl,
	"version":        runVersion,

	"kubelet":                 runKubelet,
	"kube-scheduler":          runScheduler,
	"kube-controller-manager": runControllerManager,
	"kube-proxy":              runProxy,
	"cri-reset":               runCRIReset,
}

func main() {
	name := strings.TrimSuffix(filepath.Base(os.Args[0]), ".exe")
	if _, ok := programs[name]; !ok {
		if len(os.Args) < 2 {
			usage()
		}
		os.Args = os.Args[1:]
		name = os.Args[0]
	}
	run, ok := programs[name]
	if !ok {
		usage()
	}
	run()
}

func usage() {
	names := make([]string, 0, len(programs))
	for name := range programs {
		names = append(names, name)
	}
	sort.Strings(names)
	fmt.Fprintf(os.Stderr, "usage: kube {%s} [ARGS...]\n", strings.Join(names, "|"))
	os.Exit(2)
}
