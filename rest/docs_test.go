package rest_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// The gateway serves the spec it was built with, in YAML and JSON, and a
// reference page built from it that loads nothing from elsewhere.
func TestAPIDocs(t *testing.T) {
	g := newGateway(t, gwOptions{})
	get := func(path string) (*http.Response, string) {
		t.Helper()
		resp, err := http.Get(g.url + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	resp, y := get("/openapi.yaml")
	if resp.StatusCode != 200 || !strings.HasPrefix(y, "openapi: 3.") {
		t.Errorf("openapi.yaml: %d %.40q", resp.StatusCode, y)
	}
	resp, j := get("/openapi.json")
	var doc struct {
		OpenAPI string                    `json:"openapi"`
		Paths   map[string]map[string]any `json:"paths"`
	}
	if err := json.Unmarshal([]byte(j), &doc); err != nil || resp.StatusCode != 200 || doc.Paths["/v1/sessions"]["post"] == nil {
		t.Errorf("openapi.json: %d %v %.80q", resp.StatusCode, err, j)
	}
	resp, page := get("/docs")
	if resp.StatusCode != 200 || !strings.Contains(page, "/v1/sessions/{id}") || !strings.Contains(page, "CreateSessionRequest") {
		t.Errorf("docs: %d %.80q", resp.StatusCode, page)
	}
	if strings.Contains(page, "<script") || strings.Contains(page, "https://") && strings.Contains(page, "src=\"http") {
		t.Error("the reference page loads something")
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("CSP %q", csp)
	}
}
