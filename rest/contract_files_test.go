package rest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/egress"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/rest"
	"github.com/sandgate/sandgate/sandbox/workdir"
)

// filesTestBinary builds sandgate for the workdir driver's SFTP server
// (the test binary cannot stand in for it: rest's TestMain dispatches no
// subcommand).
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

// filesGateway is the test gateway with a workdir driver whose SFTP server
// is bin, serving an API built with dp on a listener of its own.
func filesGateway(t *testing.T, cov *coverage, bin string, rateLimit int, dp rest.DataPlane) *testGateway {
	t.Helper()
	driver, err := workdir.New(workdir.Config{Root: t.TempDir(), SelfExe: bin})
	if err != nil {
		t.Fatal(err)
	}
	g := newGateway(t, gwOptions{cov: cov, wrapDriver: func(gateway.Driver) gateway.Driver { return driver }})
	verifier, err := gateway.NewVerifier(gateway.AuthConfig{
		APIKeys: map[string]string{aliceKey: "alice", bobKey: "bob"}, JWTSecret: []byte(jwtSecret),
	})
	if err != nil {
		t.Fatal(err)
	}
	log := g.logs
	handler := rest.New(rest.Config{
		Sessions: g.mgr, Verifier: verifier, Log: filesLog(log), RateLimit: rateLimit,
		SSHUsername: "sandbox", HostKeys: g.hostKeys, DataPlane: dp,
	})
	srv := newHTTPServer(handler, filesLog(log))
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
	fg := *g
	fg.url, fg.addr, fg.root, fg.handler = "http://"+ln.Addr().String(), ln.Addr().String(), "", handler
	fg.spec = newSpecChecker(t, fg.url, cov)
	return &fg
}

