package rest_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/rest"
)

// portLink makes a preview link to port of session id on g and returns
// its URL.
func portLink(t *testing.T, g *testGateway, id string, port int) string {
	t.Helper()
	r := g.do(t, http.MethodPost, "/v1/sessions/"+id+"/ports/link", aliceKey, []byte(fmt.Sprintf(`{"port": %d}`, port)))
	expect(t, r, http.StatusOK, "")
	var l linkOut
	if err := json.Unmarshal(r.body, &l); err != nil {
		t.Fatal(err)
	}
	return l.URL
}

// TestPreviewHeaderRules: what a preview's server sends is filtered so it
// gets no foothold outside its own origin. On the API's origin (the bearer
// route): a CSP sandbox, no cookies either way, no Service-Worker-Allowed,
// no Clear-Site-Data. On the preview's origin: no Service-Worker-Allowed,
// host-only cookies, Referrer-Policy same-origin. On both: no service
// worker's script, no redirect off the preview.
func TestPreviewHeaderRules(t *testing.T) {
	g := newGateway(t, gwOptions{})
	up := startUpstream(t)
	s := g.create(t, aliceKey, "")
	prefix := fmt.Sprintf("/v1/sessions/%s/ports/%d", s.SessionID, up.port)
	origin, _ := previewOrigin(t, g, portLink(t, g, s.SessionID, up.port), s.SessionID, up.port)

	t.Run("api origin", func(t *testing.T) {
		r := rawDo(t, g, http.MethodGet, prefix+"/hostile", aliceKey)
		if r.status != 200 || !bytes.Contains(r.body, []byte("serviceWorker")) {
			t.Fatalf("hostile page: %d %s", r.status, r.body)
		}
		if v := r.header.Values("Content-Security-Policy"); len(v) != 2 || v[0] != "sandbox" || v[1] != "img-src 'none'" {
			t.Errorf("Content-Security-Policy %q, want sandbox first, then the server's", v)
		}
		for _, h := range []string{"Service-Worker-Allowed", "Set-Cookie", "Clear-Site-Data"} {
			if v := r.header.Values(h); len(v) > 0 {
				t.Errorf("%s passed to the API's origin: %q", h, v)
			}
		}
		if e := decodeEcho(t, rawDo(t, g, http.MethodGet, prefix+"/echo", aliceKey, "Cookie", "api=1")); e.Cookie != "" {
			t.Errorf("the API origin's cookies reached the sandbox: %q", e.Cookie)
		}
		expect(t, rawDo(t, g, http.MethodGet, prefix+"/sw.js", aliceKey, "Service-Worker", "script"), 403, "service_worker_refused")
	})

	t.Run("preview origin", func(t *testing.T) {
		r := rawDo(t, g, http.MethodGet, origin+"/hostile", "")
		if r.status != 200 {
			t.Fatalf("hostile page: %d %s", r.status, r.body)
		}
		if v := r.header.Values("Service-Worker-Allowed"); len(v) > 0 {
			t.Errorf("Service-Worker-Allowed passed: %q", v)
		}
		want := []string{"wide=1; Path=/; HttpOnly", "narrow=2; Path=/"}
		if v := r.header.Values("Set-Cookie"); !slices.Equal(v, want) {
			t.Errorf("Set-Cookie %q, want %q (no Domain)", v, want)
		}
		if v := r.header.Values("Content-Security-Policy"); !slices.Equal(v, []string{"img-src 'none'"}) {
			t.Errorf("Content-Security-Policy %q: the page runs as its server says on its own origin", v)
		}
		if v := r.header.Get("Referrer-Policy"); v != "same-origin" {
			t.Errorf("Referrer-Policy %q", v)
		}
		expect(t, g.do(t, http.MethodGet, origin+"/sw.js", "", nil, "Service-Worker", "script"), 403, "service_worker_refused") // The API is not on a preview origin: its paths are the sandbox's.
		r = rawDo(t, g, http.MethodGet, origin+"/v1/sessions", aliceKey)
		if e := decodeEcho(t, r); r.status != 200 || e.Path != "/v1/sessions" || e.Auth != "" {
			t.Errorf("/v1/sessions on the preview origin: %d %+v", r.status, e)
		}
	})

	t.Run("redirects", func(t *testing.T) {
		own := fmt.Sprintf("localhost:%d", up.port)
		other := "http://p80-aaaaaaaaaaaaaaaaaaaa-" + strings.Repeat("b", 34) + ".localhost:" + strings.Split(origin, ":")[2]
		for _, c := range []struct {
			to, onOrigin, onAPI string // "": refused
		}{
			{"/x?y=1#f", "/x?y=1#f", prefix + "/x?y=1#f"},
			{"rel/x", "rel/x", "rel/x"},
			{"http://" + own + "/a", "/a", prefix + "/a"},
			{fmt.Sprintf("http://127.0.0.1:%d/a", up.port), "/a", prefix + "/a"},
			{fmt.Sprintf("http://[::1]:%d/a", up.port), "/a", prefix + "/a"},
			{origin + "/kept", origin + "/kept", ""},
			{fmt.Sprintf("http://localhost:%d/a", up.port+1), "", ""},
			{"https://" + own + "/a", "", ""},
			{"https://evil.example/", "", ""},
			{"//evil.example/x", "", ""},
			{"/\\evil.example/x", "", ""},
			{"/\t/evil.example/x", "", ""},
			{"javascript:alert(1)", "", ""},
			{"http://user@" + own + "/a", "", ""},
			{other + "/x", "", ""},
		} {
			for _, at := range []struct{ base, want, token string }{{origin, c.onOrigin, ""}, {prefix, c.onAPI, aliceKey}} {
				r := rawDo(t, g, http.MethodGet, at.base+"/goto?to="+url.QueryEscape(c.to), at.token)
				if at.want == "" {
					if r.status != http.StatusBadGateway || !bytes.Contains(r.body, []byte(`"port_redirect_refused"`)) {
						t.Errorf("redirect to %q on %s: %d %q %s, want 502 port_redirect_refused", c.to, at.base, r.status, r.header.Get("Location"), r.body)
					}
					continue
				}
				if r.status != http.StatusFound || r.header.Get("Location") != at.want {
					t.Errorf("redirect to %q on %s: %d %q, want %q", c.to, at.base, r.status, r.header.Get("Location"), at.want)
				}
			}
		}
	})
}

