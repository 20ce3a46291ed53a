// Command sandgate is the sandbox gateway: `serve` runs it, `proxy` is an
// OpenSSH ProxyCommand into a session, `ssh-config` prints the matching
// ~/.ssh/config block, `mcp` is an MCP server for AI agents.
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/sandgate/sandgate/sandbox/linuxns/initd"
	"github.com/sandgate/sandgate/sftpd"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

const usage = `sandgate: isolated sandboxes over SSH and SFTP, tunnelled through HTTPS.

Usage:
  sandgate serve [flags]             run the gateway (sandgate serve -h for flags)
  sandgate proxy [flags] SESSION_ID  ProxyCommand for ssh/sftp/scp into a session
  sandgate ssh-config [flags]        print a ~/.ssh/config block for sessions
  sandgate image COMMAND [flags]     pull, import, ls, rm, prune sandbox images (sandgate image -h)
  sandgate mcp [--session ID]        MCP server (stdio) for AI agents, driving the gateway's REST API
  sandgate version                   print the version
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	rest := args[1:]
	switch args[0] {
	case "serve":
		return serveMain(rest, stdout, stderr)
	case "proxy":
		return proxyMain(rest, stdin, stdout, stderr)
	case "ssh-config":
		return sshConfigMain(rest, stdout, stderr)
	case "image":
		return imageMain(rest, stdout, stderr)
	case "mcp":
		return mcpMain(rest, stdin, stdout, stderr)
	case "version", "--version":
		fmt.Fprintln(stdout, "sandgate", version)
		return 0
	case "sftp-server":
		return sftpd.Main(rest)
	case "sandbox-init":
		return initd.Main(rest)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "sandgate: unknown command %q\n\n%s", args[0], usage)
	return 2
}
