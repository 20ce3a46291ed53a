package rest_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/internal/gwtest"
	"github.com/sandgate/sandgate/rest"
	"github.com/sandgate/sandgate/sandbox"
)

// statsOut is GET /stats as the tests read it.
type statsOut struct {
	SessionID string `json:"sessionId"`
	Status    string `json:"status"`
	Memory    *struct {
		CurrentBytes int64 `json:"currentBytes"`
	} `json:"memory"`
	CPU  *struct{ Seconds float64 } `json:"cpu"`
	Pids *struct{ Current int64 }   `json:"pids"`
	Disk *struct {
		UsedBytes  int64  `json:"usedBytes"`
		TotalBytes *int64 `json:"totalBytes"`
	} `json:"disk"`
	Tunnel struct{ BytesIn, BytesOut int64 } `json:"tunnel"`
	Egress struct{ BytesIn, BytesOut int64 } `json:"egress"`
}

// statsFailDriver makes sandboxes whose Stats fails.
type statsFailDriver struct{ gateway.Driver }

func (d statsFailDriver) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	sb, err := d.Driver.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	return statsFailSandbox{sb}, nil
}

type statsFailSandbox struct{ sandbox.Sandbox }

func (statsFailSandbox) Stats(context.Context) (sandbox.Stats, error) {
	return sandbox.Stats{}, errors.New("cgroup unreadable: /sys/fs/cgroup/secret-host-path")
}

func TestContractStats(t *testing.T) {
	cov := newCoverage()
	g := newGateway(t, gwOptions{cov: cov})
	s := g.create(t, aliceKey, "")
	path := "/v1/sessions/" + s.SessionID + "/stats"

	t.Run("workdir", func(t *testing.T) {
		sess, err := g.mgr.Get(context.Background(), gateway.Principal{Tenant: "alice"}, s.SessionID)
		if err != nil {
			t.Fatal(err)
		}
		before := sess.LastActivity()
		if err := os.WriteFile(filepath.Join(g.root, s.SessionID, "blob"), bytes.Repeat([]byte("x"), 256<<10), 0o600); err != nil {
			t.Fatal(err)
		}
		r := g.do(t, http.MethodGet, path, aliceKey, nil)
		expect(t, r, 200, "")
		var st statsOut
		if err := json.Unmarshal(r.body, &st); err != nil {
			t.Fatal(err)
		}
		if st.SessionID != s.SessionID || st.Status != "running" {
			t.Errorf("stats of %q status %q", st.SessionID, st.Status)
		}
		// workdir knows its disk use and nothing else.
		if st.Disk == nil || st.Disk.UsedBytes < 256<<10 || st.Disk.TotalBytes != nil {
			t.Errorf("disk %+v, want >= 256 KiB used and no total", st.Disk)
		}
		if st.Memory != nil || st.CPU != nil || st.Pids != nil {
			t.Errorf("workdir reported cgroup numbers: %s", r.body)
		}
		if after := sess.LastActivity(); !after.Equal(before) {
			t.Errorf("reading stats counted as activity: %v -> %v", before, after)
		}
	})

	t.Run("errors", func(t *testing.T) {
		expect(t, g.do(t, http.MethodGet, path, "", nil), 401, "unauthorized")
		expect(t, g.do(t, http.MethodGet, path, bobKey, nil), 404, "not_found")
		expect(t, g.do(t, http.MethodGet, "/v1/sessions/sbx-aaaaaaaaaaaaaaaaaaaa/stats", aliceKey, nil), 404, "not_found")

		store := gateway.NewMemStore()
		lost := putLostSession(t, store, "alice")
		fg := newGateway(t, gwOptions{store: store, restore: true, cov: cov})
		expect(t, fg.do(t, http.MethodGet, "/v1/sessions/"+lost+"/stats", aliceKey, nil), 409, "session_not_running")

		bg := newGateway(t, gwOptions{cov: cov, wrapDriver: func(d gateway.Driver) gateway.Driver { return statsFailDriver{d} }})
		bs := bg.create(t, aliceKey, "")
		r := bg.do(t, http.MethodGet, "/v1/sessions/"+bs.SessionID+"/stats", aliceKey, nil)
		expect(t, r, 503, "stats_unavailable")
		if strings.Contains(string(r.body), "secret-host-path") {
			t.Errorf("the answer leaks the driver's error: %s", r.body)
		}

		d := g.create(t, aliceKey, "")
		expect(t, g.do(t, http.MethodDelete, "/v1/sessions/"+d.SessionID, aliceKey, nil), 204, "")
		expect(t, g.do(t, http.MethodGet, "/v1/sessions/"+d.SessionID+"/stats", aliceKey, nil), 410, "session_gone")
	})

	requireSeen(t, cov, func(p string) bool { return strings.HasSuffix(p, "/stats") }, nil)
}

