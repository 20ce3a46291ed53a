package rest_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/console"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/rest"
	"github.com/sandgate/sandgate/sandbox/workdir"
	"github.com/sandgate/sandgate/tunnel"
	"github.com/sandgate/sandgate/workspace"
)

// API keys and the HS256 secret of the default test gateway.
const (
	aliceKey  = "sg_test_alice_9f6c1d7e2b3a4c5d"
	bobKey    = "sg_test_bob_1a2b3c4d5e6f7a8b"
	carolKey  = "sg_test_carol_0f1e2d3c4b5a6978"
	jwtSecret = "test-hs256-secret-0123456789abcdef0123456789"
)

// sshBanner is what the test tunnel handler writes to an established tunnel.
const sshBanner = "SSH-2.0-sandgate-test\r\n"

// gwOptions configures a test gateway; zero values get the defaults noted.
type gwOptions struct {
	gateway gateway.Config
	// auth defaults to API keys for alice, bob and carol plus HS256 jwtSecret.
	auth *gateway.AuthConfig
	// rateLimit is requests per minute per tenant (0: off).
	rateLimit int
	ready     func() (map[string]any, error)
	// wrap, when set, wraps the manager the API sees.
	wrap func(rest.Sessions) rest.Sessions
	// wrapDriver, when set, wraps the sandbox driver the manager uses
	// (the wrapper has only Create: no restore).
	wrapDriver func(gateway.Driver) gateway.Driver
	// breakDriver replaces the workdir root by a file after the driver is
	// made, so every sandbox creation fails.
	breakDriver bool
	// store is the manager's store (default: in memory).
	store gateway.Store
	// restore runs Manager.Restore before serving, as serve.go does.
	restore bool
	// cov collects the (operation, status) pairs seen; nil: a private one.
	cov *coverage
	// images lists images for GET /v1/images (nil: none).
	images rest.Images
	// audit, when set, receives the manager's and the API's audit events
	// and answers GET /v1/audit.
	audit *audit.File
	// metrics, when set, is the API's rest.Metrics.
	metrics rest.Metrics
	// workspaceDir, when set, is where a workspace engine (local store
	// only) keeps named workspaces and snapshots.
	workspaceDir string
	// linkKey, publicURL and previewDomain are the API's (rest.Config).
	linkKey                  []byte
	publicURL, previewDomain string
	// maxWorkspaces and maxSnapshots bound a tenant's (0: the engine's defaults).
	maxWorkspaces, maxSnapshots int
	// workspaceMaxBytes bounds what a workspace may hold (0: its filesystem's size).
	workspaceMaxBytes int64
	// dataPlane and stopping are the API's rest.Config fields.
	dataPlane rest.DataPlane
	stopping  <-chan struct{}
}

// testGateway is the real stack (rest + gateway.Manager + gateway.Verifier +
// workdir driver + tunnel) behind a real http.Server on 127.0.0.1:0, built
// like cmd/sandgate/serve.go builds it. Every response it sees is checked
// against the OpenAPI spec.
type testGateway struct {
	url      string
	addr     string
	mgr      *gateway.Manager
	tun      *tunnel.Server
	root     string
	client   *http.Client
	logs     *syncBuffer
	hostKeys []string
	spec     *specChecker
	handler  http.Handler // the API, for tests that call it without a connection
}

// newHTTPServer builds the http.Server with the settings of
// cmd/sandgate/serve.go (keep the two in step).
func newHTTPServer(h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
}

func testHostKeys(t testing.TB) []string {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pk, err := gossh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return []string{strings.TrimSpace(string(gossh.MarshalAuthorizedKey(pk)))}
}

