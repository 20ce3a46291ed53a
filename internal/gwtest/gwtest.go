// Package gwtest starts a real, in-process sandgate stack (manager, sandbox
// driver, SSH server, CONNECT tunnel and REST API on a loopback listener)
// for tests, and gives them real SSH and SFTP clients through the tunnel.
package gwtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pkg/sftp"
	gossh "golang.org/x/crypto/ssh"

	"github.com/sandgate/sandgate/dataplane"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/rest"
	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/linuxns"
	"github.com/sandgate/sandgate/sandbox/linuxns/initd"
	"github.com/sandgate/sandgate/sandbox/workdir"
	"github.com/sandgate/sandgate/sftpd"
	"github.com/sandgate/sandgate/sshd"
	"github.com/sandgate/sandgate/tunnel"
)

// Dispatch lets a test binary stand in for the sandgate binary: call it
// first in TestMain. When the binary was re-executed as one of sandgate's
// hidden subcommands, it runs it and exits.
func Dispatch() {
	if len(os.Args) < 2 {
		return
	}
	switch os.Args[1] {
	case "sftp-server":
		os.Exit(sftpd.Main(os.Args[2:]))
	case "sandbox-init":
		os.Exit(initd.Main(os.Args[2:]))
	case "sandbox-spawner":
		os.Exit(initd.SpawnMain(os.Args[2:]))
	}
}

// Options tune a Stack. Zero values get test defaults.
type Options struct {
	// Tokens maps bearer token to tenant (default "test-token" -> "default").
	Tokens    map[string]string
	Manager   gateway.Config
	SSH       sshd.Config
	RateLimit int
	// Driver is the sandbox driver: "workdir" (the default) or "linux".
	Driver string
	// ReadHeaderTimeout for the HTTP server (default 2s).
	ReadHeaderTimeout time.Duration
	// DataPlane bounds the REST data plane (rest.Config.DataPlane).
	DataPlane rest.DataPlane
	// Mounts, when set, returns the APIs served beside /v1
	// (rest.Config.Mounts), over the stack's engines: rest/compat's tests
	// mount the compat APIs, as cmd/sandgate does.
	Mounts func(Engines) []rest.Mount
}

// Stack is a running in-process gateway.
type Stack struct {
	URL     string
	Token   string
	DataDir string
	Manager *gateway.Manager
	Signers []gossh.Signer
	Log     *Buffer

	srv *http.Server
	ssh *sshd.Server
	tun *tunnel.Server
}

// Buffer is a bytes.Buffer safe for concurrent writers and readers: the
// stack's logs, and the output of clients tests watch.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// String returns everything written so far.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// Engines are what a stack's /v1 API serves from, for the APIs mounted
// beside it (Options.Mounts).
type Engines struct {
	Sessions *gateway.Manager
	Plane    *dataplane.Plane
	Links    rest.Links
	Log      *slog.Logger
}