// upstream is a server on the host's loopback standing in for a dev server
// in a workdir sandbox (whose loopback is the host's): /echo answers what
// it was sent, /redirect redirects on its own origin, /slow waits for
// release, /ws upgrades and echoes bytes.
type upstream struct {
	port    int
	release chan struct{}
	entered chan struct{}
}

type echoed struct {
	Method, Path, RawPath, Query, Host, Auth, XFF, XFHost, XFProto, XFPrefix, Referer, Cookie, Origin string
	Len                                                                                               int
}

func startUpstream(t *testing.T) *upstream {
	t.Helper()
	u := &upstream{release: make(chan struct{}), entered: make(chan struct{}, 128)}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		_ = json.NewEncoder(w).Encode(echoed{
			Method: r.Method, Path: r.URL.Path, RawPath: r.URL.RawPath, Query: r.URL.RawQuery, Host: r.Host,
			Auth: r.Header.Get("Authorization"), XFF: r.Header.Get("X-Forwarded-For"),
			XFHost: r.Header.Get("X-Forwarded-Host"), XFProto: r.Header.Get("X-Forwarded-Proto"),
			XFPrefix: r.Header.Get("X-Forwarded-Prefix"), Referer: r.Header.Get("Referer"), Len: int(n),
			Cookie: r.Header.Get("Cookie"), Origin: r.Header.Get("Origin"),
		})
	})
	// /hostile answers as a page that wants a foothold outside its preview
	// would: a service worker's scope over everything, cookies for the
	// whole domain, a policy of its own.
	mux.HandleFunc("/hostile", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Service-Worker-Allowed", "/")
		w.Header().Add("Set-Cookie", "wide=1; Domain=localhost; Path=/; HttpOnly")
		w.Header().Add("Set-Cookie", "narrow=2; Path=/")
		w.Header().Set("Content-Security-Policy", "img-src 'none'")
		w.Header().Set("Clear-Site-Data", `"storage"`)
		_, _ = io.WriteString(w, "<script>navigator.serviceWorker.register('/sw.js')</script>")
	})
	// /goto?to=URL redirects there.
	mux.HandleFunc("/goto", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", r.URL.Query().Get("to"))
		w.WriteHeader(http.StatusFound)
	})
	mux.HandleFunc("/redirect", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/target?a=1", http.StatusFound)
	})
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		u.entered <- struct{}{}
		<-u.release
		_, _ = io.WriteString(w, "slow done")
	})
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			http.Error(w, "want an upgrade", http.StatusBadRequest)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		_, _ = io.Copy(conn, brw) // echo until the client closes
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		select {
		case <-u.release:
		default:
			close(u.release)
		}
		_ = srv.Close()
	})
	u.port = ln.Addr().(*net.TCPAddr).Port
	return u
}

// garbageServer answers every connection with bytes that are not HTTP.
func garbageServer(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = io.WriteString(c, "this is not http\r\n\r\n")
			_ = c.Close()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	return ln.Addr().(*net.TCPAddr).Port
}