func newGateway(t testing.TB, o gwOptions) *testGateway {
	t.Helper()
	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))

	root := t.TempDir()
	driver, err := workdir.New(workdir.Config{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	if o.breakDriver {
		if err := os.RemoveAll(root); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(root, []byte("not a directory"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	gcfg := o.gateway
	var auditor audit.Auditor
	var auditLog rest.AuditLog
	if o.audit != nil {
		gcfg.Audit, auditor, auditLog = o.audit, o.audit, o.audit
	}
	if o.store != nil {
		gcfg.Store = o.store
	}
	var wsvc *workspace.Service
	if o.workspaceDir != "" {
		if wsvc, err = workspace.New(workspace.Config{Dir: o.workspaceDir, Log: log,
			MaxWorkspaces: o.maxWorkspaces, MaxSnapshots: o.maxSnapshots, MaxBytes: o.workspaceMaxBytes}); err != nil {
			t.Fatal(err)
		}
		gcfg.Workspaces = wsvc
	}
	var mdriver gateway.Driver = driver
	if o.wrapDriver != nil {
		mdriver = o.wrapDriver(driver)
	}
	mgr := gateway.NewManager(gcfg, mdriver, log)
	if o.restore {
		if err := mgr.Restore(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { mgr.Shutdown(context.Background(), false) })

	ac := gateway.AuthConfig{
		APIKeys:   map[string]string{aliceKey: "alice", bobKey: "bob", carolKey: "carol"},
		JWTSecret: []byte(jwtSecret),
	}
	if o.auth != nil {
		ac = *o.auth
	}
	verifier, err := gateway.NewVerifier(ac)
	if err != nil {
		t.Fatal(err)
	}

	tun := tunnel.NewServer(mgr, func(_ context.Context, conn net.Conn, s *gateway.Session) {
		_, _ = io.WriteString(conn, sshBanner)
	}, rest.WriteGatewayError, log)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		tun.Shutdown(ctx)
	})

	var sessions rest.Sessions = mgr
	if o.wrap != nil {
		sessions = o.wrap(mgr)
	}
	ready := o.ready
	if ready == nil {
		ready = func() (map[string]any, error) {
			return map[string]any{"sandbox": driver.Name(), "limits": nil}, nil
		}
	}
	hostKeys := testHostKeys(t)
	rcfg := rest.Config{
		Sessions: sessions, Verifier: verifier, Log: log, RateLimit: o.rateLimit,
		SSHUsername: "sandbox", HostKeys: hostKeys, Connect: tun, Ready: ready, Images: o.images,
		Audit: auditor, AuditLog: auditLog, Metrics: o.metrics, DataPlane: o.dataPlane, Stopping: o.stopping,
		LinkKey: o.linkKey, PublicURL: o.publicURL, PreviewDomain: o.previewDomain,
		Console: console.Handler(), // as serve mounts it
	}
	if wsvc != nil {
		rcfg.Workspaces = wsvc
	}
	handler := rest.New(rcfg)

	srv := newHTTPServer(handler, log)
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

	client := &http.Client{Transport: &http.Transport{DialContext: dialLocalhost}, Timeout: 30 * time.Second}
	t.Cleanup(client.CloseIdleConnections)

	g := &testGateway{
		url: "http://" + ln.Addr().String(), addr: ln.Addr().String(),
		mgr: mgr, tun: tun, root: root, client: client, logs: logs, hostKeys: hostKeys,
		handler: handler,
	}
	g.spec = newSpecChecker(t, g.url, o.cov)
	return g
}

// result is a response as the tests look at it.
type result struct {
	status int
	header http.Header
	body   []byte
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

func (r result) session(t testing.TB) sessionOut {
	t.Helper()
	var s sessionOut
	if err := json.Unmarshal(r.body, &s); err != nil {
		t.Fatalf("decode session %q: %v", r.body, err)
	}
	return s
}

type sessionOut struct {
	SessionID      string             `json:"sessionId"`
	Status         string             `json:"status"`
	Image          string             `json:"image"`
	Metadata       map[string]any     `json:"metadata"`
	CreatedAt      time.Time          `json:"createdAt"`
	ExpiresAt      time.Time          `json:"expiresAt"`
	LastActivityAt time.Time          `json:"lastActivityAt"`
	TTL            int                `json:"ttl"`
	Resources      *gateway.Resources `json:"resources"`
	SSH            struct {
		Username       string   `json:"username"`
		Password       string   `json:"password"`
		HostKeys       []string `json:"hostKeys"`
		KnownHostsLine string   `json:"knownHostsLine"`
		ConnectPath    string   `json:"connectPath"`
	} `json:"ssh"`
}

type listOut struct {
	Sessions []sessionOut `json:"sessions"`
	Total    int          `json:"total"`
	Limit    int          `json:"limit"`
	Offset   int          `json:"offset"`
}

// do sends one request and checks the exchange against the spec. token ""
// sends no Authorization header; hdr holds extra header name/value pairs.
func (g *testGateway) do(t testing.TB, method, path, token string, body []byte, hdr ...string) result {
	t.Helper()
	return g.exchange(t, true, method, path, token, body, hdr...)
}

// exchange is do; with checkRequest false only the response is checked
// against the spec (for fuzzed requests the spec need not describe).
func (g *testGateway) exchange(t testing.TB, checkRequest bool, method, path, token string, body []byte, hdr ...string) result {
	t.Helper()
	newReq := func() *http.Request {
		var rd io.Reader
		if body != nil {
			rd = bytes.NewReader(body)
		}
		u := g.url + path
		if strings.HasPrefix(path, "http://") {
			u = path // another origin of the gateway's: a preview's
		}
		req, err := http.NewRequest(method, u, rd)
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
		return req
	}
	res, err := g.client.Do(newReq())
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	data, err := io.ReadAll(io.LimitReader(res.Body, 4<<20))
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	r := result{status: res.StatusCode, header: res.Header, body: data}
	if checkRequest {
		g.spec.check(t, newReq(), body, r)
	} else {
		g.spec.checkResponse(t, newReq(), r)
	}
	return r
}

func (g *testGateway) create(t testing.TB, token string, body string) sessionOut {
	t.Helper()
	var b []byte
	if body != "" {
		b = []byte(body)
	}
	r := g.do(t, http.MethodPost, "/v1/sessions", token, b)
	if r.status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	return r.session(t)
}

func (g *testGateway) list(t testing.TB, token string) listOut {
	t.Helper()
	r := g.do(t, http.MethodGet, "/v1/sessions?limit=100", token, nil)
	if r.status != http.StatusOK {
		t.Fatalf("list: %d %s", r.status, r.body)
	}
	var l listOut
	if err := json.Unmarshal(r.body, &l); err != nil {
		t.Fatal(err)
	}
	return l
}

// sandboxDirs is how many session workdirs exist on the host: a global
// count of sandboxes, whatever their tenant.
func (g *testGateway) sandboxDirs(t testing.TB) int {
	t.Helper()
	entries, err := os.ReadDir(g.root)
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

// rawConnect sends a CONNECT request over a new TCP connection, checks the
// answer against the spec's x-connect and returns it with the connection
// (left open after a 200) and its reader.
func (g *testGateway) rawConnect(t testing.TB, path string, hdr ...string) (result, net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", g.addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	req := "CONNECT " + path + " HTTP/1.1\r\nHost: " + g.addr + "\r\n"
	for i := 0; i+1 < len(hdr); i += 2 {
		req += hdr[i] + ": " + hdr[i+1] + "\r\n"
	}
	if _, err := io.WriteString(conn, req+"\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	hreq := &http.Request{Method: http.MethodConnect, Header: http.Header{}}
	for i := 0; i+1 < len(hdr); i += 2 {
		hreq.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.ReadResponse(br, hreq)
	if err != nil {
		t.Fatalf("CONNECT %s: %v", path, err)
	}
	r := result{status: res.StatusCode, header: res.Header}
	if res.StatusCode != http.StatusOK {
		r.body, err = io.ReadAll(io.LimitReader(res.Body, 1<<20))
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
	}
	g.spec.checkConnect(t, path, r)
	return r, conn, br
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

// dialLocalhost dials as browsers and curl do: every *.localhost name is
// the loopback (a preview origin's, rest/preview.go).
func dialLocalhost(ctx context.Context, network, addr string) (net.Conn, error) {
	if host, port, err := net.SplitHostPort(addr); err == nil && strings.HasSuffix(strings.ToLower(host), ".localhost") {
		addr = net.JoinHostPort("127.0.0.1", port)
	}
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}
