package rest_test

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/rest"
)

// TestCreateRejectsBadBodies: every bad body answers 400 or 413 with the
// offending field named, and creates nothing.
func TestCreateRejectsBadBodies(t *testing.T) {
	g := newGateway(t, gwOptions{})
	cases := []struct {
		name, body string
		status     int
		code       string
		mention    string // the message must contain this
	}{
		{"ttl below range", `{"ttl": 59}`, 400, "invalid_ttl", "ttl"},
		{"ttl above range", `{"ttl": 28801}`, 400, "invalid_ttl", "ttl"},
		{"ttl zero", `{"ttl": 0}`, 400, "invalid_ttl", "ttl"},
		{"ttl negative", `{"ttl": -3600}`, 400, "invalid_ttl", "ttl"},
		{"ttl string", `{"ttl": "3600"}`, 400, "invalid_field", "ttl"},
		{"ttl fraction", `{"ttl": 3600.5}`, 400, "invalid_field", "ttl"},
		{"ttl exponent", `{"ttl": 1e3}`, 400, "invalid_field", "ttl"},
		{"ttl overflow", `{"ttl": 99999999999999999999999}`, 400, "invalid_field", "ttl"},
		{"ttl bool", `{"ttl": true}`, 400, "invalid_field", "ttl"},
		{"image number", `{"image": 5}`, 400, "invalid_field", "image"},
		{"image object", `{"image": {}}`, 400, "invalid_field", "image"},
		{"metadata string", `{"metadata": "x"}`, 400, "invalid_field", "metadata"},
		{"metadata array", `{"metadata": [1]}`, 400, "invalid_field", "metadata"},
		{"sshPublicKey number", `{"sshPublicKey": 1}`, 400, "invalid_field", "sshPublicKey"},
		{"sshPublicKey garbage", `{"sshPublicKey": "hello"}`, 400, "invalid_ssh_public_key", "sshPublicKey"},
		{"unknown field", `{"tenant": "bob"}`, 400, "unknown_field", "tenant"},
		{"unknown field after good ones", `{"ttl": 60, "image": "default", "owner": 1}`, 400, "unknown_field", "owner"},
		{"array body", `[]`, 400, "invalid_json", ""},
		{"string body", `"hi"`, 400, "invalid_json", ""},
		{"truncated", `{"ttl": 60`, 400, "invalid_json", ""},
		{"not json", `ttl=60`, 400, "invalid_json", ""},
		{"two objects", `{}{}`, 400, "invalid_json", ""},
		{"trailing garbage", `{} x`, 400, "invalid_json", ""},
		{"trailing bracket", `{}]`, 400, "invalid_json", ""},
		{"over 64 KiB", `{"metadata": {"x": "` + strings.Repeat("a", rest.MaxBodyBytes) + `"}}`, 413, "body_too_large", ""},
		{"over 64 KiB of trailing space", `{}` + strings.Repeat(" ", rest.MaxBodyBytes), 413, "body_too_large", ""},
		{"over 64 KiB after a bad field", `{"ttl": 5, "image": "` + strings.Repeat("a", rest.MaxBodyBytes) + `"}`, 413, "body_too_large", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := g.do(t, http.MethodPost, "/v1/sessions", aliceKey, []byte(c.body))
			expect(t, r, c.status, c.code)
			if !strings.Contains(r.errorMessage(), c.mention) {
				t.Errorf("message %q does not name %q", r.errorMessage(), c.mention)
			}
		})
	}
	if n := g.sandboxDirs(t); n != 0 {
		t.Errorf("bad bodies created %d sandboxes", n)
	}
	if l := g.list(t, aliceKey); l.Total != 0 {
		t.Errorf("bad bodies created %d sessions", l.Total)
	}
}

// TestCreateBodyLimitBoundary: a body of exactly MaxBodyBytes is read, one
// byte more is 413.
func TestCreateBodyLimitBoundary(t *testing.T) {
	g := newGateway(t, gwOptions{})
	body := func(n int) []byte { // metadata is bounded far below: pad with space
		pre, post := `{"metadata": {"x": "a"}`, `}`
		return []byte(pre + strings.Repeat(" ", n-len(pre)-len(post)) + post)
	}
	r := g.do(t, http.MethodPost, "/v1/sessions", aliceKey, body(rest.MaxBodyBytes))
	expect(t, r, http.StatusCreated, "")
	r = g.do(t, http.MethodPost, "/v1/sessions", aliceKey, body(rest.MaxBodyBytes+1))
	expect(t, r, http.StatusRequestEntityTooLarge, "body_too_large")
}