func decodeEcho(t *testing.T, r result) echoed {
	t.Helper()
	var e echoed
	if err := json.Unmarshal(r.body, &e); err != nil {
		t.Fatalf("upstream answer %q: %v", r.body, err)
	}
	return e
}

// rawGet sends a request the spec cannot describe (a path of several
// segments, no redirect following) and returns the answer.
func rawDo(t *testing.T, g *testGateway, method, path, token string, hdr ...string) result {
	t.Helper()
	u := g.url + path
	if strings.HasPrefix(path, "http://") {
		u = path
	}
	req, err := http.NewRequest(method, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i] == "Host" {
			req.Host = hdr[i+1]
			continue
		}
		req.Header.Set(hdr[i], hdr[i+1])
	}
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DialContext: dialLocalhost, DisableKeepAlives: true},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return result{status: res.StatusCode, header: res.Header, body: b}
}

// doNoFollow is rawDo checked against the spec: a redirect is the answer.
func doNoFollow(t *testing.T, g *testGateway, method, path string) result {
	t.Helper()
	r := rawDo(t, g, method, path, "")
	req, err := http.NewRequest(method, g.url+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	g.spec.check(t, req, nil, r)
	return r
}

// wsEcho upgrades path on g (with the headers given), sends a message and
// returns what came back.
func wsEcho(t *testing.T, g *testGateway, path string, hdr ...string) string {
	t.Helper()
	c, err := net.Dial("tcp", g.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	host := g.addr
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i] == "Host" {
			host = hdr[i+1]
		}
	}
	req := "GET " + path + " HTTP/1.1\r\nHost: " + host + "\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i] != "Host" {
			req += hdr[i] + ": " + hdr[i+1] + "\r\n"
		}
	}
	if _, err := io.WriteString(c, req+"\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != http.StatusSwitchingProtocols {
		b, _ := io.ReadAll(res.Body)
		t.Fatalf("upgrade %s: %d %s", path, res.StatusCode, b)
	}
	msg := "ping through the preview"
	if _, err := io.WriteString(c, msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(br, got); err != nil {
		t.Fatalf("read the echo: %v", err)
	}
	return string(got)
}

