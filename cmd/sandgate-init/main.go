// Command sandgate-init is the small binary a linux sandbox's init runs:
// `sandbox-init` and `sftp-server`, the two hidden commands of sandgate
// that run inside sandboxes, and `sandbox-spawner`, the small process that
// starts every init for the gateway (initd.SpawnMain), and nothing else. make build compiles it
// first and embeds it in sandgate (package sandbox/linuxns/initexe), so
// that a new sandbox starts a 3 MB binary with about 45 package inits
// instead of the whole gateway with 300 or more (its Kubernetes, etcd,
// gRPC, OpenAPI and JSON Schema packages included): the gateway execs it
// from a sealed memfd, never from a file on disk. A sandgate built
// without make (go install) lacks it and runs its own binary as the init,
// as before.
package main

import (
	"os"

	"github.com/sandgate/sandgate/sandbox/linuxns/initd"
	"github.com/sandgate/sandgate/sftpd"
)

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "sandbox-init":
			os.Exit(initd.Main(os.Args[2:]))
		case "sftp-server":
			os.Exit(sftpd.Main(os.Args[2:]))
		case "sandbox-spawner":
			os.Exit(initd.SpawnMain(os.Args[2:]))
		}
	}
	os.Stderr.WriteString("sandgate-init: the sandbox side of sandgate, started by the gateway (sandbox-init, sftp-server, sandbox-spawner)\n")
	os.Exit(2)
}