// TestCreateFieldNamesAreCaseSensitive: the spec's field names are exact
// (additionalProperties: false); encoding/json matches them without case,
// so {"TTL": 120} must not be taken as ttl.
func TestCreateFieldNamesAreCaseSensitive(t *testing.T) {
	g := newGateway(t, gwOptions{})
	for _, body := range []string{`{"TTL": 120}`, `{"Image": "default"}`, `{"SSHPUBLICKEY": ""}`, `{"Metadata": {}}`} {
		r := g.exchange(t, false, http.MethodPost, "/v1/sessions", aliceKey, []byte(body))
		expect(t, r, http.StatusBadRequest, "unknown_field")
	}
}

func TestCreateUnknownImageListsImages(t *testing.T) {
	images := []string{"default", "python", "node-22"}
	g := newGateway(t, gwOptions{gateway: gateway.Config{Images: images}})
	for _, name := range []string{"ubuntu", "Default", "python ", "../default", ""} {
		body, _ := json.Marshal(map[string]string{"image": name})
		r := g.do(t, http.MethodPost, "/v1/sessions", aliceKey, body)
		if name == "" { // empty means the default image
			expect(t, r, http.StatusCreated, "")
			if s := r.session(t); s.Image != "default" {
				t.Errorf("empty image gave %q", s.Image)
			}
			continue
		}
		expect(t, r, http.StatusBadRequest, "unknown_image")
		for _, im := range images {
			if !strings.Contains(r.errorMessage(), im) {
				t.Errorf("image %q: message %q does not list %q", name, r.errorMessage(), im)
			}
		}
	}
	s := g.create(t, aliceKey, `{"image": "node-22"}`)
	if s.Image != "node-22" {
		t.Errorf("image = %q", s.Image)
	}
}

func TestListPagination(t *testing.T) {
	g := newGateway(t, gwOptions{})
	var ids []string
	for range 5 {
		ids = append(ids, g.create(t, aliceKey, "").SessionID)
	}
	g.create(t, bobKey, "") // never in alice's lists

	all := g.list(t, aliceKey)
	if all.Total != 5 || len(all.Sessions) != 5 {
		t.Fatalf("list: total %d, %d sessions", all.Total, len(all.Sessions))
	}
	for i := 1; i < len(all.Sessions); i++ {
		if all.Sessions[i].CreatedAt.Before(all.Sessions[i-1].CreatedAt) {
			t.Errorf("not oldest first at %d", i)
		}
	}
	seen := map[string]bool{}
	for _, s := range all.Sessions {
		seen[s.SessionID] = true
		if s.SSH.Password != "" {
			t.Errorf("list shows the password of %s", s.SessionID)
		}
	}
	for _, id := range ids {
		if !seen[id] {
			t.Errorf("%s missing from the list", id)
		}
	}

	pages := []struct {
		query                string
		n, limit, offset     int
		firstIndexInFullList int
	}{
		{"", 5, 50, 0, 0},
		{"?limit=2", 2, 2, 0, 0},
		{"?limit=2&offset=2", 2, 2, 2, 2},
		{"?limit=2&offset=4", 1, 2, 4, 4},
		{"?offset=5", 0, 50, 5, -1},
		{"?offset=2147483647", 0, 50, 2147483647, -1},
		{"?limit=100&offset=1", 4, 100, 1, 1},
	}
	for _, p := range pages {
		t.Run(p.query, func(t *testing.T) {
			r := g.do(t, http.MethodGet, "/v1/sessions"+p.query, aliceKey, nil)
			expect(t, r, http.StatusOK, "")
			var l listOut
			if err := json.Unmarshal(r.body, &l); err != nil {
				t.Fatal(err)
			}
			if len(l.Sessions) != p.n || l.Total != 5 || l.Limit != p.limit || l.Offset != p.offset {
				t.Errorf("got %d sessions, total %d, limit %d, offset %d; want %d, 5, %d, %d",
					len(l.Sessions), l.Total, l.Limit, l.Offset, p.n, p.limit, p.offset)
			}
			if p.firstIndexInFullList >= 0 && len(l.Sessions) > 0 && l.Sessions[0].SessionID != all.Sessions[p.firstIndexInFullList].SessionID {
				t.Errorf("page starts with %s, want %s", l.Sessions[0].SessionID, all.Sessions[p.firstIndexInFullList].SessionID)
			}
		})
	}

	bad := []struct{ query, code, name string }{
		{"?limit=0", "invalid_limit", "limit"},
		{"?limit=101", "invalid_limit", "limit"},
		{"?limit=-1", "invalid_limit", "limit"},
		{"?limit=ten", "invalid_limit", "limit"},
		{"?limit=1.5", "invalid_limit", "limit"},
		{"?limit=99999999999999999999", "invalid_limit", "limit"},
		{"?offset=-1", "invalid_offset", "offset"},
		{"?offset=x", "invalid_offset", "offset"},
		{"?offset=2147483648", "invalid_offset", "offset"},
		{"?limit=10&offset=-5", "invalid_offset", "offset"},
	}
	for _, b := range bad {
		t.Run(b.query, func(t *testing.T) {
			r := g.do(t, http.MethodGet, "/v1/sessions"+b.query, aliceKey, nil)
			expect(t, r, http.StatusBadRequest, b.code)
			if !strings.Contains(r.errorMessage(), b.name) {
				t.Errorf("message %q does not name %s", r.errorMessage(), b.name)
			}
		})
	}
}