// forgedPost sends a POST to g with the Host header host, as a client
// may, and returns the answer unchecked (the spec knows no such host).
func forgedPost(t *testing.T, g *testGateway, path, host, body string) result {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, g.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	req.Header.Set("Authorization", "Bearer "+aliceKey)
	req.Header.Set("Content-Type", "application/json")
	res, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return result{status: res.StatusCode, header: res.Header, body: b}
}

// TestLinkURLsIgnoreHost: presigned links and preview URLs are built from
// the configured public URL, or without one from the address the
// connection reached, never from the request's Host header, which the
// client chooses (issue 34, item 13).
func TestLinkURLsIgnoreHost(t *testing.T) {
	up := startUpstream(t)
	t.Run("listen address", func(t *testing.T) {
		g := newGateway(t, gwOptions{})
		s := g.create(t, aliceKey, "")
		r := forgedPost(t, g, "/v1/sessions/"+s.SessionID+"/ports/link", "evil.example:666", fmt.Sprintf(`{"port": %d}`, up.port))
		expect(t, r, http.StatusOK, "")
		var l linkOut
		_ = json.Unmarshal(r.body, &l)
		if strings.Contains(l.URL, "evil") || strings.Contains(l.URL, "666") {
			t.Errorf("the link follows the Host header: %s", l.URL)
		}
		origin, _ := previewOrigin(t, g, l.URL, s.SessionID, up.port)
		expect(t, g.do(t, http.MethodGet, origin+"/echo", "", nil), http.StatusOK, "")
	})
	t.Run("public url", func(t *testing.T) {
		g := newGateway(t, gwOptions{publicURL: "https://sandgate.example.com:8443/api", previewDomain: "preview.example.com"})
		s := g.create(t, aliceKey, "")
		r := forgedPost(t, g, "/v1/sessions/"+s.SessionID+"/ports/link", "evil.example", fmt.Sprintf(`{"port": %d}`, up.port))
		expect(t, r, http.StatusOK, "")
		var l linkOut
		_ = json.Unmarshal(r.body, &l)
		u, err := url.Parse(l.URL)
		if err != nil || u.Scheme != "https" || u.Port() != "8443" || u.Path != "/" ||
			!strings.HasPrefix(u.Hostname(), fmt.Sprintf("p%d-", up.port)) || !strings.HasSuffix(u.Hostname(), ".preview.example.com") {
			t.Fatalf("preview URL %q, want https://p%d-....preview.example.com:8443/", l.URL, up.port)
		}
		// The preview domain's names reach the preview (a proxy in front
		// passes the Host on); localhost's are the API's here.
		r = rawDo(t, g, http.MethodGet, "/echo", "", "Host", u.Host)
		if e := decodeEcho(t, r); r.status != 200 || e.Path != "/echo" {
			t.Errorf("on the preview domain: %d %s", r.status, r.body)
		}
		label, _, _ := strings.Cut(u.Hostname(), ".")
		r = rawDo(t, g, http.MethodGet, "/echo", "", "Host", label+".localhost")
		expect(t, r, http.StatusNotFound, "unknown_endpoint")
	})
}

