package main

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// The gateway's / is a landing page linking the reference and the spec,
// /docs renders the spec's Markdown as HTML, both under a CSP that allows
// their one inline style sheet and nothing else, and unknown paths still
// answer the JSON 404.
func TestLandingAndDocsPages(t *testing.T) {
	g := startGateway(t)
	get := func(path string) (*http.Response, string) {
		t.Helper()
		resp, err := http.Get(g.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp, string(b)
	}
	checkPage := func(path, page string, resp *http.Response) {
		t.Helper()
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
			t.Fatalf("%s: %d %s %.200q", path, resp.StatusCode, resp.Header.Get("Content-Type"), page)
		}
		for _, bad := range []string{"<script", "src=", `href="http`, `href="//`, "@import", "url(", "<iframe", "<img"} {
			if strings.Contains(page, bad) {
				t.Errorf("%s contains %q", path, bad)
			}
		}
		csp := resp.Header.Get("Content-Security-Policy")
		if !strings.HasPrefix(csp, "default-src 'none'; ") || strings.Contains(csp, "unsafe") {
			t.Errorf("%s: CSP %q", path, csp)
		}
		// The one inline style sheet is the one the CSP's hash allows.
		i, j := strings.Index(page, "<style>"), strings.Index(page, "</style>")
		if i < 0 || j < i || strings.Count(page, "<style") != 1 || strings.Contains(page, "style=") {
			t.Fatalf("%s: want exactly one <style> element and no style attributes", path)
		}
		sum := sha256.Sum256([]byte(page[i+len("<style>") : j]))
		if want := "style-src 'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"; !strings.Contains(csp, want) {
			t.Errorf("%s: CSP %q does not allow its style sheet (%s)", path, csp, want)
		}
	}

	resp, home := get("/")
	checkPage("/", home, resp)
	for _, link := range []string{`href="docs"`, `href="openapi.json"`, `href="openapi.yaml"`} {
		if !strings.Contains(home, link) {
			t.Errorf("/ has no link %s", link)
		}
	}

	resp, docs := get("/docs")
	checkPage("/docs", docs, resp)
	// The spec's Markdown is rendered: inline code spans, lists and
	// paragraphs become HTML, not backticks.
	for _, want := range []string{"<code>Authorization: Bearer &lt;token&gt;</code>", "<p>", "CreateSessionRequest"} {
		if !strings.Contains(docs, want) {
			t.Errorf("/docs lacks %q", want)
		}
	}
	if strings.Contains(docs, "`Authorization: Bearer") {
		t.Error("/docs shows the spec's Markdown raw")
	}

	for _, path := range []string{"/nope", "/index.html", "/docs/x"} {
		resp, body := get(path)
		var e struct {
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		if resp.StatusCode != http.StatusNotFound || json.Unmarshal([]byte(body), &e) != nil || e.Error.Code != "unknown_endpoint" {
			t.Errorf("%s: %d %.200q, want the JSON 404 unknown_endpoint", path, resp.StatusCode, body)
		}
	}
}
