package rest_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/rest"
)

// linkOut is a link as the API answers it.
type linkOut struct {
	URL       string    `json:"url"`
	ExpiresAt time.Time `json:"expiresAt"`
}

// linkPath is the path (with the token) of a link URL, checked to be
// absolute on g's origin.
func linkPath(t *testing.T, g *testGateway, r result) string {
	t.Helper()
	var l linkOut
	if err := json.Unmarshal(r.body, &l); err != nil {
		t.Fatalf("decode link %q: %v", r.body, err)
	}
	u, err := url.Parse(l.URL)
	if err != nil || u.Scheme != "http" || u.Host != g.addr || !strings.HasPrefix(u.Path, "/links/") {
		t.Fatalf("link URL %q is not an absolute link on %s", l.URL, g.addr)
	}
	return u.Path
}

// tamper returns the link path with its token changed by edit, which gets
// the decoded payload and signature.
func tamper(t *testing.T, path string, edit func(payload map[string]any, sig []byte)) string {
	t.Helper()
	enc, sigEnc, _ := strings.Cut(strings.TrimPrefix(path, "/links/"), ".")
	data, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := base64.RawURLEncoding.DecodeString(sigEnc)
	if err != nil {
		t.Fatal(err)
	}
	var p map[string]any
	if err := json.Unmarshal(data, &p); err != nil {
		t.Fatal(err)
	}
	edit(p, sig)
	data, _ = json.Marshal(p)
	return "/links/" + base64.RawURLEncoding.EncodeToString(data) + "." + base64.RawURLEncoding.EncodeToString(sig)
}

