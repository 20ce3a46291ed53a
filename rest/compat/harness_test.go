package compat_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sandgate/sandgate/dataplane"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/rest"
	"github.com/sandgate/sandgate/rest/compat"
	"github.com/sandgate/sandgate/sandbox/workdir"
)

// The compat APIs' tests run the real stack (rest with the compat APIs
// mounted, as cmd/sandgate mounts them, over gateway.Manager and the
// workdir driver) behind a real http.Server on 127.0.0.1:0. It is the
// rest package's test gateway (rest/harness_test.go) cut to what these
// tests use: the compat APIs are not in the OpenAPI spec, so no answer
// is checked against it.

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// API keys and the HS256 secret of the test gateway.
const (
	aliceKey  = "sg_test_alice_9f6c1d7e2b3a4c5d"
	bobKey    = "sg_test_bob_1a2b3c4d5e6f7a8b"
	jwtSecret = "test-hs256-secret-0123456789abcdef0123456789"
)

// gwOptions configures a test gateway.
type gwOptions struct {
	// rateLimit is requests per minute per tenant (0: off).
	rateLimit int
	// selfExe is the sandgate binary the workdir driver runs as the
	// sandbox's SFTP server ("": no file access).
	selfExe string
	// dataPlane bounds the data plane (rest.Config.DataPlane).
	dataPlane rest.DataPlane
}

type testGateway struct {
	url    string
	mgr    *gateway.Manager
	client *http.Client
	logs   *syncBuffer
}

// result is a response as the tests look at it.
type result struct {
	status int
	header http.Header
	body   []byte
}

func newGateway(t testing.TB, o gwOptions) *testGateway {
	t.Helper()
	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	driver, err := workdir.New(workdir.Config{Root: t.TempDir(), SelfExe: o.selfExe})
	if err != nil {
		t.Fatal(err)
	}
	mgr := gateway.NewManager(gateway.Config{}, driver, log)
	t.Cleanup(func() { mgr.Shutdown(context.Background(), false) })
	verifier, err := gateway.NewVerifier(gateway.AuthConfig{
		APIKeys: map[string]string{aliceKey: "alice", bobKey: "bob"}, JWTSecret: []byte(jwtSecret),
	})
	if err != nil {
		t.Fatal(err)
	}
	plane := dataplane.NewPlane(o.dataPlane)
	linkKey := rest.NewLinkKey()
	handler := rest.New(rest.Config{
		Sessions: mgr, Verifier: verifier, Log: log, RateLimit: o.rateLimit, SSHUsername: "sandbox",
		Plane: plane, LinkKey: linkKey,
		Mounts: compat.New(compat.Deps{Sessions: mgr, Plane: plane, Log: log, Links: rest.Links{Key: linkKey, Log: log}}),
	})
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 64 << 10}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			_ = srv.Close()
		}
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
	client := &http.Client{Timeout: 30 * time.Second}
	t.Cleanup(client.CloseIdleConnections)
	return &testGateway{url: "http://" + ln.Addr().String(), mgr: mgr, client: client, logs: logs}
}

// filesTestBinary builds sandgate, the sandbox's SFTP server.
func filesTestBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "sandgate")
	build := exec.Command("go", "build", "-o", bin, "github.com/sandgate/sandgate/cmd/sandgate")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build sandgate: %v\n%s", err, out)
	}
	return bin
}

// filesGateway is the test gateway whose sandboxes serve files with bin,
// its data plane bounded by dp (the signature of rest's, whose coverage
// argument these tests leave nil).
func filesGateway(t *testing.T, _ any, bin string, rateLimit int, dp rest.DataPlane) *testGateway {
	t.Helper()
	return newGateway(t, gwOptions{rateLimit: rateLimit, selfExe: bin, dataPlane: dp})
}

// do sends one request. token "" sends no Authorization header; hdr holds
// extra header name/value pairs.
func (g *testGateway) do(t testing.TB, method, path, token string, body []byte, hdr ...string) result {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, g.url+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := g.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	data, err := io.ReadAll(io.LimitReader(res.Body, 4<<20))
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return result{status: res.StatusCode, header: res.Header, body: data}
}

// session is a /v1 session answer, as far as these tests read it.
type session struct {
	SessionID string `json:"sessionId"`
}

func (g *testGateway) create(t testing.TB, token string, body string) session {
	t.Helper()
	var b []byte
	if body != "" {
		b = []byte(body)
	}
	r := g.do(t, http.MethodPost, "/v1/sessions", token, b)
	if r.status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	var s session
	if err := json.Unmarshal(r.body, &s); err != nil {
		t.Fatalf("decode session %q: %v", r.body, err)
	}
	return s
}

// syncBuffer is a bytes.Buffer safe for concurrent writers (the logger).
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (r result) errorCode() string {
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	_ = json.Unmarshal(r.body, &e)
	return e.Error.Code
}

func (r result) errorMessage() string {
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	_ = json.Unmarshal(r.body, &e)
	return e.Error.Message
}

// expect checks a /v1 answer's status and error code (rest's contract
// tests check the same).
func expect(t testing.TB, r result, status int, code string) {
	t.Helper()
	if r.status != status {
		t.Errorf("status %d, want %d (body %.300s)", r.status, status, r.body)
		return
	}
	if code != "" && r.errorCode() != code {
		t.Errorf("code %q, want %q (body %.300s)", r.errorCode(), code, r.body)
	}
	if status >= 400 && r.errorMessage() == "" {
		t.Errorf("%d without an error message: %s", status, r.body)
	}
}
