package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

// runEtcd is the etcd server; etcdmain.Main reads its flags from os.Args[1:].
func runEtcd() {
	etcdmain.Main(os.Args)
}
