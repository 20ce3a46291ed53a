package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	gossh "golang.org/x/crypto/ssh"
)

// newSessionCmd is `sandgate session …`: create, list, inspect, stop and
// delete sessions, run commands in them and copy files in and out, all
// through the gateway's REST API and its CONNECT tunnel.
func newSessionCmd() *cobra.Command {
	var af apiFlags
	cmd := &cobra.Command{
		Use:     "session COMMAND",
		Aliases: []string{"sessions"},
		Short:   "create, list, inspect, stop and delete sessions; exec, cp, logs",
		Long: `Manage sessions through the gateway's REST API.

A session is named by its id (sbx-...) or by the name given at create;
an id always wins. The gateway's URL and token come from SANDBOX_API_URL
and SANDBOX_API_TOKEN, or --api-url and --token.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return usageErrorf("missing command (create, ls, get, rm, stop, exec, cp, logs)")
		},
	}
	af.register(cmd)
	cmd.AddCommand(newSessionCreateCmd(&af), newSessionLsCmd(&af), newSessionGetCmd(&af),
		newSessionRmCmd(&af), newSessionStopCmd(&af), newSessionPauseCmd(&af), newSessionResumeCmd(&af), newSessionExecCmd(&af),
		newSessionCpCmd(&af), newSessionLogsCmd(&af))
	return cmd
}

// createOpts are the flags that shape a new session (session create, ssh).
type createOpts struct {
	name, image, ttl, memory, workspace string
	egress, secrets                     []string
	cpus                                float64
}

func (o *createOpts) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringVar(&o.name, "name", "", "a name for the session, unique among your live sessions")
	fs.StringVar(&o.image, "image", "", "root filesystem: default (the gateway's own) or an OCI image reference")
	fs.StringVar(&o.ttl, "ttl", "", "lifetime: seconds or a duration such as 90m or 2h (default: the gateway's, 1h)")
	fs.StringArrayVar(&o.egress, "egress", nil, "a destination the session may reach: host, *.domain or IP, optional :port (repeatable)")
	fs.StringArrayVar(&o.secrets, "secret", nil, "an operator secret to set as an environment variable, by name (repeatable)")
	fs.StringVar(&o.memory, "memory", "", "memory limit: MiB, or with a unit such as 512M or 2G")
	fs.Float64Var(&o.cpus, "cpus", 0, "CPU limit in cores (may be fractional)")
	fs.StringVar(&o.workspace, "workspace", "", "a named workspace to mount at /workspace")
}

// body is the create request (POST /v1/sessions).
func (o *createOpts) body() (map[string]any, error) {
	b := map[string]any{}
	if o.name != "" {
		b["name"] = o.name
	}
	if o.image != "" {
		b["image"] = o.image
	}
	if o.workspace != "" {
		b["workspace"] = o.workspace
	}
	if o.ttl != "" {
		secs, err := parseSeconds(o.ttl)
		if err != nil {
			return nil, usageErrorf("--ttl %q: %v", o.ttl, err)
		}
		b["ttl"] = secs
	}
	if len(o.egress) > 0 {
		b["egress"] = o.egress
	}
	if len(o.secrets) > 0 {
		b["secrets"] = o.secrets
	}
	res := map[string]any{}
	if o.memory != "" {
		mib, err := parseMiB(o.memory)
		if err != nil {
			return nil, usageErrorf("--memory %q: %v", o.memory, err)
		}
		res["memoryMiB"] = mib
	}
	if o.cpus != 0 {
		res["cpus"] = o.cpus
	}
	if len(res) > 0 {
		b["resources"] = res
	}
	return b, nil
}

// parseSeconds reads whole seconds ("3600") or a Go duration ("90m").
func parseSeconds(s string) (int, error) {
	if n, err := strconv.Atoi(s); err == nil {
		return n, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, errors.New("want seconds or a duration such as 90m or 2h")
	}
	return int(d / time.Second), nil
}

// parseMiB reads MiB ("512"), or a size with a unit: K, M, G (binary).
func parseMiB(s string) (int, error) {
	t := strings.TrimSuffix(strings.TrimSuffix(strings.ToUpper(s), "B"), "I")
	mult := 1.0
	switch {
	case strings.HasSuffix(t, "K"):
		mult, t = 1.0/1024, strings.TrimSuffix(t, "K")
	case strings.HasSuffix(t, "M"):
		t = strings.TrimSuffix(t, "M")
	case strings.HasSuffix(t, "G"):
		mult, t = 1024, strings.TrimSuffix(t, "G")
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f <= 0 {
		return 0, errors.New("want MiB, or a size such as 512M or 2G")
	}
	return int(f * mult), nil
}

func (c *apiClient) createSession(ctx context.Context, o *createOpts) (*session, []byte, error) {
	body, err := o.body()
	if err != nil {
		return nil, nil, err
	}
	raw, err := c.do(ctx, http.MethodPost, "/v1/sessions", body)
	if err != nil {
		return nil, nil, err
	}
	var s session
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, nil, fmt.Errorf("decode session: %w", err)
	}
	return &s, raw, nil
}

func newSessionCreateCmd(af *apiFlags) *cobra.Command {
	var o createOpts
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "create [flags]",
		Short: "create a session and print it",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			s, raw, err := c.createSession(cmd.Context(), &o)
			if err != nil {
				return err
			}
			if asJSON {
				return printRaw(cmd.OutOrStdout(), raw)
			}
			printSession(cmd.OutOrStdout(), s)
			fmt.Fprintf(cmd.OutOrStdout(), "\nShell: sandgate ssh %s\n", s.SessionID)
			return nil
		},
	}
	o.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the REST API's JSON answer (with the SSH password) alone")
	return cmd
}

func newSessionLsCmd(af *apiFlags) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "list your sessions, oldest first",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			var all []json.RawMessage
			for offset := 0; ; {
				raw, err := c.do(cmd.Context(), http.MethodGet, fmt.Sprintf("/v1/sessions?limit=100&offset=%d", offset), nil)
				if err != nil {
					return err
				}
				var page struct {
					Sessions []json.RawMessage `json:"sessions"`
					Total    int               `json:"total"`
				}
				if err := json.Unmarshal(raw, &page); err != nil {
					return fmt.Errorf("decode session list: %w", err)
				}
				all = append(all, page.Sessions...)
				offset += len(page.Sessions)
				if len(page.Sessions) == 0 || offset >= page.Total {
					break
				}
			}
			out := cmd.OutOrStdout()
			if asJSON {
				// The API's Session objects as they came, in one array.
				parts := make([][]byte, len(all))
				for i, r := range all {
					parts[i] = r
				}
				return printRaw(out, append(append([]byte("["), bytes.Join(parts, []byte(","))...), ']'))
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tSTATUS\tIMAGE\tCREATED\tEXPIRES")
			for _, r := range all {
				var s session
				if err := json.Unmarshal(r, &s); err != nil {
					return fmt.Errorf("decode session: %w", err)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.SessionID, dash(s.Name), s.Status, s.Image, ago(s.CreatedAt), until(s.ExpiresAt))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the sessions as a JSON array of the REST API's Session objects")
	return cmd
}

func newSessionGetCmd(af *apiFlags) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:               "get ID|NAME",
		Short:             "show one session",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeSessions(af, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			s, raw, err := c.getSession(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printRaw(cmd.OutOrStdout(), raw)
			}
			printSession(cmd.OutOrStdout(), s)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the REST API's JSON answer alone")
	return cmd
}

func newSessionRmCmd(af *apiFlags) *cobra.Command {
	var removeWorkspace, discard bool
	cmd := &cobra.Command{
		Use:               "rm ID|NAME...",
		Aliases:           []string{"delete"},
		Short:             "delete sessions: their processes end and their files go",
		Args:              cobra.MinimumNArgs(1),
		ValidArgsFunction: completeSessions(af, 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			q := url.Values{}
			if removeWorkspace {
				q.Set("keepWorkspace", "false")
			}
			if discard {
				q.Set("discard", "true")
			}
			failed := 0
			for _, ref := range args {
				if _, err := c.do(cmd.Context(), http.MethodDelete, sessPath(ref)+query(q), nil); err != nil {
					fmt.Fprintf(cmd.ErrOrStderr(), "%s: %s: %v\n", cmd.CommandPath(), ref, err)
					failed++
					continue
				}
				fmt.Fprintln(cmd.OutOrStdout(), ref)
			}
			if failed > 0 {
				return &exitError{1}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&removeWorkspace, "remove-workspace", false, "also remove the session's named workspace")
	cmd.Flags().BoolVar(&discard, "discard", false, "end the session without saving its named workspace (it keeps its last saved version); without it, a workspace that cannot be saved keeps the session (workspace_sync_failed)")
	return cmd
}

func newSessionStopCmd(af *apiFlags) *cobra.Command {
	return sessionPostCmd(af, "stop", "stop a session's processes, keeping its files (the next use starts it again)")
}

// sessionPostCmd is a session command that POSTs to /v1/sessions/{id}/op
// and prints the session it answers.
func sessionPostCmd(af *apiFlags, op, short string) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:               op + " ID|NAME",
		Short:             short,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeSessions(af, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			raw, err := c.do(cmd.Context(), http.MethodPost, sessPath(args[0])+"/"+op, nil)
			if err != nil {
				return err
			}
			if asJSON {
				return printRaw(cmd.OutOrStdout(), raw)
			}
			var s session
			if err := json.Unmarshal(raw, &s); err != nil {
				return fmt.Errorf("decode session: %w", err)
			}
			printSession(cmd.OutOrStdout(), &s)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the REST API's JSON answer alone")
	return cmd
}

func newSessionExecCmd(af *apiFlags) *cobra.Command {
	var tty bool
	cmd := &cobra.Command{
		Use:   "exec ID|NAME -- COMMAND [ARG...]",
		Short: "run a command in a session; its exit status is sandgate's",
		Long: `Run a command in a session over SSH (through the gateway's tunnel),
streaming its output, and exit with its exit status.

The words after -- are the command and its arguments, passed as they are
(no shell parses them); for shell syntax run one: -- sh -c 'ls | wc -l'.
Standard input is passed on when it is not a terminal.`,
		Args:              cobra.MinimumNArgs(2),
		ValidArgsFunction: completeSessions(af, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			// Flags stop at the session (SetInterspersed below), so the
			// command's own flags need no --; a -- after the session goes.
			argv := args[1:]
			if argv[0] == "--" {
				argv = argv[1:]
			}
			if len(argv) == 0 {
				return usageErrorf("no command after the session")
			}
			c, err := af.client()
			if err != nil {
				return err
			}
			return runExec(cmd, c, args[0], argv, tty)
		},
	}
	cmd.Flags().BoolVarP(&tty, "tty", "t", false, "allocate a terminal for the command")
	cmd.Flags().SetInterspersed(false)
	return cmd
}

// shellQuote quotes argv for the session's shell, so that it runs the
// words as they are.
func shellQuote(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		if a != "" && strings.IndexFunc(a, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./=:,+@%", r))
		}) < 0 {
			q[i] = a
			continue
		}
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}

var signalNumbers = map[string]int{"HUP": 1, "INT": 2, "QUIT": 3, "ILL": 4, "ABRT": 6, "FPE": 8, "KILL": 9, "SEGV": 11, "PIPE": 13, "ALRM": 14, "TERM": 15}

func runExec(cmd *cobra.Command, c *apiClient, ref string, argv []string, tty bool) error {
	ctx := cmd.Context()
	s, _, err := c.getSession(ctx, ref)
	if err != nil {
		return err
	}
	client, err := c.sshClient(ctx, s)
	if err != nil {
		return err
	}
	defer client.Close()
	ss, err := client.NewSession()
	if err != nil {
		return fmt.Errorf("open a channel: %w", err)
	}
	defer ss.Close()
	ss.Stdout, ss.Stderr = cmd.OutOrStdout(), cmd.ErrOrStderr()
	if f, ok := cmd.InOrStdin().(*os.File); !ok || !isTerminal(f) {
		ss.Stdin = cmd.InOrStdin()
	}
	if tty {
		if err := ss.RequestPty(envOr("TERM", "xterm"), 24, 80, gossh.TerminalModes{}); err != nil {
			return fmt.Errorf("request a terminal: %w", err)
		}
	}
	// Ctrl-C goes to the command, not to us.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		for sig := range sigs {
			name := "INT"
			if sig == syscall.SIGTERM {
				name = "TERM"
			}
			_ = ss.Signal(gossh.Signal(name))
		}
	}()
	err = ss.Run(shellQuote(argv))
	var xe *gossh.ExitError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &xe):
		if sig := xe.Signal(); sig != "" {
			fmt.Fprintf(cmd.ErrOrStderr(), "%s: the command was killed by signal %s\n", cmd.CommandPath(), sig)
			if n, ok := signalNumbers[sig]; ok {
				return &exitError{128 + n}
			}
			return &exitError{255}
		}
		return &exitError{xe.ExitStatus()}
	default:
		return fmt.Errorf("the command's status is unknown: %w", err)
	}
}

func newSessionLogsCmd(af *apiFlags) *cobra.Command {
	var follow bool
	var tail int
	cmd := &cobra.Command{
		Use:               "logs ID|NAME",
		Short:             "print a session's recent commands and process output",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeSessions(af, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			if tail < 1 || tail > 10000 {
				return usageErrorf("--tail %d: want 1 to 10000", tail)
			}
			path := fmt.Sprintf("%s/logs?tail=%d", sessPath(args[0]), tail)
			out := cmd.OutOrStdout()
			text, err := c.do(cmd.Context(), http.MethodGet, path, nil)
			if err != nil {
				return err
			}
			if _, err := out.Write(text); err != nil {
				return err
			}
			if !follow {
				return nil
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			seen := lineCounts(text)
			for {
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(time.Second):
				}
				text, err := c.do(ctx, http.MethodGet, path, nil)
				if ctx.Err() != nil {
					return nil
				}
				if isStatus(err, http.StatusNotFound) || isStatus(err, http.StatusGone) {
					fmt.Fprintf(cmd.ErrOrStderr(), "%s: the session has ended\n", cmd.CommandPath())
					return nil
				}
				if err != nil {
					return err
				}
				// The answer is a snapshot: print the lines it has more
				// of than the last one printed.
				now := lineCounts(text)
				for _, l := range bytes.SplitAfter(text, []byte("\n")) {
					k := string(l)
					if k == "" {
						continue
					}
					if seen[k] > 0 {
						seen[k]--
						continue
					}
					if _, err := io.WriteString(out, k); err != nil {
						return err
					}
				}
				seen = now
			}
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new output until the session ends or Ctrl-C")
	cmd.Flags().IntVar(&tail, "tail", 100, "at most this many commands, and lines of each process's output")
	return cmd
}

func lineCounts(text []byte) map[string]int {
	m := map[string]int{}
	for _, l := range bytes.SplitAfter(text, []byte("\n")) {
		if len(l) > 0 {
			m[string(l)]++
		}
	}
	return m
}

// printRaw writes the API's JSON as it came, ending in a newline.
func printRaw(w io.Writer, raw []byte) error {
	raw = bytes.TrimRight(raw, "\n")
	_, err := fmt.Fprintf(w, "%s\n", raw)
	return err
}

// printSession shows one session for people.
func printSession(w io.Writer, s *session) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "ID:\t%s\n", s.SessionID)
	fmt.Fprintf(tw, "Name:\t%s\n", dash(s.Name))
	status := s.Status
	if s.StatusReason != "" {
		status += " (" + s.StatusReason + ")"
	}
	fmt.Fprintf(tw, "Status:\t%s\n", status)
	fmt.Fprintf(tw, "Image:\t%s\n", s.Image)
	if s.Workspace != "" {
		fmt.Fprintf(tw, "Workspace:\t%s\n", s.Workspace)
	}
	if len(s.Resources) > 0 {
		var parts []string
		for _, k := range []string{"memoryMiB", "cpus", "pids", "diskMiB"} {
			if v, ok := s.Resources[k]; ok {
				parts = append(parts, fmt.Sprintf("%s=%v", k, v))
			}
		}
		if len(parts) > 0 {
			fmt.Fprintf(tw, "Resources:\t%s\n", strings.Join(parts, " "))
		}
	}
	if s.Isolation != "" {
		fmt.Fprintf(tw, "Isolation:\t%s\n", s.Isolation)
	}
	if len(s.Unenforced) > 0 {
		fmt.Fprintf(tw, "Not enforced:\t%s\n", strings.Join(s.Unenforced, " "))
	}
	egress := "none"
	if len(s.Egress.Allow) > 0 {
		egress = strings.Join(s.Egress.Allow, " ")
	}
	fmt.Fprintf(tw, "Egress:\t%s\n", egress)
	fmt.Fprintf(tw, "Created:\t%s\n", s.CreatedAt)
	fmt.Fprintf(tw, "Expires:\t%s (%s)\n", s.ExpiresAt, until(s.ExpiresAt))
	if s.SSH.Password != "" {
		fmt.Fprintf(tw, "SSH password:\t%s\n", s.SSH.Password)
	}
	_ = tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func ago(ts string) string {
	t, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil {
		return ts
	}
	return time.Since(t).Round(time.Second).String() + " ago"
}

func until(ts string) string {
	t, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil {
		return ts
	}
	d := time.Until(t).Round(time.Second)
	if d <= 0 {
		return "now"
	}
	return "in " + d.String()
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// isTerminal reports whether f is a character device (a terminal).
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// completeSessions completes a session argument with the caller's
// session ids and names (shell completion asks the gateway).
func completeSessions(af *apiFlags, max int) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if max > 0 && len(args) >= max {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		c, err := af.client()
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), 5*time.Second)
		defer cancel()
		raw, err := c.do(ctx, http.MethodGet, "/v1/sessions?limit=100", nil)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var page struct {
			Sessions []session `json:"sessions"`
		}
		if json.Unmarshal(raw, &page) != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var out []cobra.Completion
		for _, s := range page.Sessions {
			for _, v := range []string{s.SessionID, s.Name} {
				if v != "" && strings.HasPrefix(v, toComplete) {
					out = append(out, cobra.CompletionWithDesc(v, s.Status+" "+s.Image))
				}
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}

// query is "?" and q encoded, or "" when q is empty.
func query(q url.Values) string {
	if len(q) == 0 {
		return ""
	}
	return "?" + q.Encode()
}