func TestContractPorts(t *testing.T) {
	cov := newCoverage()
	g := newGateway(t, gwOptions{cov: cov})
	up := startUpstream(t)
	s := g.create(t, aliceKey, "")
	prefix := fmt.Sprintf("/v1/sessions/%s/ports/%d", s.SessionID, up.port)

	t.Run("proxy", func(t *testing.T) {
		r := g.do(t, http.MethodGet, prefix+"/echo?x=1&y=%2F", aliceKey, nil, "X-Forwarded-For", "6.6.6.6")
		expect(t, r, 200, "")
		e := decodeEcho(t, r)
		want := echoed{Method: "GET", Path: "/echo", Query: "x=1&y=%2F", Host: fmt.Sprintf("localhost:%d", up.port),
			XFF: "127.0.0.1", XFHost: g.addr, XFProto: "http", XFPrefix: prefix}
		if e != want {
			t.Errorf("upstream saw %+v\nwant %+v", e, want)
		}
		r = g.do(t, http.MethodPost, prefix+"/echo", aliceKey, bytes.Repeat([]byte("b"), 100<<10))
		expect(t, r, 200, "")
		if e := decodeEcho(t, r); e.Method != "POST" || e.Len != 100<<10 || e.Auth != "" {
			t.Errorf("POST: upstream saw %+v", e)
		}
		for _, m := range []string{http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions, http.MethodTrace} {
			r := g.do(t, m, prefix+"/echo", aliceKey, []byte("{}"))
			expect(t, r, 200, "")
			if e := decodeEcho(t, r); e.Method != m {
				t.Errorf("%s arrived as %q", m, e.Method)
			}
		}
		r = g.do(t, http.MethodHead, prefix+"/echo", aliceKey, nil)
		expect(t, r, 200, "")
		if r := rawDo(t, g, http.MethodConnect, prefix+"/echo", aliceKey); r.status != http.StatusMethodNotAllowed {
			t.Errorf("CONNECT to a preview: %d %s", r.status, r.body)
		}
		// Paths of several segments, escapes kept as sent.
		r = rawDo(t, g, http.MethodGet, prefix+"/a/b%2Fc/", aliceKey)
		if e := decodeEcho(t, r); r.status != 200 || e.Path != "/a/b/c/" || e.RawPath != "/a/b%2Fc/" {
			t.Errorf("nested path: %d %+v", r.status, e)
		}
		r = rawDo(t, g, http.MethodGet, prefix+"/", aliceKey)
		if e := decodeEcho(t, r); r.status != 200 || e.Path != "/" {
			t.Errorf("root: %d %+v", r.status, e)
		}
		// The root without its slash redirects to it.
		r = rawDo(t, g, http.MethodGet, prefix+"?q=1", aliceKey)
		if r.status != http.StatusPermanentRedirect || r.header.Get("Location") != prefix+"/?q=1" {
			t.Errorf("no-slash root: %d Location %q", r.status, r.header.Get("Location"))
		}
		// A redirect on the server's own origin stays in the preview.
		r = rawDo(t, g, http.MethodGet, prefix+"/redirect", aliceKey)
		if r.status != http.StatusFound || r.header.Get("Location") != prefix+"/target?a=1" {
			t.Errorf("redirect: %d Location %q", r.status, r.header.Get("Location"))
		}
		if got := wsEcho(t, g, prefix+"/ws", "Authorization", "Bearer "+aliceKey); got != "ping through the preview" {
			t.Errorf("websocket echo %q", got)
		}
	})

	t.Run("errors", func(t *testing.T) {
		expect(t, g.do(t, http.MethodGet, prefix+"/echo", "", nil), 401, "unauthorized")
		expect(t, g.do(t, http.MethodPost, prefix+"/echo", "", []byte("x")), 401, "unauthorized")
		expect(t, g.do(t, http.MethodGet, prefix+"/echo", bobKey, nil), 404, "not_found")
		for _, p := range []string{"0", "65536", "99999", "123456", "+80", "0x50", "http"} {
			r := rawDo(t, g, http.MethodGet, "/v1/sessions/"+s.SessionID+"/ports/"+p+"/x", aliceKey)
			expect(t, r, 400, "invalid_port")
		}
		expect(t, g.do(t, http.MethodGet, "/v1/sessions/"+s.SessionID+"/ports/0/x", aliceKey, nil), 400, "invalid_port")
		closed := fmt.Sprintf("/v1/sessions/%s/ports/%d/x", s.SessionID, gwtest.FreePort(t))
		r := g.do(t, http.MethodGet, closed, aliceKey, nil)
		expect(t, r, 502, "port_unreachable")
		expect(t, g.do(t, http.MethodPost, closed, aliceKey, []byte("x")), 502, "port_unreachable")
		garbage := fmt.Sprintf("/v1/sessions/%s/ports/%d/x", s.SessionID, garbageServer(t))
		expect(t, g.do(t, http.MethodGet, garbage, aliceKey, nil), 502, "port_bad_response")
		expect(t, g.do(t, http.MethodPost, prefix+"/echo", aliceKey, make([]byte, 32<<20+1)), 413, "body_too_large")
		expect(t, g.do(t, http.MethodGet, prefix+"/echo", aliceKey, make([]byte, 32<<20+1)), 413, "body_too_large")

		store := gateway.NewMemStore()
		lost := putLostSession(t, store, "alice")
		fg := newGateway(t, gwOptions{store: store, restore: true, cov: cov})
		expect(t, fg.do(t, http.MethodGet, fmt.Sprintf("/v1/sessions/%s/ports/%d/x", lost, up.port), aliceKey, nil), 409, "session_not_running")
		expect(t, fg.do(t, http.MethodPost, "/v1/sessions/"+lost+"/ports/link", aliceKey, []byte(`{"port": 80}`)), 409, "session_not_running")

		d := g.create(t, aliceKey, "")
		expect(t, g.do(t, http.MethodDelete, "/v1/sessions/"+d.SessionID, aliceKey, nil), 204, "")
		expect(t, g.do(t, http.MethodGet, fmt.Sprintf("/v1/sessions/%s/ports/%d/x", d.SessionID, up.port), aliceKey, nil), 410, "session_gone")
		expect(t, g.do(t, http.MethodPost, "/v1/sessions/"+d.SessionID+"/ports/link", aliceKey, []byte(`{"port": 80}`)), 410, "session_gone")
	})

	t.Run("busy", func(t *testing.T) {
		bs := g.create(t, aliceKey, "")
		slow := fmt.Sprintf("/v1/sessions/%s/ports/%d/slow", bs.SessionID, up.port)
		var wg sync.WaitGroup
		for range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if r := rawDo(t, g, http.MethodGet, slow, aliceKey); r.status != 200 {
					t.Errorf("slow request: %d %s", r.status, r.body)
				}
			}()
		}
		for range 64 {
			<-up.entered
		}
		r := g.do(t, http.MethodGet, slow, aliceKey, nil)
		expect(t, r, 503, "too_many_connections")
		close(up.release)
		wg.Wait()
		// Freed again.
		expect(t, g.do(t, http.MethodGet, fmt.Sprintf("/v1/sessions/%s/ports/%d/echo", bs.SessionID, up.port), aliceKey, nil), 200, "")
	})

	t.Run("link", func(t *testing.T) {
		base := "/v1/sessions/" + s.SessionID + "/ports/link"
		r := g.do(t, http.MethodPost, base, aliceKey, []byte(fmt.Sprintf(`{"port": %d}`, up.port)))
		expect(t, r, 200, "")
		var l linkOut
		if err := json.Unmarshal(r.body, &l); err != nil {
			t.Fatal(err)
		}
		// An origin of its own: the session's and the port's, on the API's port.
		origin, label := previewOrigin(t, g, l.URL, s.SessionID, up.port)
		if d := time.Until(l.ExpiresAt); d < 3590*time.Second || d > 3601*time.Second {
			t.Errorf("default expiry in %v, want an hour", d)
		}
		own := fmt.Sprintf("localhost:%d", up.port)
		// No bearer token needed; one sent is not forwarded; the label
		// never reaches the server, which sees its own origin.
		r = g.do(t, http.MethodGet, origin+"/echo?z=2", bobKey, nil,
			"Referer", origin+"/index.html?q=1", "Origin", origin, "Cookie", "c=1")
		expect(t, r, 200, "")
		e := decodeEcho(t, r)
		want := echoed{Method: "GET", Path: "/echo", Query: "z=2", Host: own, XFF: "127.0.0.1", XFProto: "http",
			Referer: "http://" + own + "/index.html?q=1", Origin: "http://" + own, Cookie: "c=1"}
		if e != want {
			t.Errorf("through the preview origin the upstream saw %+v\nwant %+v", e, want)
		}
		// Another origin (another preview's, say) is Origin null and no Referer.
		other := "http://p80-aaaaaaaaaaaaaaaaaaaa-" + strings.Repeat("b", 34) + ".localhost:1"
		r = g.do(t, http.MethodGet, origin+"/echo", "", nil, "Origin", other, "Referer", other+"/x")
		if e := decodeEcho(t, r); e.Origin != "null" || e.Referer != "" {
			t.Errorf("another origin reached the server as Origin %q Referer %q", e.Origin, e.Referer)
		}
		r = rawDo(t, g, http.MethodGet, origin+"/a/b%2Fc", "")
		if e := decodeEcho(t, r); r.status != 200 || e.Path != "/a/b/c" || e.RawPath != "/a/b%2Fc" {
			t.Errorf("nested path on the preview origin: %d %+v", r.status, e)
		}
		r = rawDo(t, g, http.MethodGet, origin+"/redirect", "")
		if r.status != http.StatusFound || r.header.Get("Location") != "/target?a=1" {
			t.Errorf("redirect on the preview origin: %d %q", r.status, r.header.Get("Location"))
		}
		for _, m := range []string{http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions, http.MethodTrace} {
			expect(t, g.do(t, m, origin+"/echo", "", []byte("{}")), 200, "")
		}
		expect(t, g.do(t, http.MethodGet, origin+"/echo", "", make([]byte, 32<<20+1)), 413, "body_too_large")
		if got := wsEcho(t, g, "/ws", "Host", strings.TrimPrefix(origin, "http://")); got != "ping through the preview" {
			t.Errorf("websocket echo on the preview origin %q", got)
		}
		if strings.Contains(g.logs.String(), label[len(label)-previewSigChars:]) {
			t.Error("the log holds a preview label's signature")
		}

		// Tampered (another port, a changed signature, garbage), expired, dead.
		_, gport, _ := net.SplitHostPort(g.addr)
		at := func(label string) string { return "http://" + label + ".localhost:" + gport }
		port, rest, _ := strings.Cut(label, "-")
		for _, bad := range []string{"p22-" + rest, label[:len(label)-1] + flipChar(label[len(label)-1]), port + "-x", "p1"} {
			expect(t, g.do(t, http.MethodGet, at(bad)+"/echo", "", nil), 403, "link_invalid")
		}
		expect(t, g.do(t, http.MethodPost, base, aliceKey, []byte(`{"port": 0}`)), 400, "invalid_port")
		expect(t, g.do(t, http.MethodPost, base, aliceKey, []byte(`{}`)), 400, "invalid_port")
		expect(t, g.do(t, http.MethodPost, base, aliceKey, []byte(`{"port": 65536}`)), 400, "invalid_port")
		expect(t, g.do(t, http.MethodPost, base, aliceKey, []byte(`{"port": 80, "expiresIn": 604801}`)), 400, "invalid_expires_in")
		expect(t, g.do(t, http.MethodPost, base, aliceKey, []byte(`{"port": 80, "x": 1}`)), 400, "unknown_field")
		expect(t, g.do(t, http.MethodPost, base, aliceKey, []byte(`{"port": "80"}`)), 400, "invalid_field")
		expect(t, g.do(t, http.MethodPost, base, aliceKey, []byte(`{"port": 80, "pad": "`+strings.Repeat("a", 70<<10)+`"}`)), 413, "body_too_large")
		expect(t, g.do(t, http.MethodPost, base, "", []byte(`{"port": 80}`)), 401, "unauthorized")
		expect(t, g.do(t, http.MethodPost, base, bobKey, []byte(`{"port": 80}`)), 404, "not_found")

		r = g.do(t, http.MethodPost, base, aliceKey, []byte(fmt.Sprintf(`{"port": %d}`, gwtest.FreePort(t))))
		expect(t, r, 200, "")
		_ = json.Unmarshal(r.body, &l)
		expect(t, g.do(t, http.MethodGet, strings.TrimSuffix(l.URL, "/")+"/x", "", nil), 502, "port_unreachable")

		r = g.do(t, http.MethodPost, base, aliceKey, []byte(fmt.Sprintf(`{"port": %d, "expiresIn": 1}`, up.port)))
		expect(t, r, 200, "")
		_ = json.Unmarshal(r.body, &l)
		time.Sleep(2100 * time.Millisecond)
		expect(t, g.do(t, http.MethodGet, l.URL+"echo", "", nil), 403, "link_expired")

		d := g.create(t, aliceKey, "")
		r = g.do(t, http.MethodPost, "/v1/sessions/"+d.SessionID+"/ports/link", aliceKey, []byte(fmt.Sprintf(`{"port": %d}`, up.port)))
		expect(t, r, 200, "")
		_ = json.Unmarshal(r.body, &l)
		expect(t, g.do(t, http.MethodGet, l.URL+"echo", "", nil), 200, "")
		expect(t, g.do(t, http.MethodDelete, "/v1/sessions/"+d.SessionID, aliceKey, nil), 204, "")
		expect(t, g.do(t, http.MethodGet, l.URL+"echo", "", nil), 410, "link_gone")
	})

	t.Run("earlier links redirect", func(t *testing.T) {
		// A port link of the earlier form, /links/ports/{token}/, signed
		// with the gateway's key, opens nothing on the API's origin: it
		// redirects to the preview origin, which expires with it.
		key := []byte("0123456789abcdef0123456789abcdef")
		kg := newGateway(t, gwOptions{cov: cov, linkKey: key})
		ks := kg.create(t, aliceKey, "")
		exp := time.Now().Add(time.Hour).Unix()
		token := oldPortToken(key, "alice", ks.SessionID, up.port, exp)
		r := doNoFollow(t, kg, http.MethodGet, "/links/ports/"+token+"/echo?x=1")
		expect(t, r, http.StatusTemporaryRedirect, "")
		loc := r.header.Get("Location")
		origin, _ := previewOrigin(t, kg, strings.TrimSuffix(loc, "echo?x=1"), ks.SessionID, up.port)
		if loc != origin+"/echo?x=1" {
			t.Errorf("Location %q", loc)
		}
		r = kg.do(t, http.MethodPost, loc, "", []byte("{}"))
		if e := decodeEcho(t, r); r.status != 200 || e.Path != "/echo" || e.Query != "x=1" {
			t.Errorf("following the redirect: %d %+v", r.status, e)
		}
		r = rawDo(t, kg, http.MethodGet, "/links/ports/"+token, "")
		if r.status != http.StatusPermanentRedirect || r.header.Get("Location") != "/links/ports/"+token+"/" {
			t.Errorf("link without slash: %d %q", r.status, r.header.Get("Location"))
		}
		expect(t, kg.do(t, http.MethodGet, "/links/ports/"+oldPortToken(key, "bob", ks.SessionID, up.port, exp)+"/echo", "", nil), 403, "link_invalid")
		expect(t, kg.do(t, http.MethodGet, "/links/ports/"+oldPortToken(key, "alice", ks.SessionID, up.port, time.Now().Unix()-1)+"/x", "", nil), 403, "link_expired")
		expect(t, kg.do(t, http.MethodDelete, "/v1/sessions/"+ks.SessionID, aliceKey, nil), 204, "")
		expect(t, kg.do(t, http.MethodGet, "/links/ports/"+token+"/echo", "", nil), 410, "link_gone")
	})

	t.Run("link rate limited", func(t *testing.T) {
		lg := newGateway(t, gwOptions{cov: cov, rateLimit: 2})
		for i := range 3 {
			r := lg.do(t, http.MethodGet, "/links/ports/x.y/echo", "", nil)
			if i < 2 {
				expect(t, r, 403, "link_invalid")
			} else {
				expect(t, r, 429, "rate_limited")
			}
		}
		_, gport, _ := net.SplitHostPort(lg.addr)
		expect(t, lg.do(t, http.MethodGet, "http://p80-x.localhost:"+gport+"/echo", "", nil), 429, "rate_limited")
	})

	t.Run("disabled", func(t *testing.T) {
		og := noPortsGateway(t, g, cov)
		expect(t, og.do(t, http.MethodGet, prefix+"/echo", aliceKey, nil), 403, "ports_disabled")
		expect(t, og.do(t, http.MethodPost, "/v1/sessions/"+s.SessionID+"/ports/link", aliceKey, []byte(`{"port": 80}`)), 403, "ports_disabled")
		// A link signed while previews were on opens nothing now.
		r := g.do(t, http.MethodPost, "/v1/sessions/"+s.SessionID+"/ports/link", aliceKey, []byte(fmt.Sprintf(`{"port": %d}`, up.port)))
		var l linkOut
		_ = json.Unmarshal(r.body, &l)
		u, _ := url.Parse(l.URL)
		_, oport, _ := net.SplitHostPort(og.addr)
		expect(t, og.do(t, http.MethodGet, "http://"+u.Hostname()+":"+oport+"/echo", "", nil), 403, "ports_disabled")
		expect(t, og.do(t, http.MethodGet, "/links/ports/x.y/x", "", nil), 403, "ports_disabled")
	})

	// Every method is one handler: GET's answers are all seen (but the
	// 504), the other methods' 200s show they pass through it.
	unreachable := map[string]string{
		"proxyPortGet 504":     "the server's response headers are awaited 2 minutes: too long for a test",
		"previewOriginGet 504": "as proxyPortGet 504",
		"previewOriginGet 503": "the limiter of proxyPortGet 503, per session, whatever the route",
	}
	doc := loadSpec(t)
	for _, p := range []string{"/v1/sessions/{id}/ports/{port}/{path}", "/links/ports/{token}/{path}", "/{path}"} {
		for m, op := range doc.Paths.Value(p).Operations() {
			if m == http.MethodGet {
				continue
			}
			for code := range op.Responses.Map() {
				if code != "200" {
					unreachable[op.OperationID+" "+code] = "the same handler as GET, whose answers are seen"
				}
			}
		}
	}
	requireSeen(t, cov, func(p string) bool { return strings.Contains(p, "/ports/") || p == "/{path}" }, unreachable)
}