// Start runs a stack until the test ends.
func Start(t testing.TB, o Options) *Stack {
	t.Helper()
	if o.Tokens == nil {
		o.Tokens = map[string]string{"test-token": "default"}
	}
	if o.Driver == "" {
		o.Driver = "workdir"
	}
	if o.ReadHeaderTimeout == 0 {
		o.ReadHeaderTimeout = 2 * time.Second
	}
	dataDir := t.TempDir()
	logs := &Buffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ver, err := gateway.NewVerifier(gateway.AuthConfig{APIKeys: o.Tokens})
	if err != nil {
		t.Fatal(err)
	}
	signers, err := sshd.LoadOrCreateHostKeys(filepath.Join(dataDir, "keys"))
	if err != nil {
		t.Fatal(err)
	}
	var drv sandbox.Driver
	switch o.Driver {
	case "workdir":
		drv, err = workdir.New(workdir.Config{Root: filepath.Join(dataDir, "sessions")})
	case "linux":
		drv, err = linuxns.New(sandbox.Config{DataDir: dataDir, Log: log})
	default:
		err = fmt.Errorf("gwtest: unknown driver %q", o.Driver)
	}
	if err != nil {
		t.Fatal(err)
	}
	mgr := gateway.NewManager(o.Manager, drv, log)
	sc := o.SSH
	sc.HostSigners, sc.Log = signers, log
	ssh, err := sshd.New(sc)
	if err != nil {
		t.Fatal(err)
	}
	tun := tunnel.NewServer(mgr, ssh.ServeConnContext, rest.WriteGatewayError, log, tunnel.WithAdmitter(ssh))
	plane := dataplane.NewPlane(o.DataPlane)
	linkKey := rest.NewLinkKey()
	var mounts []rest.Mount
	if o.Mounts != nil {
		mounts = o.Mounts(Engines{Sessions: mgr, Plane: plane, Links: rest.Links{Key: linkKey, Log: log}, Log: log})
	}
	h := rest.New(rest.Config{
		Sessions: mgr, Verifier: ver, Log: log, RateLimit: o.RateLimit,
		SSHUsername: "sandbox", HostKeys: sshd.AuthorizedKeys(signers), Connect: tun,
		Plane: plane, LinkKey: linkKey, Mounts: mounts,
	})
	srv := &http.Server{Handler: h, ReadHeaderTimeout: o.ReadHeaderTimeout, MaxHeaderBytes: 64 << 10}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	ctx, cancel := context.WithCancel(context.Background())
	reaped := make(chan struct{})
	go func() {
		defer close(reaped)
		mgr.Run(ctx)
	}()
	token := ""
	for k := range o.Tokens {
		if token == "" || k == "test-token" {
			token = k
		}
	}
	s := &Stack{URL: "http://" + ln.Addr().String(), Token: token, DataDir: dataDir, Manager: mgr,
		Signers: signers, Log: logs, srv: srv, ssh: ssh, tun: tun}
	t.Cleanup(func() {
		drain, c := context.WithTimeout(context.Background(), 5*time.Second)
		defer c()
		_ = srv.Shutdown(drain)
		ssh.Shutdown(drain)
		tun.Shutdown(drain)
		cancel()
		<-reaped
		mgr.Shutdown(context.Background(), false)
		s.checkNothingLeft(t)
	})
	return s
}

var createdRE = regexp.MustCompile(`msg=session_created session=(\S+)`)

// checkNothingLeft fails the test if any session of the stack left a
// process or a workdir behind.
func (s *Stack) checkNothingLeft(t testing.TB) {
	for _, m := range createdRE.FindAllStringSubmatch(s.Log.String(), -1) {
		if pids := TaggedProcesses(m[1]); len(pids) > 0 {
			t.Errorf("session %s left processes %v", m[1], pids)
		}
	}
	entries, _ := os.ReadDir(filepath.Join(s.DataDir, "sessions"))
	for _, e := range entries {
		t.Errorf("session workdir left behind: %s", e.Name())
	}
}

// Do sends a REST request with token and decodes a JSON answer into out
// (when non-nil). It returns the status code.
func (s *Stack) Do(t testing.TB, token, method, path string, body any, out any) int {
	t.Helper()
	return DoJSON(t, s.URL, token, method, path, body, out)
}

// DoJSON sends a REST request to the gateway at baseURL with token, and
// decodes a JSON answer into out (when non-nil). It returns the status code.
func DoJSON(t testing.TB, baseURL, token, method, path string, body any, out any) int {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, baseURL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if out != nil && len(data) > 0 {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("%s %s: decode %q: %v", method, path, data, err)
		}
	}
	return resp.StatusCode
}

// Session is the subset of the session JSON tests use.
type Session struct {
	SessionID string `json:"sessionId"`
	Status    string `json:"status"`
	SSH       struct {
		Username string   `json:"username"`
		Password string   `json:"password"`
		HostKeys []string `json:"hostKeys"`
	} `json:"ssh"`
}

// CreateSession creates a session with body (nil: defaults) using s.Token.
func (s *Stack) CreateSession(t testing.TB, body map[string]any) Session {
	t.Helper()
	var out Session
	if body == nil {
		body = map[string]any{}
	}
	if code := s.Do(t, s.Token, http.MethodPost, "/v1/sessions", body, &out); code != http.StatusCreated {
		t.Fatalf("create session: status %d", code)
	}
	return out
}

