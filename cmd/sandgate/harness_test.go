package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sandgate/sandgate/internal/gwtest"
)

// sandgateBin is the binary under test: $SANDGATE_BIN, or one built for
// this test run.
var sandgateBin string

func TestMain(m *testing.M) {
	code := func() int {
		if b := os.Getenv("SANDGATE_BIN"); b != "" {
			sandgateBin = b
		} else {
			dir, err := os.MkdirTemp("", "sandgate-bin-")
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			defer os.RemoveAll(dir)
			sandgateBin = filepath.Join(dir, "sandgate")
			// Static, as the Makefile builds it: an image sandbox runs the
			// binary (its SFTP server) on a root with no host libraries.
			build := exec.Command("go", "build", "-o", sandgateBin, ".")
			build.Env = append(os.Environ(), "CGO_ENABLED=0")
			out, err := build.CombinedOutput()
			if err != nil {
				fmt.Fprintf(os.Stderr, "build sandgate: %v\n%s", err, out)
				return 1
			}
		}
		code := m.Run()
		if code == 0 {
			if err := goleak.Find(); err != nil {
				fmt.Fprintln(os.Stderr, "goleak:", err)
				return 1
			}
		}
		return code
	}()
	os.Exit(code)
}

// gatewayProc is a `sandgate serve` process.
type gatewayProc struct {
	URL     string
	Token   string
	DataDir string
	cmd     *exec.Cmd
	stdout  *gwtest.Buffer
	stderr  *gwtest.Buffer
	done    <-chan struct{}
}

// startGateway runs `sandgate serve` on a free loopback port with a fresh
// data dir and API key "test-token" (unless args set their own).
func startGateway(t *testing.T, args ...string) *gatewayProc {
	t.Helper()
	g := &gatewayProc{DataDir: t.TempDir(), Token: "test-token"}
	full := append([]string{"serve", "--listen", "127.0.0.1:0", "--data-dir", g.DataDir, "--sandbox", "workdir", "--keep-sandboxes-on-exit=false"}, args...)
	hasKey := false
	for _, a := range args {
		if a == "--api-key" || strings.HasPrefix(a, "--api-key=") {
			hasKey = true
		}
	}
	if !hasKey {
		full = append(full, "--api-key", g.Token)
	}
	g.start(t, full)
	return g
}

// start runs sandgate with args (the serve subcommand and its flags) and
// stops it cleanly when the test ends.
func (g *gatewayProc) start(t *testing.T, args []string) {
	t.Helper()
	// Tests count sandboxes and time creates, and look for what a DELETE
	// released once it answers: no warm pool and no background teardown
	// unless asked (warmpool_test.go, teardown_test.go).
	if len(args) > 0 && args[0] == "serve" {
		for _, f := range []string{"--warm-pool", "--teardown-queue"} {
			if !slices.ContainsFunc(args, func(a string) bool { return a == f || strings.HasPrefix(a, f+"=") }) {
				args = append(slices.Clone(args), f+"=0")
			}
		}
	}
	b := gwtest.StartBinary(t, sandgateBin, args...)
	g.URL, g.cmd, g.stdout, g.stderr, g.done = b.URL, b.Cmd, b.Stdout, b.Stderr, b.Done
	t.Cleanup(func() { g.stop(t) })
}

// cleanEnv is the environment for child processes: the test's own, minus
// anything that would point clients elsewhere.
func cleanEnv() []string { return gwtest.CleanEnv() }

// stop sends SIGTERM and waits for a clean exit.
func (g *gatewayProc) stop(t *testing.T) {
	t.Helper()
	select {
	case <-g.done:
		return
	default:
	}
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-g.done:
	case <-time.After(30 * time.Second):
		_ = g.cmd.Process.Kill()
		<-g.done
		t.Errorf("sandgate serve ignored SIGTERM for 30s")
	}
	if code := g.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("sandgate serve exited %d: %s", code, g.stderr.String())
	}
	g.assertNoLeftovers(t)
}

