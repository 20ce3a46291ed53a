package rest_test

import (
	"net/http"
	"strings"
	"testing"
)

// Every answer carries X-Request-Id: the client's when valid, else a fresh
// one; errors and unauthenticated answers too.
func TestRequestID(t *testing.T) {
	g := newGateway(t, gwOptions{})
	get := func(path, id, token string) string {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, g.url+path, nil)
		if id != "" {
			req.Header.Set("X-Request-Id", id)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.Header.Get("X-Request-Id")
	}
	if got := get("/healthz", "trace-01:ab.CD_9", ""); got != "trace-01:ab.CD_9" {
		t.Errorf("a valid client id came back as %q", got)
	}
	a, b := get("/v1/sessions", "", aliceKey), get("/v1/sessions", "", "")
	if len(a) != 24 || len(b) != 24 || a == b {
		t.Errorf("generated ids %q, %q", a, b)
	}
	for _, bad := range []string{"has space", "new\\nline", strings.Repeat("x", 129), "semi;colon"} {
		if got := get("/healthz", bad, ""); got == bad || len(got) != 24 {
			t.Errorf("invalid id %q came back as %q", bad, got)
		}
	}
}
