package compat_test

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
)

// The seeds' APIs are not in the OpenAPI spec: their tests call them
// without the spec checker.

// compatResp is an answer of a compat route.
type compatResp struct {
	status int
	header http.Header
	body   []byte
}

// decode unmarshals the answer's JSON into v.
func (r compatResp) decode(t testing.TB, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decode %q: %v", r.body, err)
	}
}

// compatCall sends one request to g; token "" sends no Authorization
// header, body "" no body.
func compatCall(t testing.TB, g *testGateway, method, path, token, body string) compatResp {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, g.url+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := g.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	data, err := io.ReadAll(io.LimitReader(res.Body, 32<<20))
	if err != nil {
		t.Fatalf("%s %s: read: %v", method, path, err)
	}
	return compatResp{status: res.StatusCode, header: res.Header, body: data}
}

// compatRoutes are every route of the seeds' APIs, with a session id.
var compatRoutes = []struct{ method, path string }{
	{http.MethodPost, "/compat/sbs/sessions"},
	{http.MethodPost, "/compat/sbs/sessions/ID/step"},
	{http.MethodDelete, "/compat/sbs/sessions/ID"},
	{http.MethodPost, "/compat/sandkasten/v1/sessions"},
	{http.MethodGet, "/compat/sandkasten/v1/sessions"},
	{http.MethodGet, "/compat/sandkasten/v1/sessions/ID"},
	{http.MethodDelete, "/compat/sandkasten/v1/sessions/ID"},
	{http.MethodPost, "/compat/sandkasten/v1/sessions/ID/exec"},
	{http.MethodPost, "/compat/sandkasten/v1/sessions/ID/fs/write"},
	{http.MethodGet, "/compat/sandkasten/v1/sessions/ID/fs/read?path=x"},
	// Paths no route serves are refused before they are looked up.
	{http.MethodGet, "/compat/sbs/nothing"},
	{http.MethodGet, "/compat/sandkasten/nothing"},
}

// TestCompatAuth: every compat route wants a sandgate bearer token and
// refuses without one (or with a bad one) with the native 401 envelope;
// the rate limit applies as on /v1.
func TestCompatAuth(t *testing.T) {
	g := newGateway(t, gwOptions{})
	id := g.create(t, aliceKey, "").SessionID
	for _, rt := range compatRoutes {
		path := strings.Replace(rt.path, "ID", id, 1)
		for _, token := range []string{"", "sg_wrong_token"} {
			t.Run(rt.method+" "+rt.path+" token="+token, func(t *testing.T) {
				r := compatCall(t, g, rt.method, path, token, `{}`)
				var e struct {
					Error struct{ Code, Message string } `json:"error"`
				}
				r.decode(t, &e)
				if r.status != http.StatusUnauthorized || e.Error.Code != "unauthorized" {
					t.Errorf("got %d %s", r.status, r.body)
				}
				if got := r.header.Get("WWW-Authenticate"); got != `Bearer realm="sandgate"` {
					t.Errorf("WWW-Authenticate %q", got)
				}
			})
		}
	}
	// The session survived every refused DELETE.
	if r := g.do(t, http.MethodGet, "/v1/sessions/"+id, aliceKey, nil); r.status != http.StatusOK {
		t.Errorf("session after refused deletes: %d", r.status)
	}

	t.Run("rate limit", func(t *testing.T) {
		rl := newGateway(t, gwOptions{rateLimit: 2})
		var last compatResp
		for range 3 {
			last = compatCall(t, rl, http.MethodGet, "/compat/sandkasten/v1/sessions", aliceKey, "")
		}
		if last.status != http.StatusTooManyRequests {
			t.Errorf("third request in a minute: %d %s", last.status, last.body)
		}
	})

	// Issue 35 item 12: docs/compat.md said the compat APIs had a budget
	// of their own. They share the tenant's one with /v1, as it now says.
	t.Run("one rate budget with /v1", func(t *testing.T) {
		rl := newGateway(t, gwOptions{rateLimit: 2})
		expect(t, rl.do(t, http.MethodGet, "/v1/sessions", aliceKey, nil), http.StatusOK, "")
		if r := compatCall(t, rl, http.MethodGet, "/compat/sandkasten/v1/sessions", aliceKey, ""); r.status != http.StatusOK {
			t.Fatalf("compat call: %d", r.status)
		}
		expect(t, rl.do(t, http.MethodGet, "/v1/sessions", aliceKey, nil), http.StatusTooManyRequests, "rate_limited")
		doc, err := os.ReadFile("../../docs/compat.md")
		if err != nil {
			t.Fatal(err)
		}
		if text := strings.Join(strings.Fields(string(doc)), " "); !strings.Contains(text, "one budget per tenant counts `/v1` and every compat API together") ||
			strings.Contains(text, "counted apart") {
			t.Error("docs/compat.md does not say that /v1 and the compat APIs share one rate budget")
		}
	})
}
