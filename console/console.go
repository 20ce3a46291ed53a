// Package console is the gateway's web console: a page, its scripts and
// its style sheets, embedded in the binary (its own files from web/src,
// the npm packages' from dist/, which make console copies) and served
// under /ui/. The console holds no credential
// of its own and no server-side logic: it signs in with the user's API
// key or JWT, kept in the tab's sessionStorage, and calls the REST API
// like any client, so every action has the API's auth, limits and audit.
//
// It runs in the gateway process and imports nothing of sandgate:
// cmd/sandgate hands Handler to rest.Config.Console.
package console

import (
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"embed"
	"encoding/base64"
	"encoding/json"
	"io/fs"
	"net/http"
	"path"
	"strconv"
	"strings"
)

// assets are the console's files: its own (web/src) and the npm
// packages' (dist: xterm.js, its fit addon, their licenses).
//
//go:embed web/src dist
var assets embed.FS

// assetDirs are the directories of assets whose files are served under
// Prefix by their base names.
var assetDirs = []string{"web/src", "dist"}

// walkAssets calls fn with each served file's name and contents.
func walkAssets(fn func(name string, body []byte)) {
	for _, dir := range assetDirs {
		_ = fs.WalkDir(assets, dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			body, err := assets.ReadFile(p)
			if err != nil {
				return err
			}
			fn(strings.TrimPrefix(p, dir+"/"), body)
			return nil
		})
	}
}

// gzipped is body compressed at the best level.
func gzipped(body []byte) []byte {
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	_, _ = zw.Write(body)
	_ = zw.Close()
	return buf.Bytes()
}

// Prefix is where the console is served.
const Prefix = "/ui/"

// nonceMark is what the page's nonce replaces in index.html.
const nonceMark = "__CSP_NONCE__"

// CSP is the console's Content-Security-Policy, NONCE standing for the
// page's nonce: scripts only those the page names with its nonce (its
// three <script> elements: not any script of the origin, such as an
// API answer), style sheets from the console's own files only,
// connections (the API, the terminal's WebSocket) to its own origin
// only, no frames, no plugins, and no page may frame it. The nonce also
// admits the style elements the terminal (xterm.js's DOM renderer)
// creates for its dimensions and colours, which the console stamps with
// it; no inline script and no style attribute is allowed.
const CSP = "default-src 'none'; script-src 'nonce-NONCE'; style-src 'self' 'nonce-NONCE'; connect-src 'self'; " +
	"img-src 'self'; font-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// fileCSP is the CSP of the console's other files: no nonce, no script.
var fileCSP = strings.NewReplacer("script-src 'nonce-NONCE'", "script-src 'none'", " 'nonce-NONCE'", "").Replace(CSP)

// file is one embedded file, with its gzip form when that is smaller.
type file struct {
	body, gz    []byte
	contentType string
}

// Handler serves the console's files under Prefix: index.html for the
// prefix itself (with a fresh CSP nonce each time), the rest as they are,
// gzip-compressed for clients that accept it. Another path answers the
// API's 404 envelope (unknown_endpoint).
func Handler() http.Handler {
	files := map[string]*file{}
	walkAssets(func(name string, body []byte) {
		f := &file{body: body, contentType: contentType(name)}
		if gz := gzipped(body); len(gz) < len(body) {
			f.gz = gz
		}
		files[name] = f
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := strings.TrimPrefix(r.URL.Path, Prefix)
		if name == "" {
			name = "index.html"
		}
		f := files[name]
		if f == nil || name != path.Clean(name) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			w.WriteHeader(http.StatusNotFound)
			_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{
				"code": "unknown_endpoint", "message": "no such endpoint: " + r.Method + " " + r.URL.Path}})
			return
		}
		h := w.Header()
		h.Set("Content-Type", f.contentType)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY") // frame-ancestors for browsers without CSP 2
		h.Set("Cache-Control", "no-cache")
		h.Set("Vary", "Accept-Encoding")
		body, gz := f.body, f.gz
		if name == "index.html" {
			nonce := newNonce()
			h.Set("Content-Security-Policy", strings.ReplaceAll(CSP, "NONCE", nonce))
			h.Set("Cache-Control", "no-store")
			body, gz = bytes.ReplaceAll(f.body, []byte(nonceMark), []byte(nonce)), nil
		} else {
			h.Set("Content-Security-Policy", fileCSP)
		}
		if gz != nil && acceptsGzip(r) {
			h.Set("Content-Encoding", "gzip")
			body = gz
		}
		h.Set("Content-Length", strconv.Itoa(len(body)))
		w.WriteHeader(http.StatusOK)
		if r.Method != http.MethodHead {
			_, _ = w.Write(body)
		}
	})
}

// newNonce returns a CSP nonce: 128 random bits.
func newNonce() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return base64.StdEncoding.EncodeToString(b[:])
}

func acceptsGzip(r *http.Request) bool {
	for _, part := range strings.Split(r.Header.Get("Accept-Encoding"), ",") {
		enc, q, _ := strings.Cut(strings.TrimSpace(part), ";")
		if strings.EqualFold(strings.TrimSpace(enc), "gzip") && strings.ReplaceAll(q, " ", "") != "q=0" {
			return true
		}
	}
	return false
}

func contentType(name string) string {
	switch path.Ext(name) {
	case ".html":
		return "text/html; charset=utf-8"
	case ".js":
		return "text/javascript; charset=utf-8"
	case ".css":
		return "text/css; charset=utf-8"
	case ".txt":
		return "text/plain; charset=utf-8"
	}
	return "application/octet-stream"
}

// Assets lists the console's embedded files and their sizes, raw and
// gzip-compressed (what make console reports and its test bounds).
func Assets() map[string][2]int {
	out := map[string][2]int{}
	walkAssets(func(name string, body []byte) {
		out[name] = [2]int{len(body), len(gzipped(body))}
	})
	return out
}
