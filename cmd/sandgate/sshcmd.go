package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
)

// newSSHCmd is `sandgate ssh [ID|NAME]`: OpenSSH into a session, through
// `sandgate proxy` and with the gateway's host key pinned. With no
// session it creates one and deletes it when the shell ends.
func newSSHCmd() *cobra.Command {
	var af apiFlags
	var o createOpts
	var keep bool
	cmd := &cobra.Command{
		Use:   "ssh [ID|NAME] [-- SSH-ARGS...]",
		Short: "open a shell in a session with OpenSSH (none given: a new one, deleted on exit)",
		Long: `Open a shell in a session with OpenSSH's ssh, through 'sandgate proxy'
and with the gateway's host key pinned (no ~/.ssh/config needed).

With no session, create one (with the create flags below), open the shell,
and delete the session when the shell ends, unless --keep. Words after --
go to ssh (a remote command, or ssh options).`,
		Args:              cobra.ArbitraryArgs,
		ValidArgsFunction: completeSessions(&af, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dash := cmd.ArgsLenAtDash()
			pos, sshArgs := args, []string(nil)
			if dash >= 0 {
				pos, sshArgs = args[:dash], args[dash:]
			}
			if len(pos) > 1 {
				return usageErrorf("at most one session, got %d (put ssh's own arguments after --)", len(pos))
			}
			created := len(pos) == 0
			if !created && cmd.Flags().NFlag() > 0 {
				for _, f := range []string{"name", "image", "ttl", "egress", "secret", "memory", "cpus", "workspace"} {
					if cmd.Flags().Changed(f) {
						return usageErrorf("--%s creates a session: give it without a session", f)
					}
				}
			}
			sshBin, err := exec.LookPath("ssh")
			if err != nil {
				return errors.New("OpenSSH's ssh is not on PATH (install openssh-client); 'sandgate session exec' and 'cp' need no ssh")
			}
			exe, err := os.Executable()
			if err != nil {
				return fmt.Errorf("find sandgate's own path: %w", err)
			}
			c, err := af.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			var s *session
			if created {
				s, _, err = c.createSession(ctx, &o)
				if err != nil {
					return err
				}
				if !keep {
					defer func() {
						dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
						defer cancel()
						if _, err := c.do(dctx, http.MethodDelete, sessPath(s.SessionID), nil); err != nil && !isStatus(err, http.StatusNotFound) {
							fmt.Fprintf(cmd.ErrOrStderr(), "%s: delete %s: %v\n", cmd.CommandPath(), s.SessionID, err)
						}
					}()
					fmt.Fprintf(cmd.ErrOrStderr(), "sandgate: session %s; it is deleted when this shell ends (--keep keeps it)\n", s.SessionID)
				} else {
					fmt.Fprintf(cmd.ErrOrStderr(), "sandgate: session %s (kept: sandgate session rm %s)\n", s.SessionID, s.SessionID)
				}
			} else if s, _, err = c.getSession(ctx, pos[0]); err != nil {
				return err
			}
			code, err := runOpenSSH(cmd, c, sshBin, exe, s, sshArgs)
			if err != nil {
				return err
			}
			if code != 0 {
				return &exitError{code}
			}
			return nil
		},
	}
	af.register(cmd)
	o.register(cmd)
	cmd.Flags().BoolVar(&keep, "keep", false, "keep the session this command creates when the shell ends")
	return cmd
}

// runOpenSSH runs ssh to the session and returns its exit status.
func runOpenSSH(cmd *cobra.Command, c *apiClient, sshBin, exe string, s *session, extra []string) (int, error) {
	if s.SSH.KnownHostsLine == "" {
		return 0, fmt.Errorf("the gateway gave no host key for session %s", s.SessionID)
	}
	kh, err := os.CreateTemp("", "sandgate-known-hosts-")
	if err != nil {
		return 0, err
	}
	defer os.Remove(kh.Name())
	_, err = fmt.Fprintln(kh, s.SSH.KnownHostsLine)
	if cerr := kh.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, err
	}
	proxy := quoteSSH(exe) + " proxy --api-url " + quoteSSH(c.cf.apiURL) + caArg(c.cf)
	if c.cf.insecure {
		proxy += " --insecure"
	}
	args := []string{
		"-o", "User=sandbox",
		"-o", "UserKnownHostsFile=" + quoteSSH(kh.Name()),
		"-o", "GlobalKnownHostsFile=/dev/null",
		"-o", "StrictHostKeyChecking=yes",
		"-o", "ForwardAgent=no",
		"-o", "ForwardX11=no",
		"-o", "ServerAliveInterval=30",
	}
	if u, err := url.Parse(c.cf.apiURL); err == nil && u.Scheme == "http" {
		proxy += " --fdpass"
		args = append(args, "-o", "ProxyUseFdpass=yes")
	}
	args = append(args, "-o", "ProxyCommand="+proxy+" %h")
	// OpenSSH reads options after the destination too, up to the first
	// word of a remote command.
	args = append(args, s.SessionID)
	args = append(args, extra...)
	ssh := exec.Command(sshBin, args...)
	ssh.Stdin, ssh.Stdout, ssh.Stderr = cmd.InOrStdin(), cmd.OutOrStdout(), cmd.ErrOrStderr()
	// The token goes to the ProxyCommand through the environment, never
	// on a command line.
	ssh.Env = append(os.Environ(), "SANDBOX_API_TOKEN="+c.cf.token)
	// Ctrl-C belongs to ssh (and the shell); we wait and clean up.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	if err := ssh.Start(); err != nil {
		return 0, fmt.Errorf("start ssh: %w", err)
	}
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			select {
			case sig := <-sigs:
				if sig != os.Interrupt { // the terminal already sent SIGINT to ssh
					_ = ssh.Process.Signal(sig)
				}
			case <-done:
				return
			}
		}
	}()
	err = ssh.Wait()
	var xe *exec.ExitError
	if errors.As(err, &xe) {
		return xe.ExitCode(), nil
	}
	return 0, err
}
