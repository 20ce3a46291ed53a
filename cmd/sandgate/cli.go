package main

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
)

// The command line runs on cobra (github.com/spf13/cobra): shell
// completion generation is built in (`sandgate completion bash|zsh|fish`),
// its flags (pflag) take two dashes and print help with two, and it is
// the most used Go CLI library, so its conventions are the ones people
// know. The commands that predate it (serve, proxy, ssh-config, image,
// mcp) are registered with DisableFlagParsing: cobra hands them their
// arguments unchanged and their own flag.FlagSet parses them as before,
// so scripts and ProxyCommand lines keep working.

// exitError ends a command with an exit code, after its message (if any)
// has been printed.
type exitError struct{ code int }

func (e *exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// usageError is a mistake on the command line: exit status 2.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usageErrorf(format string, a ...any) error {
	return &usageError{fmt.Errorf(format, a...)}
}

// cli runs the command line through cobra and returns the exit status:
// 0 ok, 1 error, 2 usage (and whatever `session exec` passes through).
func cli(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := newRootCmd(stdin, stdout, stderr)
	root.SetArgs(args)
	cmd, err := root.ExecuteC()
	if err == nil {
		return 0
	}
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	name := "sandgate"
	if cmd != nil {
		name = cmd.CommandPath()
	}
	var ue *usageError
	if errors.As(err, &ue) || isCobraUsageError(err) {
		fmt.Fprintf(stderr, "%s: %v\nRun '%s --help' for usage.\n", name, err, name)
		return 2
	}
	fmt.Fprintf(stderr, "%s: %v\n", name, err)
	return 1
}

// isCobraUsageError recognises the errors cobra itself makes for a bad
// command line (flag errors go through SetFlagErrorFunc).
func isCobraUsageError(err error) bool {
	s := err.Error()
	return strings.HasPrefix(s, "unknown command") || strings.HasPrefix(s, "unknown flag") ||
		strings.HasPrefix(s, "unknown shorthand flag") || strings.Contains(s, " arg(s)") ||
		strings.HasPrefix(s, "invalid argument")
}

func newRootCmd(stdin io.Reader, stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "sandgate",
		Short: "isolated sandboxes over SSH and SFTP, tunnelled through HTTPS",
		Long: `sandgate: isolated sandboxes over SSH and SFTP, tunnelled through HTTPS.

Run 'sandgate serve' for the gateway; the other commands are its clients.
Clients read the gateway's URL and token from SANDBOX_API_URL and
SANDBOX_API_TOKEN (or --api-url and --token).`,
		Version:       version,
		SilenceErrors: true,
		SilenceUsage:  true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// No command: the help, on stderr, as a usage error.
			cmd.SetOut(stderr)
			_ = cmd.Help()
			return &exitError{2}
		},
	}
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetVersionTemplate("sandgate {{.Version}}\n")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err} })
	root.CompletionOptions.HiddenDefaultCmd = false

	legacy := func(use, short string, main func(args []string) int) *cobra.Command {
		return &cobra.Command{
			Use:                use,
			Short:              short,
			DisableFlagParsing: true,
			RunE: func(_ *cobra.Command, args []string) error {
				if code := main(args); code != 0 {
					return &exitError{code}
				}
				return nil
			},
		}
	}
	root.AddGroup(&cobra.Group{ID: "client", Title: "Sessions (clients of the REST API):"},
		&cobra.Group{ID: "gateway", Title: "Gateway and tools:"})
	for _, c := range []*cobra.Command{
		legacy("serve [flags]", "run the gateway (sandgate serve -h for flags)", func(a []string) int { return serveMain(a, stdout, stderr) }),
		legacy("proxy [flags] ID|NAME", "ProxyCommand for ssh/sftp/scp into a session", func(a []string) int { return proxyMain(a, stdin, stdout, stderr) }),
		legacy("ssh-config [flags]", "write the ~/.ssh/config block for sessions (sandgate ssh-config -h)", func(a []string) int { return sshConfigMain(a, stdout, stderr) }),
		legacy("image COMMAND [flags]", "pull, import, ls, rm, prune sandbox images (sandgate image -h)", func(a []string) int { return imageMain(a, stdout, stderr) }),
		legacy("mcp [--session ID]", "MCP server (stdio) for AI agents, driving the gateway's REST API", func(a []string) int { return mcpMain(a, stdin, stdout, stderr) }),
	} {
		c.GroupID = "gateway"
		root.AddCommand(c)
	}
	root.AddCommand(&cobra.Command{
		Use:     "version",
		Short:   "print the version",
		Args:    cobra.NoArgs,
		GroupID: "gateway",
		Run:     func(cmd *cobra.Command, _ []string) { fmt.Fprintln(cmd.OutOrStdout(), "sandgate", version) },
	})
	sess := newSessionCmd()
	sess.GroupID = "client"
	ssh := newSSHCmd()
	ssh.GroupID = "client"
	root.AddCommand(sess, ssh)
	root.SetHelpCommandGroupID("gateway")
	root.SetCompletionCommandGroupID("gateway")
	return root
}
