package compat_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/sandgate/sandgate/rest/compat"
)

// TestSandboxRouter: agent-sandbox's sandbox-router requests reach the
// session X-Sandbox-ID names, authenticated by the session's token (its
// SSH password) or the tenant's API key, and no other tenant's.
func TestSandboxRouter(t *testing.T) {
	g := newGateway(t, gwOptions{})
	r := g.do(t, http.MethodPost, "/v1/sessions", aliceKey, []byte(`{}`))
	if r.status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	var s struct {
		SessionID string `json:"sessionId"`
		SSH       struct {
			Password string `json:"password"`
		} `json:"ssh"`
	}
	if err := json.Unmarshal(r.body, &s); err != nil {
		t.Fatal(err)
	}
	exec := func(token, cmd string) (result, map[string]any) {
		b, _ := json.Marshal(map[string]string{"command": cmd})
		r := g.do(t, http.MethodPost, compat.SandboxRouterPrefix+"/execute", token, b, "X-Sandbox-ID", s.SessionID)
		var out map[string]any
		_ = json.Unmarshal(r.body, &out)
		return r, out
	}
	res, out := exec(s.SSH.Password, "echo out; echo err >&2; exit 3")
	if res.status != http.StatusOK || out["stdout"] != "out\n" || out["stderr"] != "err\n" || out["exit_code"] != float64(3) {
		t.Errorf("execute with the session's token: %d %s", res.status, res.body)
	}
	if res, out := exec(aliceKey, "echo key"); res.status != http.StatusOK || out["stdout"] != "key\n" {
		t.Errorf("execute with the tenant's API key: %d %s", res.status, res.body)
	}
	if res, _ := exec("not-the-password", "true"); res.status != http.StatusUnauthorized {
		t.Errorf("a wrong token: %d, want 401", res.status)
	}
	if res, _ := exec(bobKey, "true"); res.status != http.StatusNotFound {
		t.Errorf("another tenant's key: %d, want 404", res.status)
	}
	h := g.do(t, http.MethodGet, compat.SandboxRouterPrefix+"/", s.SSH.Password, nil, "X-Sandbox-ID", s.SessionID)
	if h.status != http.StatusOK {
		t.Errorf("health: %d %s", h.status, h.body)
	}
	bad := g.do(t, http.MethodPost, compat.SandboxRouterPrefix+"/execute", s.SSH.Password, []byte(`{}`), "X-Sandbox-ID", s.SessionID)
	expect(t, bad, http.StatusBadRequest, "invalid_command")
}

func TestRouterPath(t *testing.T) {
	for _, c := range []struct {
		path, id, want string
	}{
		{"/execute", "sbx-a", compat.SandboxRouterPrefix + "/execute"},
		{"/", "sbx-a", compat.SandboxRouterPrefix + "/"},
		{"/execute", "", ""},
		{"/v1/sessions", "sbx-a", ""},
		{"/compat/e2b/sandbox", "sbx-a", ""},
		{"/healthz", "sbx-a", ""},
	} {
		r := httptest.NewRequest(http.MethodPost, c.path, nil)
		if c.id != "" {
			r.Header.Set("X-Sandbox-ID", c.id)
		}
		if got := compat.RouterPath(r); got != c.want {
			t.Errorf("RouterPath(%s, %q) = %q, want %q", c.path, c.id, got, c.want)
		}
		r.URL.Path = compat.SandboxRouterPrefix + c.path
		if id, _, _ := compat.SessionOf(r); c.id != "" && id != c.id {
			t.Errorf("SessionOf(%s) = %q, want %q", r.URL.Path, id, c.id)
		}
	}
}
