// Command etcd is the etcd server, built from go.etcd.io/etcd/server/v3 at the
// version pinned in go.mod. etcd's own root module replaces its siblings with
// local paths, so it cannot be `go install`ed; this wrapper calls the same
// entry point its main package does.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