func TestContractFiles(t *testing.T) {
	cov := newCoverage()
	bin := filesTestBinary(t)

	// Downloads come from 127.0.0.2, the one range DialPublic allows here.
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("cannot listen on 127.0.0.2: %v", err)
	}
	dl := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/missing" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte("downloaded"))
	})}
	go func() { _ = dl.Serve(ln) }()
	t.Cleanup(func() { _ = dl.Close() })
	proxy, err := egress.New(egress.Config{AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")}})
	if err != nil {
		t.Fatal(err)
	}

	g := filesGateway(t, cov, bin, 0, rest.DataPlane{MaxFileBytes: 1 << 20, DialPublic: proxy.DialPublic})
	s := g.create(t, aliceKey, "")
	base := "/v1/sessions/" + s.SessionID + "/files"
	octet := []string{"Content-Type", "application/octet-stream"}
	put := func(path string, body []byte, hdr ...string) result {
		t.Helper()
		return g.do(t, http.MethodPut, base+"?"+path, aliceKey, body, append(octet, hdr...)...)
	}

	t.Run("put", func(t *testing.T) {
		r := put("path=hello.txt", []byte("hello world"))
		expect(t, r, 201, "")
		var e struct {
			Name, Path, Type, Mode string
			SizeBytes              int64
		}
		if err := json.Unmarshal(r.body, &e); err != nil || e.Path != "hello.txt" || e.SizeBytes != 11 || e.Mode != "0644" || e.Type != "file" {
			t.Errorf("entry %s: %v", r.body, err)
		}
		expect(t, put("path=hello.txt&mode=600", []byte("hello again")), 200, "")
		expect(t, put("path=d/e/f.txt&mkdirs=true", []byte("deep")), 201, "")
		expect(t, put("path=empty", nil), 201, "")
		expect(t, put("path=x/y.txt", []byte("x")), 404, "file_not_found")
		expect(t, put("path=d", []byte("x")), 409, "is_a_directory")
		expect(t, put("path=hello.txt/x&mkdirs=true", []byte("x")), 409, "not_a_directory")
		expect(t, put("path=big", make([]byte, 1<<20+1)), 413, "file_too_large")
		expect(t, put("path=/", []byte("x")), 400, "invalid_path")
		expect(t, put("path=a%00b", []byte("x")), 400, "invalid_path")
		expect(t, put("", []byte("x")), 400, "invalid_path")
		expect(t, put("path=m&mode=999", []byte("x")), 400, "invalid_parameter")
		expect(t, put("path=m&mkdirs=maybe", []byte("x")), 400, "invalid_parameter")
		// A link out of the workdir: os.Root refuses to follow it.
		expect(t, put("path=up&mode=777", []byte("x")), 201, "")
		if err := os.Symlink("/", filepath.Join(sessionWorkdir(t, g, s.SessionID), "rootlink")); err != nil {
			t.Fatal(err)
		}
		expect(t, put("path=rootlink/tmp/escaped", []byte("x")), 403, "permission_denied")
		expect(t, g.do(t, http.MethodPut, base+"?path=x", "", []byte("x"), octet...), 401, "unauthorized")
		expect(t, g.do(t, http.MethodPut, "/v1/sessions/sbx-nope/files?path=x", aliceKey, []byte("x"), octet...), 404, "not_found")
	})

	t.Run("get", func(t *testing.T) {
		r := g.do(t, http.MethodGet, base+"?path=hello.txt", aliceKey, nil)
		expect(t, r, 200, "")
		if string(r.body) != "hello again" || r.header.Get("Content-Type") != "application/octet-stream" ||
			r.header.Get("Content-Length") != "11" || r.header.Get("Last-Modified") == "" {
			t.Errorf("got %q %v", r.body, r.header)
		}
		r = g.do(t, http.MethodGet, base+"?path=hello.txt", aliceKey, nil, "Range", "bytes=6-")
		expect(t, r, 206, "")
		if string(r.body) != "again" || r.header.Get("Content-Range") != "bytes 6-10/11" {
			t.Errorf("range %q %v", r.body, r.header)
		}
		expect(t, g.do(t, http.MethodGet, base+"?path=hello.txt", aliceKey, nil, "Range", "bytes=0-1,3-4"), 206, "")
		if r := g.do(t, http.MethodGet, base+"?path=hello.txt", aliceKey, nil, "Range", "bytes=50-"); r.status != 416 {
			t.Errorf("range past the end: %d %s", r.status, r.body)
		}
		expect(t, g.do(t, http.MethodGet, base+"?path=hello.txt", aliceKey, nil,
			"If-Modified-Since", time.Now().Add(time.Hour).UTC().Format(http.TimeFormat)), 304, "")
		r = g.do(t, http.MethodGet, base+"?path=.&list=true&recursive=true", aliceKey, nil)
		expect(t, r, 200, "")
		if !bytes.Contains(r.body, []byte(`"path":"d/e/f.txt"`)) || !bytes.Contains(r.body, []byte(`"truncated":false`)) {
			t.Errorf("list %s", r.body)
		}
		expect(t, g.do(t, http.MethodGet, base+"?path=d", aliceKey, nil), 409, "is_a_directory")
		expect(t, g.do(t, http.MethodGet, base+"?path=hello.txt&list=true", aliceKey, nil), 409, "not_a_directory")
		expect(t, g.do(t, http.MethodGet, base+"?path=../../etc/shadow", aliceKey, nil), 404, "file_not_found")
		expect(t, g.do(t, http.MethodGet, base+"?path=/etc/shadow", aliceKey, nil), 404, "file_not_found")
		expect(t, g.do(t, http.MethodGet, base+"?path=rootlink/etc/hostname", aliceKey, nil), 403, "permission_denied")
		expect(t, g.do(t, http.MethodGet, base+"?path=a%00", aliceKey, nil), 400, "invalid_path")
		expect(t, g.do(t, http.MethodGet, base+"?path=.&list=yes", aliceKey, nil), 400, "invalid_parameter")
		expect(t, g.do(t, http.MethodGet, base+"?path=x", "", nil), 401, "unauthorized")
		expect(t, g.do(t, http.MethodGet, base+"?path=x", bobKey, nil), 404, "not_found")
	})

	t.Run("delete", func(t *testing.T) {
		expect(t, g.do(t, http.MethodDelete, base+"?path=d", aliceKey, nil), 409, "directory_not_empty")
		expect(t, g.do(t, http.MethodDelete, base+"?path=d&recursive=true", aliceKey, nil), 204, "")
		expect(t, g.do(t, http.MethodDelete, base+"?path=d", aliceKey, nil), 404, "file_not_found")
		expect(t, g.do(t, http.MethodDelete, base+"?path=.&recursive=true", aliceKey, nil), 400, "invalid_path")
		expect(t, g.do(t, http.MethodDelete, base+"?path=x&recursive=2", aliceKey, nil), 400, "invalid_parameter")
		expect(t, g.do(t, http.MethodDelete, base+"?path=rootlink/etc", aliceKey, nil), 403, "permission_denied")
		expect(t, g.do(t, http.MethodDelete, base+"?path=x", "", nil), 401, "unauthorized")
		expect(t, g.do(t, http.MethodDelete, base+"?path=x", bobKey, nil), 404, "not_found")
	})

	t.Run("fetch", func(t *testing.T) {
		fetch := func(token, body string) result {
			t.Helper()
			return g.do(t, http.MethodPost, base+"/fetch", token, []byte(body))
		}
		src := "http://" + ln.Addr().String()
		r := fetch(aliceKey, `{"urls": ["`+src+`/a.txt"], "destDir": "data"}`)
		expect(t, r, 200, "")
		if !bytes.Contains(r.body, []byte(`"status":"success"`)) || !bytes.Contains(r.body, []byte(`"data/a.txt"`)) {
			t.Errorf("fetch %s", r.body)
		}
		r = fetch(aliceKey, `{"urls": ["`+src+`/b.txt", "`+src+`/missing", "http://127.0.0.1:1/x"]}`)
		expect(t, r, 200, "")
		if !bytes.Contains(r.body, []byte(`"partial_success"`)) || !bytes.Contains(r.body, []byte(`private address 127.0.0.1`)) {
			t.Errorf("fetch %s", r.body)
		}
		r = fetch(aliceKey, `{"urls": ["http://169.254.169.254/latest/meta-data"]}`)
		expect(t, r, 200, "")
		if !bytes.Contains(r.body, []byte(`"failure"`)) {
			t.Errorf("fetch %s", r.body)
		}
		expect(t, fetch(aliceKey, `{"urls": []}`), 400, "invalid_url")
		expect(t, fetch(aliceKey, `{"urls": ["file:///etc/passwd"]}`), 400, "invalid_url")
		expect(t, fetch(aliceKey, `{"urls": ["`+src+`/a"], "destDir": "a\u0000b"}`), 400, "invalid_path")
		expect(t, fetch(aliceKey, `{"urls": ["`+src+`/a"], "destDir": "hello.txt"}`), 409, "not_a_directory")
		expect(t, fetch(aliceKey, `{"urls": ["`+src+`/a"], "destDir": "rootlink/tmp"}`), 403, "permission_denied")
		expect(t, fetch(aliceKey, `{"urls": "x"}`), 400, "invalid_field")
		expect(t, fetch(aliceKey, `{"urls": ["`+src+`/a"], "x": 1}`), 400, "unknown_field")
		expect(t, fetch(aliceKey, `{"urls": ["`+strings.Repeat("a", 70<<10)+`"]}`), 413, "body_too_large")
		expect(t, fetch("", `{}`), 401, "unauthorized")
		expect(t, g.do(t, http.MethodPost, "/v1/sessions/sbx-nope/files/fetch", aliceKey, []byte(`{"urls": ["http://x/"]}`)), 404, "not_found")
	})

	t.Run("gone", func(t *testing.T) {
		expectGone(t, g,
			goneCall{method: http.MethodGet, sub: "/files?path=x"},
			goneCall{method: http.MethodPut, sub: "/files?path=x", body: []byte("x"), hdr: octet},
			goneCall{method: http.MethodDelete, sub: "/files?path=x"},
			goneCall{method: http.MethodPost, sub: "/files/fetch", body: []byte(`{"urls": ["http://x/"]}`)})
	})

	t.Run("no egress proxy", func(t *testing.T) {
		g2 := filesGateway(t, cov, bin, 0, rest.DataPlane{})
		s2 := g2.create(t, aliceKey, "")
		expect(t, g2.do(t, http.MethodPost, "/v1/sessions/"+s2.SessionID+"/files/fetch", aliceKey,
			[]byte(`{"urls": ["https://example.com/"]}`)), 503, "fetch_unavailable")
	})

	t.Run("sandbox gone", func(t *testing.T) {
		g3 := filesGateway(t, cov, bin, 0, rest.DataPlane{})
		s3 := g3.create(t, aliceKey, "")
		sess, err := g3.mgr.Get(context.Background(), gateway.Principal{Tenant: "alice"}, s3.SessionID)
		if err != nil {
			t.Fatal(err)
		}
		if err := sess.Sandbox().Destroy(context.Background()); err != nil {
			t.Fatal(err)
		}
		b3 := "/v1/sessions/" + s3.SessionID + "/files"
		expect(t, g3.do(t, http.MethodGet, b3+"?path=x", aliceKey, nil), 503, "files_unavailable")
		expect(t, g3.do(t, http.MethodPut, b3+"?path=x", aliceKey, []byte("x"), octet...), 503, "files_unavailable")
		expect(t, g3.do(t, http.MethodDelete, b3+"?path=x", aliceKey, nil), 503, "files_unavailable")
		expect(t, g3.do(t, http.MethodPost, b3+"/fetch", aliceKey, []byte(`{"urls": ["https://example.com/"]}`)), 503, "fetch_unavailable")
	})

	t.Run("rate limited", func(t *testing.T) {
		g4 := filesGateway(t, cov, bin, 2, rest.DataPlane{}) // create, then one more
		s4 := g4.create(t, aliceKey, "")
		b4 := "/v1/sessions/" + s4.SessionID + "/files"
		expect(t, g4.do(t, http.MethodGet, b4+"?path=x", aliceKey, nil), 404, "file_not_found")
		expect(t, g4.do(t, http.MethodGet, b4+"?path=x", aliceKey, nil), 429, "rate_limited")
		expect(t, g4.do(t, http.MethodPut, b4+"?path=x", aliceKey, []byte("x"), octet...), 429, "rate_limited")
		expect(t, g4.do(t, http.MethodDelete, b4+"?path=x", aliceKey, nil), 429, "rate_limited")
		expect(t, g4.do(t, http.MethodPost, b4+"/fetch", aliceKey, []byte(`{"urls": ["https://example.com/"]}`)), 429, "rate_limited")
	})

	// Presigned links (.../files/link) have their own contract test.
	requireSeen(t, cov, func(p string) bool { return strings.Contains(p, "/files") && !strings.HasSuffix(p, "/files/link") }, map[string]string{
		"getFile 500":    "no failure path short of a broken SFTP server in the sandbox",
		"putFile 500":    "no failure path short of a broken SFTP server in the sandbox",
		"deleteFile 500": "no failure path short of a broken SFTP server in the sandbox",
		"fetchFiles 500": "no failure path short of a broken SFTP server in the sandbox",
		"putFile 507":    "needs a full sandbox filesystem: the linux driver's sized workspace, tested by cmd/sandgate TestRESTFiles",
		"putFile 408":    "needs a client that stops sending mid-body for the stall timeout: tested by cmd/sandgate TestRESTUploadStall",
	})
}

func filesLog(b *syncBuffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// sessionWorkdir is the host directory of a session's workdir sandbox.
func sessionWorkdir(t *testing.T, g *testGateway, id string) string {
	t.Helper()
	s, err := g.mgr.Get(context.Background(), gateway.Principal{Tenant: "alice"}, id)
	if err != nil {
		t.Fatal(err)
	}
	return s.Sandbox().Workdir()
}