// TestFileLinkSandboxed: a presigned file link, on the API's origin,
// serves its file as an attachment that is never sniffed or run (CSP
// sandbox), refuses to be a service worker's script, and is built from
// the connection's address, never the Host header; GET /files is
// sandboxed the same way.
func TestFileLinkSandboxed(t *testing.T) {
	bin := filesTestBinary(t)
	g := filesGateway(t, nil, bin, 0, rest.DataPlane{})
	s := g.create(t, aliceKey, "")
	base := "/v1/sessions/" + s.SessionID
	page := "<html><script>navigator.serviceWorker.register('x')</script></html>"
	expect(t, g.do(t, http.MethodPut, base+"/files?path=dir/page.html&mkdirs=true", aliceKey, []byte(page), "Content-Type", "application/octet-stream"), 201, "")
	r := forgedPost(t, g, base+"/files/link", "evil.example", `{"path": "dir/page.html"}`)
	expect(t, r, http.StatusOK, "")
	var l linkOut
	_ = json.Unmarshal(r.body, &l)
	u, err := url.Parse(l.URL)
	if err != nil || u.Host != g.addr || !strings.HasPrefix(u.Path, "/links/") {
		t.Fatalf("file link %q, want one on %s", l.URL, g.addr)
	}
	r = g.do(t, http.MethodGet, u.Path, "", nil)
	expect(t, r, http.StatusOK, "")
	if string(r.body) != page {
		t.Errorf("body %q", r.body)
	}
	for h, want := range map[string]string{
		"Content-Disposition":     `attachment; filename=page.html`,
		"X-Content-Type-Options":  "nosniff",
		"Content-Security-Policy": "sandbox",
		"Content-Type":            "application/octet-stream",
	} {
		if got := r.header.Get(h); got != want {
			t.Errorf("%s: %q, want %q", h, got, want)
		}
	}
	r = g.do(t, http.MethodGet, u.Path, "", nil, "Service-Worker", "script")
	expect(t, r, http.StatusForbidden, "service_worker_refused")
	r = g.do(t, http.MethodGet, base+"/files?path=dir/page.html", aliceKey, nil)
	expect(t, r, http.StatusOK, "")
	if r.header.Get("X-Content-Type-Options") != "nosniff" || r.header.Get("Content-Security-Policy") != "sandbox" {
		t.Errorf("GET /files headers %v", r.header)
	}
}
