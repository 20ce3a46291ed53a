package main

import (
	"context"
	"encoding/json"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/gwtest"
)

// cliRun runs the built binary as a client of g, with a fresh HOME, and
// returns its stdout, stderr and exit status.
func (g *gatewayProc) cliRun(t *testing.T, stdin string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(sandgateBin, args...)
	cmd.Env = append(cleanEnv(), "SANDBOX_API_URL="+g.URL, "SANDBOX_API_TOKEN="+g.Token, "HOME="+t.TempDir())
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

// mustCLI is cliRun that fails the test unless the exit status is 0.
func (g *gatewayProc) mustCLI(t *testing.T, args ...string) string {
	t.Helper()
	out, errOut, code := g.cliRun(t, "", args...)
	if code != 0 {
		t.Fatalf("sandgate %s: exit %d: %s%s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

// The session commands end to end against a real gateway: create, ls,
// get, exec (the exit status passes through), cp both ways recursively,
// logs, stop, rm.
func TestSessionCLI(t *testing.T) {
	g := startGateway(t)

	var s struct {
		SessionID string `json:"sessionId"`
		Name      string `json:"name"`
		TTL       int    `json:"ttl"`
		SSH       struct {
			Password string `json:"password"`
		} `json:"ssh"`
	}
	out := g.mustCLI(t, "session", "create", "--name", "dev", "--ttl", "30m", "--json")
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatalf("create --json is not the API's JSON alone: %v\n%s", err, out)
	}
	if !strings.HasPrefix(s.SessionID, "sbx-") || s.Name != "dev" || s.TTL != 1800 || s.SSH.Password == "" {
		t.Fatalf("create --json: %+v", s)
	}
	id := s.SessionID

	// ls: a table with the full id and the name; --json an array.
	out = g.mustCLI(t, "session", "ls")
	if !strings.HasPrefix(out, "ID ") || !strings.Contains(out, id+"  dev ") {
		t.Errorf("session ls:\n%s", out)
	}
	var list []map[string]any
	if err := json.Unmarshal([]byte(g.mustCLI(t, "session", "ls", "--json")), &list); err != nil || len(list) != 1 || list[0]["sessionId"] != id {
		t.Errorf("session ls --json: %v %v", list, err)
	}
	out = g.mustCLI(t, "session", "get", id)
	if !strings.Contains(out, "ID:") || !strings.Contains(out, id) || !strings.Contains(out, "running") {
		t.Errorf("session get:\n%s", out)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(g.mustCLI(t, "session", "get", id, "--json")), &got); err != nil || got["sessionId"] != id {
		t.Errorf("session get --json: %v %v", got, err)
	}

	// exec: output streams, the exit status passes through, arguments
	// arrive as they are, stdin is passed on.
	out, errOut, code := g.cliRun(t, "", "session", "exec", id, "--", "sh", "-c", "echo out; echo err >&2; exit 7")
	if code != 7 || out != "out\n" || errOut != "err\n" {
		t.Errorf("exec exit 7: code %d stdout %q stderr %q", code, out, errOut)
	}
	out, _, code = g.cliRun(t, "", "session", "exec", id, "printf", "[%s]", "a b", "$HOME", "-n")
	if code != 0 || out != "[a b][$HOME][-n]" {
		t.Errorf("exec argv: code %d %q", code, out)
	}
	out, _, code = g.cliRun(t, "piped in\n", "session", "exec", id, "--", "cat")
	if code != 0 || out != "piped in\n" {
		t.Errorf("exec stdin: code %d %q", code, out)
	}

	// cp: a local tree into the session and back out.
	src := filepath.Join(t.TempDir(), "tree")
	for p, body := range map[string]string{"a.txt": "alpha\n", "sub/b.txt": "beta\n", "sub/deeper/c.bin": "\x00\x01gamma"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(src, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, p), []byte(body), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	g.mustCLI(t, "session", "cp", src, id+":")
	out = g.mustCLI(t, "session", "exec", id, "--", "sh", "-c", "cat tree/a.txt tree/sub/b.txt; stat -c %a tree/a.txt")
	if out != "alpha\nbeta\n640\n" {
		t.Errorf("after cp in: %q", out)
	}
	dst := t.TempDir()
	g.mustCLI(t, "session", "cp", id+":tree", dst)
	for p, body := range map[string]string{"a.txt": "alpha\n", "sub/b.txt": "beta\n", "sub/deeper/c.bin": "\x00\x01gamma"} {
		b, err := os.ReadFile(filepath.Join(dst, "tree", p))
		if err != nil || string(b) != body {
			t.Errorf("cp out %s: %q %v", p, b, err)
		}
	}
	// A file to a new name.
	g.mustCLI(t, "session", "cp", id+":tree/a.txt", filepath.Join(dst, "renamed"))
	if b, _ := os.ReadFile(filepath.Join(dst, "renamed")); string(b) != "alpha\n" {
		t.Errorf("cp to a new name: %q", b)
	}
	if _, errOut, code := g.cliRun(t, "", "session", "cp", id+":no-such-file", dst); code != 1 || !strings.Contains(errOut, "no-such-file") {
		t.Errorf("cp of a missing file: exit %d %q", code, errOut)
	}

	// logs show the commands run.
	if out := g.mustCLI(t, "session", "logs", id); !strings.Contains(out, "exit=7") {
		t.Errorf("session logs:\n%s", out)
	}

	// stop keeps the files; the next exec starts the session again.
	if out := g.mustCLI(t, "session", "stop", id); !strings.Contains(out, "stopped") {
		t.Errorf("session stop:\n%s", out)
	}
	if out := g.mustCLI(t, "session", "exec", id, "cat", "tree/a.txt"); out != "alpha\n" {
		t.Errorf("exec after stop: %q", out)
	}

	if out := g.mustCLI(t, "session", "rm", id); strings.TrimSpace(out) != id {
		t.Errorf("session rm: %q", out)
	}
	if _, errOut, code := g.cliRun(t, "", "session", "get", id); code != 1 || !strings.Contains(errOut, "gone") {
		t.Errorf("get after rm: exit %d %q", code, errOut)
	}
	if out := g.mustCLI(t, "session", "ls"); strings.Contains(out, id) {
		t.Errorf("ls after rm:\n%s", out)
	}
	if out := g.mustCLI(t, "session", "ls", "--json"); strings.TrimSpace(out) != "[]" {
		t.Errorf("ls --json with no sessions: %q", out)
	}
}

// Exit codes and help: 0 ok and for -h, 1 error, 2 usage, the usage
// error first and then one line pointing at --help; the older commands
// keep their own parsing; completion scripts are generated.
func TestCLIConventions(t *testing.T) {
	g := startGateway(t)
	for _, args := range [][]string{
		{"--help"}, {"-h"}, {"session", "-h"}, {"session", "create", "--help"}, {"ssh", "-h"},
		{"session", "exec", "--help"}, {"help", "session"},
	} {
		out, errOut, code := g.cliRun(t, "", args...)
		if code != 0 || !strings.Contains(out, "Usage:") || errOut != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", args, code, out, errOut)
		}
	}
	if out, _, _ := g.cliRun(t, "", "session", "create", "--help"); !strings.Contains(out, "--api-url") || !strings.Contains(out, "SANDBOX_API_URL") || !strings.Contains(out, "SANDBOX_API_TOKEN") {
		t.Errorf("session create --help names neither the flags with two dashes nor the env twins:\n%s", out)
	}
	for _, args := range [][]string{
		{"session", "create", "--bogus"}, {"session", "get"}, {"session", "get", "a", "b"},
		{"frobnicate"}, {"session", "create", "--ttl", "soon"}, {"session", "cp", "a", "b"},
		{"session", "exec", "sbx-x"}, {},
	} {
		out, errOut, code := g.cliRun(t, "", args...)
		if code != 2 || out != "" {
			t.Errorf("%v: exit %d (want 2), stdout %q", args, code, out)
			continue
		}
		if len(args) == 0 {
			continue // the help, on stderr
		}
		lines := strings.Split(strings.TrimSpace(errOut), "\n")
		if len(lines) != 2 || !strings.HasPrefix(lines[0], "sandgate") || !strings.HasSuffix(lines[1], "--help' for usage.") {
			t.Errorf("%v: want the error then one --help line, got %q", args, errOut)
		}
	}
	// An error from the gateway is 1.
	if _, errOut, code := g.cliRun(t, "", "session", "get", "sbx-nosuchsession"); code != 1 || !strings.Contains(errOut, "not found") {
		t.Errorf("get missing: exit %d %q", code, errOut)
	}
	// The older commands keep their syntax: proxy's own usage line.
	if _, errOut, code := g.cliRun(t, "", "proxy", "--api-url", g.URL); code != 2 || !strings.Contains(errOut, "usage: sandgate proxy") {
		t.Errorf("proxy without a session: exit %d %q", code, errOut)
	}
	if out, _, code := g.cliRun(t, "", "version"); code != 0 || !strings.HasPrefix(out, "sandgate ") {
		t.Errorf("version: %d %q", code, out)
	}
	for _, sh := range []string{"bash", "zsh", "fish"} {
		out, _, code := g.cliRun(t, "", "completion", sh)
		if code != 0 || !strings.Contains(out, "sandgate") || len(out) < 1000 {
			t.Errorf("completion %s: exit %d, %d bytes", sh, code, len(out))
		}
	}
	// Completion knows the subcommands, and the caller's sessions.
	if out, _, _ := g.cliRun(t, "", "__complete", "session", ""); !strings.Contains(out, "create") || !strings.Contains(out, "exec") {
		t.Errorf("__complete session: %q", out)
	}
	var s sessionJSON
	if code := g.api(t, "POST", "/v1/sessions", map[string]any{"name": "completed"}, &s); code != 201 {
		t.Fatalf("create: %d", code)
	}
	for _, args := range [][]string{{"session", "get", ""}, {"ssh", ""}, {"session", "exec", ""}} {
		out, _, _ := g.cliRun(t, "", append([]string{"__complete"}, args...)...)
		if !strings.Contains(out, s.SessionID) || !strings.Contains(out, "completed") {
			t.Errorf("__complete %v: %q", args, out)
		}
	}
	if out, _, _ := g.cliRun(t, "", "__complete", "session", "get", "comp"); !strings.Contains(out, "completed") || strings.Contains(out, s.SessionID) {
		t.Errorf("__complete session get comp: %q", out)
	}
}

// `sandgate ssh` with OpenSSH: without a session it creates one, runs the
// shell (here a command) and deletes the session at the end; --keep keeps
// it; with a session it connects to it; ssh's exit status passes through.
func TestSSHCommandOpenSSH(t *testing.T) {
	gwtest.RequireTool(t, "ssh")
	g := startGateway(t)

	out, errOut, code := g.cliRun(t, "", "ssh", "--", "echo hello; exit 3")
	if code != 3 || out != "hello\n" {
		t.Fatalf("sandgate ssh -- cmd: exit %d stdout %q stderr %q", code, out, errOut)
	}
	if out := g.mustCLI(t, "session", "ls", "--json"); strings.TrimSpace(out) != "[]" {
		t.Errorf("the session sandgate ssh created is still there: %s", out)
	}

	_, errOut, code = g.cliRun(t, "", "ssh", "--keep", "--name", "kept", "--", "true")
	if code != 0 {
		t.Fatalf("ssh --keep: exit %d %s", code, errOut)
	}
	var list []struct {
		SessionID string `json:"sessionId"`
		Name      string `json:"name"`
	}
	if err := json.Unmarshal([]byte(g.mustCLI(t, "session", "ls", "--json")), &list); err != nil || len(list) != 1 || list[0].Name != "kept" {
		t.Fatalf("after ssh --keep: %v %v", list, err)
	}
	out, errOut, code = g.cliRun(t, "", "ssh", list[0].SessionID, "--", "-T", "echo again")
	if code != 0 || out != "again\n" {
		t.Errorf("ssh ID -- -T cmd: exit %d %q %q", code, out, errOut)
	}
	if _, errOut, code := g.cliRun(t, "", "ssh", "sbx-nosuchsession"); code != 1 || !strings.Contains(errOut, "not found") {
		t.Errorf("ssh to a missing session: exit %d %q", code, errOut)
	}
	// --discard passes the API's ?discard=true (a session with no named
	// workspace has nothing to save: it just ends).
	g.mustCLI(t, "session", "rm", "--discard", list[0].SessionID)
	if _, errOut, code := g.cliRun(t, "", "session", "get", list[0].SessionID); code != 1 || !strings.Contains(errOut, "gone") && !strings.Contains(errOut, "not found") {
		t.Errorf("get after rm --discard: exit %d %q", code, errOut)
	}
}

// The older commands keep their flags and syntax but follow the
// conventions: -h on stdout with two dashes (never the token's value,
// even from the environment), exit 0; a bad flag: the error, then one
// line pointing at --help, exit 2.
func TestOlderCommandsHelp(t *testing.T) {
	env := append(cleanEnv(), "SANDBOX_API_TOKEN=secret-token-canary")
	for _, name := range []string{"proxy", "ssh-config", "mcp"} {
		out, errOut, code := runClient(t, env, nil, sandgateBin, name, "-h")
		if code != 0 || !strings.Contains(out, "--api-url") || !strings.Contains(out, "SANDBOX_API_TOKEN") || errOut != "" {
			t.Errorf("%s -h: exit %d stdout %q stderr %q", name, code, out, errOut)
		}
		if strings.Contains(out, "secret-token-canary") {
			t.Errorf("%s -h shows the token", name)
		}
		if regexp.MustCompile(`\n  -[a-z]`).MatchString(out) {
			t.Errorf("%s -h: a flag with one dash:\n%s", name, out)
		}
		_, errOut, code = runClient(t, env, nil, sandgateBin, name, "--bogus")
		lines := strings.Split(strings.TrimSpace(errOut), "\n")
		if code != 2 || len(lines) != 2 || !strings.Contains(lines[0], "bogus") || !strings.HasSuffix(lines[1], "--help' for usage.") {
			t.Errorf("%s --bogus: exit %d %q", name, code, errOut)
		}
	}
}

// session logs -f prints what happens after it started, until Ctrl-C
// (exit 0), and ends by itself when the session does.
func TestSessionLogsFollow(t *testing.T) {
	g := startGateway(t)
	id := g.createSession(t).SessionID
	follow := func() (*exec.Cmd, *gwtest.Buffer) {
		cmd := exec.Command(sandgateBin, "session", "logs", "-f", id)
		cmd.Env = g.clientEnv()
		out := &gwtest.Buffer{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill() }) // when the test failed before Wait
		return cmd, out
	}
	waitFor := func(out *gwtest.Buffer, s string) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for !strings.Contains(out.String(), s) {
			if time.Now().After(deadline) {
				t.Fatalf("no %q in logs -f's output:\n%s", s, out.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	cmd, out := follow()
	waitFor(out, "== commands")
	if _, _, code := g.cliRun(t, "", "session", "exec", id, "--", "sh", "-c", "echo followed; exit 3"); code != 3 {
		t.Fatalf("exec: exit %d", code)
	}
	waitFor(out, "exit=3")
	_ = cmd.Process.Signal(os.Interrupt)
	if err := cmd.Wait(); err != nil {
		t.Errorf("logs -f after Ctrl-C: %v\n%s", err, out.String())
	}

	cmd, out = follow()
	waitFor(out, "exit=3")
	g.mustCLI(t, "session", "rm", id)
	waitFor(out, "the session has ended")
	if err := cmd.Wait(); err != nil {
		t.Errorf("logs -f after the session ended: %v", err)
	}
}

// evilListing is a side whose directory listing holds the names a
// hostile SFTP server could send; everything else is a local directory.
type evilListing struct {
	localFS
	name string
}

func (e evilListing) Stat(string) (fs.FileInfo, error) { return os.Stat(".") }
func (e evilListing) ReadDir(string) ([]fs.FileInfo, error) {
	fi, err := os.Stat(".")
	if err != nil {
		return nil, err
	}
	return []fs.FileInfo{renamedInfo{fi, e.name}}, nil
}

type renamedInfo struct {
	fs.FileInfo
	name string
}

func (r renamedInfo) Name() string { return r.name }

// TestSessionCpRefusesListingNames: session cp refuses an entry of a
// remote listing that is not one file name ("..", ".", "a/b"), and
// creates nothing outside the destination.
func TestSessionCpRefusesListingNames(t *testing.T) {
	for _, name := range []string{"..", ".", "../escape", "a/b", ""} {
		dst := filepath.Join(t.TempDir(), "dst")
		err := copyTree(context.Background(), io.Discard, evilListing{name: name}, "/remote/dir", localFS{}, dst)
		if err == nil || !strings.Contains(err.Error(), "not a file name") {
			t.Errorf("entry %q: %v, want a refusal", name, err)
		}
		if _, err := os.Stat(filepath.Join(filepath.Dir(dst), "escape")); err == nil {
			t.Errorf("entry %q: created a directory outside the destination", name)
		}
	}
}
