// Command sandgate is the sandbox gateway: `serve` runs it, `session` and
// `ssh` drive sessions through its REST API, `proxy` is an OpenSSH
// ProxyCommand into a session, `ssh-config` writes the matching
// ~/.ssh/config block, `mcp` is an MCP server for AI agents.
package main

import (
	"io"
	"os"

	"github.com/sandgate/sandgate/sandbox/linuxns/initd"
	"github.com/sandgate/sandgate/sftpd"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	// The hidden commands the gateway runs itself skip the command line
	// library: they start often and inside sandboxes.
	if len(args) > 0 {
		switch args[0] {
		case "sftp-server":
			return sftpd.Main(args[1:])
		case "sandbox-init":
			return initd.Main(args[1:])
		case "sandbox-spawner": // the linux driver's spawn server, when this binary is its small init
			return initd.SpawnMain(args[1:])
		case preflightCmd: // the startup check's namespace probes (preflight_linux.go)
			return preflightMain(args[1:])
		}
	}
	return cli(args, stdin, stdout, stderr)
}