func TestContractLinks(t *testing.T) {
	cov := newCoverage()
	bin := filesTestBinary(t)
	g := filesGateway(t, cov, bin, 0, rest.DataPlane{})
	s := g.create(t, aliceKey, `{"name": "links-1"}`)
	base := "/v1/sessions/" + s.SessionID
	octet := []string{"Content-Type", "application/octet-stream"}
	expect(t, g.do(t, http.MethodPut, base+"/files?path=report.txt", aliceKey, []byte("0123456789"), octet...), 201, "")
	expect(t, g.do(t, http.MethodPut, base+"/files?path=dir/x&mkdirs=true", aliceKey, []byte("x"), octet...), 201, "")
	mkLink := func(body string) result {
		t.Helper()
		return g.do(t, http.MethodPost, base+"/files/link", aliceKey, []byte(body))
	}

	var good string
	t.Run("create", func(t *testing.T) {
		r := mkLink(`{"path": "report.txt"}`)
		expect(t, r, 200, "")
		good = linkPath(t, g, r)
		var l linkOut
		_ = json.Unmarshal(r.body, &l)
		if d := time.Until(l.ExpiresAt); d < 3590*time.Second || d > 3601*time.Second {
			t.Errorf("default expiry in %v, want an hour", d)
		}
		expect(t, mkLink(`{"path": "report.txt", "expiresIn": 604800}`), 200, "")
		for _, c := range []struct{ body, code string }{
			{`{"path": "report.txt", "expiresIn": 604801}`, "invalid_expires_in"},
			{`{"path": "report.txt", "expiresIn": 0}`, "invalid_expires_in"},
			{`{}`, "invalid_path"},
			{`{"path": ""}`, "invalid_path"},
			{`{"path": "a", "extra": 1}`, "unknown_field"},
			{`{"path": 5}`, "invalid_field"},
		} {
			expect(t, mkLink(c.body), 400, c.code)
		}
		expect(t, mkLink(`{"path": "missing"}`), 404, "file_not_found")
		expect(t, mkLink(`{"path": "dir"}`), 409, "is_a_directory")
		if err := os.Symlink("/", filepath.Join(sessionWorkdir(t, g, s.SessionID), "rootlink")); err != nil {
			t.Fatal(err)
		}
		expect(t, mkLink(`{"path": "rootlink/etc/hostname"}`), 403, "permission_denied")
		expect(t, mkLink(`{"path": "`+strings.Repeat("a", 70<<10)+`"}`), 413, "body_too_large")
		expect(t, g.do(t, http.MethodPost, base+"/files/link", "", []byte(`{"path": "report.txt"}`)), 401, "unauthorized")
		expect(t, g.do(t, http.MethodPost, base+"/files/link", bobKey, []byte(`{"path": "report.txt"}`)), 404, "not_found")
	})

	t.Run("fetch", func(t *testing.T) {
		r := g.do(t, http.MethodGet, good, "", nil)
		expect(t, r, 200, "")
		if string(r.body) != "0123456789" {
			t.Errorf("link body %q", r.body)
		}
		r = g.do(t, http.MethodGet, good, "", nil, "Range", "bytes=2-4")
		expect(t, r, 206, "")
		if string(r.body) != "234" {
			t.Errorf("range body %q", r.body)
		}
		if r := g.do(t, http.MethodGet, good, "", nil, "Range", "bytes=50-60"); r.status != 416 {
			t.Errorf("unsatisfiable range: %d, want 416", r.status)
		}
		expect(t, g.do(t, http.MethodGet, good, "", nil, "If-Modified-Since", time.Now().Add(time.Hour).UTC().Format(http.TimeFormat)), 304, "")
		// A bearer token changes nothing: the link is the credential.
		expect(t, g.do(t, http.MethodGet, good, bobKey, nil), 200, "")
		if !strings.Contains(g.logs.String(), "link_fetch") {
			t.Error("no link_fetch log")
		}
		sig := good[strings.LastIndexByte(good, '.')+1:]
		if strings.Contains(g.logs.String(), sig) {
			t.Error("the log holds a link's signature")
		}
	})

	t.Run("tamper", func(t *testing.T) {
		for name, p := range map[string]string{
			"signature": tamper(t, good, func(_ map[string]any, sig []byte) { sig[0] ^= 1 }),
			"path":      tamper(t, good, func(p map[string]any, _ []byte) { p["p"] = "dir/x" }),
			"expiry":    tamper(t, good, func(p map[string]any, _ []byte) { p["e"] = p["e"].(float64) + 1 }),
			"garbage":   "/links/not-a-token",
			"no sig":    "/links/" + strings.SplitN(strings.TrimPrefix(good, "/links/"), ".", 2)[0] + ".",
		} {
			r := g.do(t, http.MethodGet, p, "", nil)
			expect(t, r, 403, "link_invalid")
			if r.status == 403 && !strings.Contains(r.errorMessage(), "invalid") {
				t.Errorf("%s: message %q does not say invalid", name, r.errorMessage())
			}
		}
	})

	t.Run("expired", func(t *testing.T) {
		r := mkLink(`{"path": "report.txt", "expiresIn": 1}`)
		expect(t, r, 200, "")
		p := linkPath(t, g, r)
		time.Sleep(2100 * time.Millisecond)
		r = g.do(t, http.MethodGet, p, "", nil)
		expect(t, r, 403, "link_expired")
		if !strings.Contains(r.errorMessage(), "expired") {
			t.Errorf("message %q", r.errorMessage())
		}
	})

	t.Run("swapped", func(t *testing.T) {
		expect(t, g.do(t, http.MethodPut, base+"/files?path=swap.txt", aliceKey, []byte("ok"), octet...), 201, "")
		expect(t, g.do(t, http.MethodPut, base+"/files?path=gone.txt", aliceKey, []byte("ok"), octet...), 201, "")
		expect(t, g.do(t, http.MethodPut, base+"/files?path=todir.txt", aliceKey, []byte("ok"), octet...), 201, "")
		swap := linkPath(t, g, mkLink(`{"path": "swap.txt"}`))
		gone := linkPath(t, g, mkLink(`{"path": "gone.txt"}`))
		todir := linkPath(t, g, mkLink(`{"path": "todir.txt"}`))
		wd := sessionWorkdir(t, g, s.SessionID)
		// A symlink out of the sandbox swapped in after signing.
		if err := os.Remove(filepath.Join(wd, "swap.txt")); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("/etc/hostname", filepath.Join(wd, "swap.txt")); err != nil {
			t.Fatal(err)
		}
		r := g.do(t, http.MethodGet, swap, "", nil)
		expect(t, r, 403, "permission_denied")
		if host, _ := os.ReadFile("/etc/hostname"); len(host) > 0 && strings.Contains(string(r.body), strings.TrimSpace(string(host))) {
			t.Error("the link leaked a host file")
		}
		expect(t, g.do(t, http.MethodDelete, base+"/files?path=gone.txt", aliceKey, nil), 204, "")
		expect(t, g.do(t, http.MethodGet, gone, "", nil), 404, "file_not_found")
		if err := os.Remove(filepath.Join(wd, "todir.txt")); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(filepath.Join(wd, "todir.txt"), 0o755); err != nil {
			t.Fatal(err)
		}
		expect(t, g.do(t, http.MethodGet, todir, "", nil), 409, "is_a_directory")
	})

	t.Run("logs", func(t *testing.T) {
		expect(t, g.do(t, http.MethodPost, base+"/commands", aliceKey, []byte(`{"command": "echo logged-cmd"}`)), 200, "")
		r := g.do(t, http.MethodPost, base+"/processes", aliceKey, []byte(`{"command": "for i in 1 2 3; do echo bg-line-$i; done"}`))
		expect(t, r, 201, "")
		deadline := time.Now().Add(10 * time.Second)
		var text string
		for time.Now().Before(deadline) {
			r = g.do(t, http.MethodGet, base+"/logs", aliceKey, nil)
			expect(t, r, 200, "")
			if text = string(r.body); strings.Contains(text, "bg-line-3") {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
			t.Errorf("Content-Type %q", ct)
		}
		for _, want := range []string{"echo logged-cmd", "rest exit=0", "== process p1", "bg-line-1", "bg-line-3"} {
			if !strings.Contains(text, want) {
				t.Errorf("logs lack %q:\n%s", want, text)
			}
		}
		r = g.do(t, http.MethodGet, base+"/logs?tail=1", aliceKey, nil)
		expect(t, r, 200, "")
		if strings.Contains(string(r.body), "bg-line-2") || !strings.Contains(string(r.body), "bg-line-3") {
			t.Errorf("tail=1:\n%s", r.body)
		}
		for _, q := range []string{"?tail=0", "?tail=10001", "?tail=x", "?tail="} {
			expect(t, g.do(t, http.MethodGet, base+"/logs"+q, aliceKey, nil), 400, "invalid_tail")
		}
		expect(t, g.do(t, http.MethodGet, base+"/logs", "", nil), 401, "unauthorized")
		expect(t, g.do(t, http.MethodGet, base+"/logs", bobKey, nil), 404, "not_found")
	})

	t.Run("names", func(t *testing.T) {
		r := g.do(t, http.MethodGet, base, aliceKey, nil)
		expect(t, r, 200, "")
		var named struct{ Name string }
		if _ = json.Unmarshal(r.body, &named); named.Name != "links-1" {
			t.Errorf("session's name %q, want links-1", named.Name)
		}
		r = g.do(t, http.MethodPost, "/v1/sessions", aliceKey, []byte(`{"name": "links-1"}`))
		expect(t, r, 409, "name_taken")
		expect(t, g.do(t, http.MethodPost, "/v1/sessions", aliceKey, []byte(`{"name": "-bad"}`)), 400, "invalid_name")
		expect(t, g.do(t, http.MethodPost, "/v1/sessions", aliceKey, []byte(`{"name": ""}`)), 400, "invalid_name")
		r = g.do(t, http.MethodGet, "/v1/sessions?name=links-1", aliceKey, nil)
		expect(t, r, 200, "")
		var l listOut
		_ = json.Unmarshal(r.body, &l)
		if l.Total != 1 || len(l.Sessions) != 1 || l.Sessions[0].SessionID != s.SessionID {
			t.Errorf("?name=links-1: %s", r.body)
		}
		r = g.do(t, http.MethodGet, "/v1/sessions?name=links-1", bobKey, nil)
		expect(t, r, 200, "")
		if _ = json.Unmarshal(r.body, &l); l.Total != 0 {
			t.Errorf("bob finds alice's name: %s", r.body)
		}
		expect(t, g.do(t, http.MethodGet, "/v1/sessions?name=", aliceKey, nil), 400, "invalid_name")
	})

	t.Run("session gone", func(t *testing.T) {
		s2 := g.create(t, aliceKey, "")
		b2 := "/v1/sessions/" + s2.SessionID
		expect(t, g.do(t, http.MethodPut, b2+"/files?path=f", aliceKey, []byte("x"), octet...), 201, "")
		p := linkPath(t, g, g.do(t, http.MethodPost, b2+"/files/link", aliceKey, []byte(`{"path": "f"}`)))
		expect(t, g.do(t, http.MethodGet, p, "", nil), 200, "")
		expect(t, g.do(t, http.MethodDelete, b2, aliceKey, nil), 204, "")
		expect(t, g.do(t, http.MethodGet, p, "", nil), 410, "link_gone")
	})

	t.Run("session tombstone", func(t *testing.T) {
		expectGone(t, g,
			goneCall{method: http.MethodPost, sub: "/files/link", body: []byte(`{"path": "f"}`)},
			goneCall{method: http.MethodGet, sub: "/logs"})
	})

	t.Run("sandbox gone", func(t *testing.T) {
		g3 := filesGateway(t, cov, bin, 0, rest.DataPlane{})
		s3 := g3.create(t, aliceKey, "")
		b3 := "/v1/sessions/" + s3.SessionID
		expect(t, g3.do(t, http.MethodPut, b3+"/files?path=f", aliceKey, []byte("x"), octet...), 201, "")
		p := linkPath(t, g3, g3.do(t, http.MethodPost, b3+"/files/link", aliceKey, []byte(`{"path": "f"}`)))
		sess, err := g3.mgr.Get(context.Background(), gateway.Principal{Tenant: "alice"}, s3.SessionID)
		if err != nil {
			t.Fatal(err)
		}
		if err := sess.Sandbox().Destroy(context.Background()); err != nil {
			t.Fatal(err)
		}
		expect(t, g3.do(t, http.MethodPost, b3+"/files/link", aliceKey, []byte(`{"path": "f"}`)), 503, "files_unavailable")
		expect(t, g3.do(t, http.MethodGet, p, "", nil), 503, "files_unavailable")
	})

	t.Run("not running", func(t *testing.T) {
		store := gateway.NewMemStore()
		id := putLostSession(t, store, "alice")
		fg := newGateway(t, gwOptions{store: store, restore: true, cov: cov})
		expect(t, fg.do(t, http.MethodPost, "/v1/sessions/"+id+"/files/link", aliceKey, []byte(`{"path": "f"}`)), 409, "session_not_running")
		// A failed session's logs can still be read.
		expect(t, fg.do(t, http.MethodGet, "/v1/sessions/"+id+"/logs", aliceKey, nil), 200, "")
	})

	t.Run("rate limited", func(t *testing.T) {
		g4 := filesGateway(t, cov, bin, 3, rest.DataPlane{}) // create, put, link
		s4 := g4.create(t, aliceKey, "")
		b4 := "/v1/sessions/" + s4.SessionID
		expect(t, g4.do(t, http.MethodPut, b4+"/files?path=f", aliceKey, []byte("x"), octet...), 201, "")
		expect(t, g4.do(t, http.MethodPost, b4+"/files/link", aliceKey, []byte(`{"path": "f"}`)), 200, "")
		expect(t, g4.do(t, http.MethodPost, b4+"/files/link", aliceKey, []byte(`{"path": "f"}`)), 429, "rate_limited")
		expect(t, g4.do(t, http.MethodGet, b4+"/logs", aliceKey, nil), 429, "rate_limited")
		// Invalid links count like failed authentications, per address.
		for range 3 {
			expect(t, g4.do(t, http.MethodGet, "/links/x.y", "", nil), 403, "link_invalid")
		}
		expect(t, g4.do(t, http.MethodGet, "/links/x.y", "", nil), 429, "rate_limited")
	})

	// (Port links are TestContractPorts'.)
	requireSeen(t, cov, func(p string) bool {
		return (strings.Contains(p, "/link") || strings.Contains(p, "/logs")) && !strings.Contains(p, "/ports")
	}, map[string]string{
		"createFileLink 500": "no failure path short of a broken SFTP server in the sandbox",
		"fetchFileLink 500":  "no failure path short of a broken SFTP server in the sandbox",
		"getSessionLogs 500": "the logs have no failure path: history and output are in memory or local files",
	})
}
