package compat_test

import (
	"net/http/httptest"
	"testing"

	"github.com/sandgate/sandgate/rest/compat"
)

// TestSessionOfE2B: a cluster node relays E2B's calls to the sandbox's
// owner: the control API names it in the path, the sandbox URL in
// E2b-Sandbox-Id; the credential is X-API-Key.
func TestSessionOfE2B(t *testing.T) {
	for _, c := range []struct {
		method, path, header, id string
	}{
		{"GET", "/compat/e2b/sandboxes/sbx-abc", "", "sbx-abc"},
		{"POST", "/compat/e2b/sandboxes/sbx-abc/pause", "", "sbx-abc"},
		{"POST", "/compat/e2b/v2/sandboxes/sbx-abc/connect", "", "sbx-abc"},
		{"POST", "/compat/e2b/sandbox/process.Process/Start", "sbx-abc", "sbx-abc"},
		{"GET", "/compat/e2b/sandbox/files", "sbx-abc", "sbx-abc"},
		{"GET", "/compat/e2b/sandboxes/metrics", "", ""},
		{"GET", "/compat/e2b/v2/sandboxes", "", ""},
		{"POST", "/compat/e2b/sandbox/execute", "", ""},
	} {
		r := httptest.NewRequest(c.method, c.path, nil)
		r.Header.Set("X-API-Key", "key")
		if c.header != "" {
			r.Header.Set("E2b-Sandbox-Id", c.header)
		}
		id, token, name := compat.SessionOf(r)
		wantToken := "key"
		if c.id == "" {
			wantToken = ""
		}
		if id != c.id || token != wantToken || name != nil {
			t.Errorf("%s %s: %q %q %v, want %q", c.method, c.path, id, token, name != nil, c.id)
		}
	}
}