// Dial opens a tunnel to session id with token.
func (s *Stack) Dial(t testing.TB, token, id string) (net.Conn, error) {
	t.Helper()
	d := &tunnel.Dialer{APIURL: s.URL, Token: token, Timeout: 10 * time.Second}
	return d.Dial(context.Background(), id)
}

// HostKeyCallback pins the stack's host keys.
func (s *Stack) HostKeyCallback() gossh.HostKeyCallback {
	return func(_ string, _ net.Addr, key gossh.PublicKey) error {
		for _, k := range s.Signers {
			if bytes.Equal(k.PublicKey().Marshal(), key.Marshal()) {
				return nil
			}
		}
		return fmt.Errorf("host key %s is not the gateway's", gossh.FingerprintSHA256(key))
	}
}

// SSH opens an SSH client to session id through the tunnel with auth
// methods (none: SSH "none" auth).
func (s *Stack) SSH(t testing.TB, id string, auth ...gossh.AuthMethod) *gossh.Client {
	t.Helper()
	c, err := s.SSHErr(t, id, auth...)
	if err != nil {
		t.Fatalf("ssh to %s: %v", id, err)
	}
	return c
}

// SSHErr is SSH returning the error instead of failing.
func (s *Stack) SSHErr(t testing.TB, id string, auth ...gossh.AuthMethod) (*gossh.Client, error) {
	t.Helper()
	conn, err := s.Dial(t, s.Token, id)
	if err != nil {
		return nil, err
	}
	cfg := &gossh.ClientConfig{User: "sandbox", Auth: auth, HostKeyCallback: s.HostKeyCallback(), Timeout: 10 * time.Second}
	cc, chans, reqs, err := gossh.NewClientConn(conn, id, cfg)
	if err != nil {
		conn.Close()
		return nil, err
	}
	c := gossh.NewClient(cc, chans, reqs)
	t.Cleanup(func() { c.Close() })
	return c, nil
}

// SFTP opens an SFTP client on c.
func SFTP(t testing.TB, c *gossh.Client) *sftp.Client {
	t.Helper()
	sc, err := sftp.NewClient(c)
	if err != nil {
		t.Fatalf("sftp: %v", err)
	}
	t.Cleanup(func() { sc.Close() })
	return sc
}

// Result is one command's outcome.
type Result struct {
	Stdout, Stderr string
	Code           int
	Signal         string
}

// Exec runs cmd on a new session channel of c.
func Exec(t testing.TB, c *gossh.Client, cmd string) Result {
	t.Helper()
	sess, err := c.NewSession()
	if err != nil {
		t.Fatalf("new session: %v", err)
	}
	defer sess.Close()
	var out, errb bytes.Buffer
	sess.Stdout, sess.Stderr = &out, &errb
	err = sess.Run(cmd)
	r := Result{Stdout: out.String(), Stderr: errb.String()}
	if ee, ok := err.(*gossh.ExitError); ok {
		r.Code, r.Signal = ee.ExitStatus(), ee.Signal()
	} else if err != nil {
		t.Fatalf("run %q: %v", cmd, err)
	}
	return r
}

// TaggedProcesses lists pids of live processes whose environment holds
// workdir.SessionEnvVar=id (workdir sandboxes tag their processes so).
func TaggedProcesses(id string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	want := workdir.SessionEnvVar + "=" + id
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue
		}
		for _, kv := range strings.Split(string(env), "\x00") {
			if kv == want {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// FreePort is a TCP port nothing listens on, on the host's loopback,
// just now.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// RequireTool returns the path of an external tool the test needs. It
// skips the test when the tool is missing locally, and fails it under
// CI=true, where .ci/run installs every tool.
func RequireTool(t testing.TB, tool string) string {
	t.Helper()
	p, err := exec.LookPath(tool)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is required in CI (.ci/run installs it)", tool)
		}
		t.Skipf("%s not installed", tool)
	}
	return p
}