// TestOtherTenantsSessionIsNotFound: another tenant's session answers
// exactly like a missing one, and survives the attempts.
func TestOtherTenantsSessionIsNotFound(t *testing.T) {
	g := newGateway(t, gwOptions{})
	s := g.create(t, aliceKey, "")
	missing := "sbx-aaaaaaaaaaaaaaaaaaaa"

	for _, method := range []string{http.MethodGet, http.MethodDelete} {
		theirs := g.do(t, method, "/v1/sessions/"+s.SessionID, bobKey, nil)
		none := g.do(t, method, "/v1/sessions/"+missing, bobKey, nil)
		expect(t, theirs, http.StatusNotFound, "not_found")
		if string(theirs.body) != string(none.body) || theirs.status != none.status {
			t.Errorf("%s: another tenant's session (%d %s) differs from a missing one (%d %s)",
				method, theirs.status, theirs.body, none.status, none.body)
		}
	}
	for _, p := range []string{"/v1/sessions/", "/sessions/"} {
		r, _, _ := g.rawConnect(t, p+s.SessionID, "Proxy-Authorization", "Bearer "+bobKey)
		expect(t, r, http.StatusNotFound, "not_found")
	}
	if l := g.list(t, bobKey); l.Total != 0 {
		t.Errorf("bob lists %d sessions", l.Total)
	}

	// Still there for its owner, sandbox and all.
	expect(t, g.do(t, http.MethodGet, "/v1/sessions/"+s.SessionID, aliceKey, nil), http.StatusOK, "")
	if _, err := os.Stat(filepath.Join(g.root, s.SessionID)); err != nil {
		t.Errorf("sandbox of the session: %v", err)
	}
	if l := g.list(t, aliceKey); l.Total != 1 {
		t.Errorf("alice lists %d sessions, want 1", l.Total)
	}
}

func TestRateLimit(t *testing.T) {
	const limit = 3
	g := newGateway(t, gwOptions{rateLimit: limit})
	for i := range limit {
		r := g.do(t, http.MethodGet, "/v1/sessions", aliceKey, nil)
		expect(t, r, http.StatusOK, "")
		if got := r.header.Get("X-RateLimit-Remaining"); got != strconv.Itoa(limit-1-i) {
			t.Errorf("request %d: X-RateLimit-Remaining = %q, want %d", i, got, limit-1-i)
		}
		if got := r.header.Get("X-RateLimit-Limit"); got != strconv.Itoa(limit) {
			t.Errorf("X-RateLimit-Limit = %q", got)
		}
	}
	r := g.do(t, http.MethodPost, "/v1/sessions", aliceKey, []byte(`{}`))
	expect(t, r, http.StatusTooManyRequests, "rate_limited")
	checkRateLimited(t, r, limit)
	if !strings.Contains(r.errorMessage(), strconv.Itoa(limit)) {
		t.Errorf("message %q does not state the limit", r.errorMessage())
	}
	if n := g.sandboxDirs(t); n != 0 {
		t.Errorf("a rate-limited create made %d sandboxes", n)
	}

	// Per tenant: bob is not limited by alice's use.
	expect(t, g.do(t, http.MethodGet, "/v1/sessions", bobKey, nil), http.StatusOK, "")
	// Probes are not rate limited.
	for range 2 * limit {
		expect(t, g.do(t, http.MethodGet, "/healthz", "", nil), http.StatusOK, "")
	}
}

