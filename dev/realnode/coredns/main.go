// A minimal CoreDNS for the real node (dev/realnode/realnode.py writes its
// Corefile): cluster.local from the local cluster's API (kubernetes), NXDOMAIN
// for every other name (template), on the node's own address (bind), errors
// logged (errors). CoreDNS's documented way to choose plugins without editing
// its plugin.cfg: set dnsserver.Directives (in plugin.cfg's order) and import
// only those plugins.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/template"
)

func init() {
	dnsserver.Directives = []string{"bind", "errors", "template", "kubernetes"}
}

func main() {
	coremain.Run()
}