// assertNoLeftovers checks that no process of any session the gateway
// created runs, and that no session workdir is left.
func (g *gatewayProc) assertNoLeftovers(t *testing.T) {
	t.Helper()
	for _, sub := range []string{"sessions", "sandboxes"} { // workdir, linux
		entries, _ := os.ReadDir(filepath.Join(g.DataDir, sub))
		for _, e := range entries {
			if !strings.HasPrefix(e.Name(), ".") { // .*: driver caches, not sessions
				t.Errorf("session %s left behind in %s", e.Name(), sub)
			}
		}
	}
	if mi, err := os.ReadFile("/proc/thread-self/mountinfo"); err == nil && bytes.Contains(mi, []byte(g.DataDir)) {
		t.Errorf("mounts under %s left behind", g.DataDir)
	}
	if pids := sessionProcesses(g.sessionIDs()); len(pids) > 0 {
		t.Errorf("session processes left behind: %v", pids)
	}
}

var createdRE = regexp.MustCompile(`msg=session_created session=(\S+)`)

// sessionIDs are the sessions the gateway logged as created.
func (g *gatewayProc) sessionIDs() []string {
	var ids []string
	for _, m := range createdRE.FindAllStringSubmatch(g.stderr.String(), -1) {
		ids = append(ids, m[1])
	}
	return ids
}

// sessionProcesses lists the live processes tagged as belonging to one of
// the workdir sandboxes ids.
func sessionProcesses(ids []string) []string {
	var out []string
	for _, id := range ids {
		for _, pid := range gwtest.TaggedProcesses(id) {
			cmdline, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
			out = append(out, fmt.Sprintf("%d:%s", pid, bytes.ReplaceAll(cmdline, []byte{0}, []byte(" "))))
		}
	}
	return out
}

// api sends a REST request and decodes the JSON answer into out.
func (g *gatewayProc) api(t *testing.T, method, path string, body any, out any) int {
	t.Helper()
	return gwtest.DoJSON(t, g.URL, g.Token, method, path, body, out)
}

type sessionJSON struct {
	SessionID string `json:"sessionId"`
	SSH       struct {
		Password       string   `json:"password"`
		HostKeys       []string `json:"hostKeys"`
		KnownHostsLine string   `json:"knownHostsLine"`
	} `json:"ssh"`
}

func (g *gatewayProc) createSession(t *testing.T) sessionJSON {
	t.Helper()
	var s sessionJSON
	if code := g.api(t, http.MethodPost, "/v1/sessions", map[string]any{}, &s); code != http.StatusCreated {
		t.Fatalf("create: %d", code)
	}
	return s
}

// sshOpts are OpenSSH options for a session: sandgate proxy as
// ProxyCommand, and the host key pinned from the REST answer with
// StrictHostKeyChecking yes.
func (g *gatewayProc) sshOpts(t *testing.T, s sessionJSON) []string {
	t.Helper()
	kh := filepath.Join(t.TempDir(), "known_hosts")
	if err := os.WriteFile(kh, []byte(s.SSH.KnownHostsLine+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return []string{
		"-F", "/dev/null",
		"-o", "ProxyCommand=" + sandgateBin + " proxy %h",
		"-o", "UserKnownHostsFile=" + kh,
		"-o", "GlobalKnownHostsFile=/dev/null",
		"-o", "StrictHostKeyChecking=yes",
		"-o", "BatchMode=yes",
		"-o", "IdentityFile=/dev/null",
		"-o", "User=sandbox",
	}
}

// clientEnv is the environment of client commands: the API URL and token
// come from SANDBOX_API_URL and SANDBOX_API_TOKEN, never argv.
func (g *gatewayProc) clientEnv() []string {
	return append(cleanEnv(), "SANDBOX_API_URL="+g.URL, "SANDBOX_API_TOKEN="+g.Token)
}

// run runs a client command with env and a timeout, and returns stdout,
// stderr and the exit code.
func runClient(t *testing.T, env []string, stdin io.Reader, name string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = env
	var out, errb bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	timer := time.AfterFunc(60*time.Second, func() { _ = cmd.Process.Kill() })
	defer timer.Stop()
	err := cmd.Wait()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

func newCmd(env []string, name string, args ...string) *exec.Cmd {
	c := exec.Command(name, args...)
	c.Env = env
	return c
}
