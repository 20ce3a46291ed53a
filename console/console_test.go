package console

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPage: the page carries a nonce fresh on each answer, the same in
// its CSP and its markup; the CSP forbids inline scripts, framing and
// connections elsewhere; files are gzip-compressed for clients that take
// it; any other path is the API's 404 envelope.
func TestPage(t *testing.T) {
	h := Handler()
	get := func(path, enc string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodGet, path, nil)
		if enc != "" {
			r.Header.Set("Accept-Encoding", enc)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	nonces := map[string]bool{}
	for range 2 {
		w := get("/ui/", "gzip")
		csp := w.Header().Get("Content-Security-Policy")
		if w.Code != 200 || w.Header().Get("Content-Encoding") != "" {
			t.Fatalf("/ui/: %d %v", w.Code, w.Header())
		}
		_, rest, ok := strings.Cut(csp, "'nonce-")
		nonce, _, _ := strings.Cut(rest, "'")
		if !ok || len(nonce) < 20 || !strings.Contains(w.Body.String(), `nonce="`+nonce+`"`) || strings.Contains(w.Body.String(), nonceMark) {
			t.Errorf("page nonce %q not in its markup, or the mark left: %s", nonce, csp)
		}
		nonces[nonce] = true
		// The key is kept in sessionStorage only: the browser is not
		// asked to save it as a password.
		if body := w.Body.String(); !strings.Contains(body, `<input id="token" name="token" type="password" autocomplete="off" required>`) ||
			strings.Contains(body, "current-password") {
			t.Errorf("the key field lets the browser save the key: %.2000s", body)
		}
		// Scripts: only the page's own, by its nonce, each <script> with it.
		if scripts := strings.Count(w.Body.String(), "<script "); scripts != 3 || strings.Count(w.Body.String(), `nonce="`+nonce+`"></script>`) != scripts {
			t.Errorf("%d <script> elements, not all with the nonce: %.1000s", scripts, w.Body.String())
		}
		for _, want := range []string{"script-src 'nonce-" + nonce + "';", "style-src 'self' 'nonce-" + nonce + "';", "frame-ancestors 'none'", "connect-src 'self';", "default-src 'none'"} {
			if !strings.Contains(csp, want) {
				t.Errorf("CSP %q lacks %q", csp, want)
			}
		}
		if strings.Contains(csp, "unsafe-inline") || strings.Contains(csp, "unsafe-eval") {
			t.Errorf("CSP %q allows inline code", csp)
		}
	}
	if len(nonces) != 2 {
		t.Errorf("the nonce is not fresh per answer: %v", nonces)
	}
	if csp := get("/ui/app.js", "").Header().Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'none';") || !strings.Contains(csp, "style-src 'self';") || strings.Contains(csp, "NONCE") {
		t.Errorf("a file's CSP: %q", csp)
	}
	w := get("/ui/xterm.js", "gzip, deflate")
	if w.Code != 200 || w.Header().Get("Content-Encoding") != "gzip" || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/javascript") {
		t.Errorf("xterm.js: %d %v", w.Code, w.Header())
	}
	if w := get("/ui/app.css", ""); w.Code != 200 || w.Header().Get("Content-Encoding") != "" || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/css") {
		t.Errorf("app.css without gzip: %d %v", w.Code, w.Header())
	}
	for _, p := range []string{"/ui/nope.js", "/ui/../console.go", "/ui/dist/app.js"} {
		if w := get(p, ""); w.Code != 404 || !strings.Contains(w.Body.String(), `"unknown_endpoint"`) {
			t.Errorf("%s: %d %s", p, w.Code, w.Body)
		}
	}
}

// TestAssetBudget: the console's scripts and style sheets, gzip-compressed,
// stay under 400 KB (issue 38's bound).
func TestAssetBudget(t *testing.T) {
	total := 0
	for name, n := range Assets() {
		if strings.HasSuffix(name, ".js") || strings.HasSuffix(name, ".css") {
			total += n[1]
			t.Logf("%-12s %7d bytes, %6d gzip", name, n[0], n[1])
		}
	}
	t.Logf("JS and CSS: %d bytes gzip-compressed", total)
	if total == 0 || total >= 400_000 {
		t.Errorf("JS and CSS are %d bytes compressed, want 0 < n < 400,000", total)
	}
}

// TestDistIsBuilt: the committed dist/ is exactly what make console
// makes: the npm packages' files (from web/node_modules,
// which make console fills from the lockfile), copied. Without
// node_modules it skips, but fails under CI=true.
func TestDistIsBuilt(t *testing.T) {
	nm := filepath.Join("web", "node_modules")
	if _, err := os.Stat(nm); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("console/web/node_modules is missing: CI runs make console first")
		}
		t.Skip("no console/web/node_modules (make console fills it)")
	}
	sources := map[string]string{
		"xterm.js":     "web/node_modules/@xterm/xterm/lib/xterm.js",
		"xterm.css":    "web/node_modules/@xterm/xterm/css/xterm.css",
		"addon-fit.js": "web/node_modules/@xterm/addon-fit/lib/addon-fit.js",
	}
	// The licenses of both npm packages, each under its name.
	var licenses []byte
	for i, pkg := range []struct{ name, files, license string }{
		{"@xterm/xterm", "xterm.js, xterm.css", "web/node_modules/@xterm/xterm/LICENSE"},
		{"@xterm/addon-fit", "addon-fit.js", "web/node_modules/@xterm/addon-fit/LICENSE"},
	} {
		text, err := os.ReadFile(pkg.license)
		if err != nil {
			t.Fatal(err)
		}
		if i > 0 {
			licenses = append(licenses, '\n')
		}
		licenses = append(licenses, pkg.name+" ("+pkg.files+"):\n\n"...)
		licenses = append(licenses, text...)
	}
	if got, err := os.ReadFile(filepath.Join("dist", "THIRD-PARTY-LICENSES.txt")); err != nil || !bytes.Equal(got, licenses) {
		t.Errorf("dist/THIRD-PARTY-LICENSES.txt is not both packages' licenses: run make console and commit console/dist (%v)", err)
	}
	entries, err := os.ReadDir("dist")
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(sources)+1 {
		t.Errorf("dist has %d files, make console makes %d", len(entries), len(sources))
	}
	for name, src := range sources {
		want, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join("dist", name))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("dist/%s is not %s: run make console and commit console/dist (%v)", name, src, err)
		}
	}
}