func TestSessionQuotas(t *testing.T) {
	t.Run("per tenant", func(t *testing.T) {
		g := newGateway(t, gwOptions{gateway: gateway.Config{MaxSessionsPerTenant: 2}})
		a := g.create(t, aliceKey, "")
		g.create(t, aliceKey, "")
		r := g.do(t, http.MethodPost, "/v1/sessions", aliceKey, nil)
		expect(t, r, http.StatusTooManyRequests, "quota_exceeded")
		if !strings.Contains(r.errorMessage(), "2") {
			t.Errorf("message %q does not state the limit", r.errorMessage())
		}
		g.create(t, bobKey, "") // other tenants have their own quota
		expect(t, g.do(t, http.MethodDelete, "/v1/sessions/"+a.SessionID, aliceKey, nil), http.StatusNoContent, "")
		g.create(t, aliceKey, "") // a slot is free again
		if n := g.sandboxDirs(t); n != 3 {
			t.Errorf("%d sandboxes, want 3", n)
		}
	})
	t.Run("gateway total", func(t *testing.T) {
		g := newGateway(t, gwOptions{gateway: gateway.Config{MaxSessions: 3}})
		a := g.create(t, aliceKey, "")
		g.create(t, bobKey, "")
		g.create(t, carolKey, "")
		for _, key := range []string{aliceKey, bobKey, carolKey} {
			// The gateway's limit is a generic "capacity", not a quota that
			// names it: that would tell a tenant what the others hold.
			r := g.do(t, http.MethodPost, "/v1/sessions", key, nil)
			expect(t, r, http.StatusServiceUnavailable, "capacity")
			if ra, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || ra <= 0 {
				t.Errorf("Retry-After = %q", r.header.Get("Retry-After"))
			}
			if strings.Contains(r.errorMessage(), "3") || strings.Contains(r.errorMessage(), "max-sessions") {
				t.Errorf("capacity message %q names the gateway's limit", r.errorMessage())
			}
		}
		expect(t, g.do(t, http.MethodDelete, "/v1/sessions/"+a.SessionID, aliceKey, nil), http.StatusNoContent, "")
		g.create(t, carolKey, "")
		if n := g.sandboxDirs(t); n != 3 {
			t.Errorf("%d sandboxes, want 3", n)
		}
	})
}

// TestMethodNotAllowedListsAllow: RFC 9110 §15.5.6 requires a 405 to carry
// Allow with the methods the resource has.
func TestMethodNotAllowedListsAllow(t *testing.T) {
	g := newGateway(t, gwOptions{})
	cases := []struct {
		method, path, token string
		allow               []string
	}{
		{http.MethodPost, "/healthz", "", []string{"GET"}},
		{http.MethodPut, "/v1/sessions", aliceKey, []string{"GET", "POST"}},
		{http.MethodPut, "/v1/sessions/sbx-aaaaaaaaaaaaaaaaaaaa", aliceKey, []string{"DELETE", "GET", "PATCH"}},
		{http.MethodGet, "/sessions/sbx-aaaaaaaaaaaaaaaaaaaa", aliceKey, []string{"CONNECT"}},
	}
	for _, c := range cases {
		r := g.do(t, c.method, c.path, c.token, nil)
		expect(t, r, http.StatusMethodNotAllowed, "method_not_allowed")
		var got []string
		for _, v := range r.header.Values("Allow") {
			for _, m := range strings.Split(v, ",") {
				got = append(got, strings.TrimSpace(m))
			}
		}
		for _, m := range c.allow {
			if !strings.Contains(","+strings.Join(got, ",")+",", ","+m+",") {
				t.Errorf("%s %s: Allow = %q, want it to list %s", c.method, c.path, got, m)
			}
		}
	}
}

// TestFailedSessionHidesHostPaths: a session whose sandbox was lost across
// a restart tells the client why, but no host path or internal error
// reaches the client (rest/errors.go: "Internal details never reach the client").
func TestFailedSessionHidesHostPaths(t *testing.T) {
	store := gateway.NewMemStore()
	id := putLostSession(t, store, "alice")
	g := newGateway(t, gwOptions{store: store, restore: true})
	r := g.do(t, http.MethodGet, "/v1/sessions/"+id, aliceKey, nil)
	expect(t, r, http.StatusOK, "")
	c, _, _ := g.rawConnect(t, "/v1/sessions/"+id, "Proxy-Authorization", "Bearer "+aliceKey)
	expect(t, c, http.StatusConflict, "session_not_running")
	for what, text := range map[string]string{"GET": string(r.body), "CONNECT": string(c.body)} {
		if strings.Contains(text, g.root) || strings.Contains(text, "no such file") {
			t.Errorf("%s shows host details: %s", what, text)
		}
	}
}