// previewSigChars is the length of a preview label's signature (the end
// of the label).
const previewSigChars = 26

// previewOrigin checks that u is the preview origin of session id's port
// on g (one label under localhost, on the API's port, path /) and returns
// the origin, without the final slash, and its label.
func previewOrigin(t *testing.T, g *testGateway, u, id string, port int) (string, string) {
	t.Helper()
	p, err := url.Parse(u)
	_, gport, _ := net.SplitHostPort(g.addr)
	label, ok := strings.CutSuffix(p.Hostname(), ".localhost")
	if err != nil || p.Scheme != "http" || p.Port() != gport || p.Path != "/" || !ok ||
		!strings.HasPrefix(label, fmt.Sprintf("p%d-%s-", port, strings.TrimPrefix(id, "sbx-"))) || len(label) > 63 {
		t.Fatalf("preview URL %q of %s port %d", u, id, port)
	}
	return strings.TrimSuffix(u, "/"), label
}

func flipChar(c byte) string {
	if c == 'a' {
		return "b"
	}
	return "a"
}

// oldPortToken is a port link of the earlier form (/links/ports/{token}/),
// as rest signed them: base64url(payload) "." base64url(HMAC-SHA256(key,
// domain 0 tenant 0 payload)).
func oldPortToken(key []byte, tenant, session string, port int, exp int64) string {
	enc := b64([]byte(fmt.Sprintf(`{"v":1,"s":%q,"port":%d,"e":%d}`, session, port, exp)))
	h := hmac.New(sha256.New, key)
	h.Write([]byte("sandgate-port-link-v1\x00" + tenant + "\x00" + enc))
	return enc + "." + b64(h.Sum(nil))
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

func flip(s string) string {
	if s[0] == 'A' {
		return "B" + s[1:]
	}
	return "A" + s[1:]
}

// noPortsGateway is g's manager behind an API built with NoPorts (what
// serve --ssh-allow-local-forward=false builds), with g's link key unknown
// to it: a link from g would not verify there anyway, so the refusal comes
// first.
func noPortsGateway(t *testing.T, g *testGateway, cov *coverage) *testGateway {
	t.Helper()
	verifier, err := gateway.NewVerifier(gateway.AuthConfig{APIKeys: map[string]string{aliceKey: "alice"}})
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(g.logs, nil))
	handler := rest.New(rest.Config{Sessions: g.mgr, Verifier: verifier, Log: log, SSHUsername: "sandbox", HostKeys: g.hostKeys, NoPorts: true})
	srv := newHTTPServer(handler, log)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	og := *g
	og.url, og.addr, og.handler = "http://"+ln.Addr().String(), ln.Addr().String(), handler
	og.spec = newSpecChecker(t, og.url, cov)
	return &og
}
