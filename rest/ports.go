package rest

import (
	"context"
	"crypto/hmac"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sandbox"
)

// Preview URLs reverse-proxy HTTP, WebSocket upgrades included, to
// localhost:port inside a session's sandbox, on two routes:
//   - a preview origin of the session's own (preview.go): any path on the
//     host p{port}-{label}.{preview domain}, a presigned URL from POST
//     /v1/sessions/{id}/ports/link, the one to open in a browser;
//   - /v1/sessions/{id}/ports/{port}/{path...} on the API's origin, with the
//     bearer token: for programs, served under Content-Security-Policy:
//     sandbox, without cookies either way, so nothing the server sends runs
//     with the API's origin.
//
// /links/ports/{token}/{path...}, the links of earlier versions, redirect
// (307) to the preview origin. The gateway connects through
// sandbox.LoopbackDialer, as `ssh -L` does (sshd/forward.go): the
// sandbox's own loopback, never another host.
//
// The client's Authorization header never reaches the sandbox, nor does a
// preview origin's label (the credential): the server sees Host
// localhost:port (dev servers check it), and Origin and Referer of its own
// preview as http://localhost:port (another origin's as Origin "null" and
// no Referer), X-Forwarded-For and -Proto, and, on the bearer route,
// X-Forwarded-Host and -Prefix.
//
// Whatever the route, the server's answer loses Service-Worker-Allowed, a
// request for a service worker's script (Service-Worker: script) is
// refused, and a redirect that leaves the preview is refused (502
// port_redirect_refused): a page of the sandbox gets no foothold outside
// its own origin.

// Preview bounds.
const (
	// portBodyBytes bounds a request body sent to a preview.
	portBodyBytes = 32 << 20
	// portDialTimeout bounds the connect inside the sandbox.
	portDialTimeout = 10 * time.Second
	// portHeaderTimeout bounds the wait for the server's response headers
	// (a dev server may compile a page first).
	portHeaderTimeout = 2 * time.Minute
	// portIdleTimeout ends an exchange (a WebSocket included) that moved
	// no byte either way for this long.
	portIdleTimeout = 5 * time.Minute
	// portMaxConns bounds the exchanges open at once per session
	// (WebSockets stay open): past it, 503 too_many_connections.
	portMaxConns = 64
)

// portLinkDomain separates port-link signatures from file links' (the
// key is the same, links.go): a file link never opens a port, nor the
// reverse.
const portLinkDomain = "sandgate-port-link-v1"

// portTarget is where one request goes, in its context for the
// transport's dial.
type portTarget struct {
	dialer sandbox.LoopbackDialer
	port   int
	// path and rawPath are the path on the server (what follows the
	// route's prefix).
	path, rawPath string
	route         portRoute
	// touch counts moved bytes as the session's activity (a WebSocket
	// that only talks keeps its session from the idle timeout).
	touch func()
}

// portRoute is how a request reached a preview.
type portRoute struct {
	// public is the route's public prefix, which the server's own
	// redirects are put under ("" on a preview origin: its root).
	public string
	// fwdPrefix is X-Forwarded-Prefix ("" on a preview origin).
	fwdPrefix string
	// label is the preview origin's label ("": the API's origin, the
	// bearer route).
	label string
	// scheme and port are those of the preview origin's issued URL
	// (previewURL), which a redirect to the label must keep.
	scheme, port string
}

type portTargetKey struct{}

// portsProxy is the API's reverse proxy to sandbox ports, shared by every
// session.
type portsProxy struct {
	rp *httputil.ReverseProxy

	mu   sync.Mutex
	open map[string]int // session -> exchanges in flight
}

// portDialError is a failure to connect inside the sandbox.
type portDialError struct{ err error }

func (e *portDialError) Error() string { return "connect in the sandbox: " + e.err.Error() }
func (e *portDialError) Unwrap() error { return e.err }

func newPortsProxy(a *api) *portsProxy {
	tr := &http.Transport{
		Proxy:       nil,
		DialContext: dialPortTarget,
		// No pooling: a kept connection would be keyed by localhost:port
		// and must never serve another session's request.
		DisableKeepAlives:      true,
		DisableCompression:     true,
		ResponseHeaderTimeout:  portHeaderTimeout,
		MaxResponseHeaderBytes: 1 << 20,
	}
	log := a.cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &portsProxy{open: map[string]int{}}
	p.rp = &httputil.ReverseProxy{
		Rewrite:        a.rewritePortRequest,
		Transport:      tr,
		FlushInterval:  -1, // stream as the server writes (server-sent events, progress)
		ModifyResponse: a.rewritePortResponse,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			a.portError(w, r, err)
		},
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	return p
}

// dialPortTarget connects to the request's port on the sandbox's
// loopback: 127.0.0.1, then ::1 (a server listening on "localhost" may
// have only one of them).
func dialPortTarget(ctx context.Context, _, _ string) (net.Conn, error) {
	t, ok := ctx.Value(portTargetKey{}).(*portTarget)
	if !ok {
		return nil, &portDialError{errors.New("no target")}
	}
	ctx, cancel := context.WithTimeout(ctx, portDialTimeout)
	defer cancel()
	c, err := t.dialer.DialLoopback(ctx, "tcp4", t.port)
	if err != nil && !errors.Is(err, sandbox.ErrStopped) && !errors.Is(err, sandbox.ErrClosed) {
		if c6, err6 := t.dialer.DialLoopback(ctx, "tcp6", t.port); err6 == nil {
			c, err = c6, nil
		}
	}
	if err != nil {
		return nil, &portDialError{err}
	}
	return &idleConn{Conn: c, idle: portIdleTimeout, touch: t.touch}, nil
}

func (a *api) rewritePortRequest(pr *httputil.ProxyRequest) {
	t := pr.In.Context().Value(portTargetKey{}).(*portTarget)
	own := "localhost:" + strconv.Itoa(t.port)
	pr.Out.URL = &url.URL{Scheme: "http", Host: own, Path: t.path, RawPath: t.rawPath, RawQuery: pr.In.URL.RawQuery}
	pr.Out.Host = own
	pr.SetXForwarded()
	pr.Out.Header.Del("Authorization")
	if t.route.fwdPrefix != "" {
		pr.Out.Header.Set("X-Forwarded-Prefix", t.route.fwdPrefix)
	}
	if t.route.label == "" {
		// The API's origin has no cookie of a sandbox's.
		pr.Out.Header.Del("Cookie")
		return
	}
	// A preview origin: its name is the credential, kept from the server.
	pr.Out.Header.Del("X-Forwarded-Host")
	if o := pr.Out.Header.Get("Origin"); o != "" {
		if a.sameLabel(o, t.route.label) {
			pr.Out.Header.Set("Origin", "http://"+own)
		} else {
			pr.Out.Header.Set("Origin", "null") // another origin, perhaps another preview's
		}
	}
	if ref := pr.Out.Header.Get("Referer"); ref != "" {
		u, err := url.Parse(ref)
		if err == nil && a.sameLabel(ref, t.route.label) {
			pr.Out.Header.Set("Referer", "http://"+own+u.EscapedPath()+query(u))
		} else {
			pr.Out.Header.Del("Referer")
		}
	}
}

// sameLabel reports whether the URL or origin u is on the preview origin
// of label (whatever its scheme and port).
func (a *api) sameLabel(u, label string) bool {
	p, err := url.Parse(u)
	if err != nil {
		return false
	}
	l, ok := a.previewHost(p.Host)
	return ok && l == label
}

func query(u *url.URL) string {
	if u.RawQuery == "" {
		return ""
	}
	return "?" + u.RawQuery
}

// errPortRedirect is a redirect of the server's that leaves its preview.
var errPortRedirect = errors.New("the server redirected off its preview")

// rewritePortResponse applies the preview's rules to the server's answer:
// no Service-Worker-Allowed; on the API's origin no cookie and a CSP
// sandbox; on a preview origin host-only cookies and no Referer to other
// origins (it would carry the label). A redirect on the server's own
// origin (a path, or http://localhost:port/...) is put under the route's
// prefix, one on the preview's origin kept, and any other refused.
func (a *api) rewritePortResponse(res *http.Response) error {
	t := res.Request.Context().Value(portTargetKey{}).(*portTarget)
	h := res.Header
	h.Del("Service-Worker-Allowed")
	if t.route.label == "" {
		h.Del("Set-Cookie")
		h.Del("Clear-Site-Data")
		h["Content-Security-Policy"] = append([]string{"sandbox"}, h.Values("Content-Security-Policy")...)
	} else {
		if cs := h.Values("Set-Cookie"); len(cs) > 0 {
			h["Set-Cookie"] = hostOnlyCookies(cs)
		}
		h.Set("Referrer-Policy", "same-origin")
	}
	loc, ok := h["Location"]
	if !ok {
		return nil
	}
	if len(loc) != 1 {
		return errPortRedirect
	}
	next, ok := a.previewLocation(loc[0], t)
	if !ok {
		return errPortRedirect
	}
	h.Set("Location", next)
	return nil
}

// previewLocation is where the server's redirect to loc goes on t's
// route, or false when it would leave the preview. Backslashes and
// control characters, which browsers read as slashes or drop, are
// refused outright.
func (a *api) previewLocation(loc string, t *portTarget) (string, bool) {
	if strings.ContainsFunc(loc, func(r rune) bool { return r == '\\' || r < 0x20 || r == 0x7f }) {
		return "", false
	}
	u, err := url.Parse(loc)
	if err != nil {
		return "", false
	}
	switch {
	case u.Scheme == "" && u.Host == "" && !strings.HasPrefix(loc, "//"):
		if u.Opaque != "" {
			return "", false
		}
		if !strings.HasPrefix(u.Path, "/") {
			return loc, true // relative to the page: on its origin
		}
	case u.Scheme == "http" && isServerHost(u, t.port):
		// The server's own origin, as it sees itself.
	case t.route.label != "" && u.Scheme == t.route.scheme && portOf(u) == t.route.port && a.sameLabel(loc, t.route.label):
		return loc, true
	default:
		return "", false
	}
	u.Scheme, u.Host = "", ""
	next := strings.TrimSuffix(t.route.public, "/") + u.RequestURI() + fragment(u)
	if strings.HasPrefix(next, "//") {
		// On a preview origin (no prefix) a path of "//host/..." would be
		// read as another host's URL.
		return "", false
	}
	return next, true
}

// portOf is u's port, or its scheme's default.
func portOf(u *url.URL) string {
	if p := u.Port(); p != "" {
		return p
	}
	if u.Scheme == "https" {
		return "443"
	}
	return "80"
}

// isServerHost reports whether u names the server on port of the
// sandbox's loopback.
func isServerHost(u *url.URL, port int) bool {
	p := u.Port()
	if p == "" {
		p = "80"
	}
	if p != strconv.Itoa(port) || u.User != nil {
		return false
	}
	switch strings.ToLower(u.Hostname()) {
	case "localhost", "127.0.0.1", "::1":
		return true
	}
	return false
}

// hostOnlyCookies drops the Domain attribute of each Set-Cookie value: a
// cookie a preview's server sets stays on its own host, never reaching
// the previews of other sessions under the same domain.
func hostOnlyCookies(values []string) []string {
	out := make([]string, 0, len(values))
	for _, v := range values {
		parts := strings.Split(v, ";")
		kept := parts[:1]
		for _, p := range parts[1:] {
			name, _, _ := strings.Cut(strings.TrimSpace(p), "=")
			if strings.EqualFold(strings.TrimSpace(name), "domain") {
				continue
			}
			kept = append(kept, p)
		}
		out = append(out, strings.Join(kept, ";"))
	}
	return out
}

func fragment(u *url.URL) string {
	if u.Fragment == "" {
		return ""
	}
	return "#" + u.EscapedFragment()
}

// idleConn is a connection that fails a read or write once no byte moved
// either way for idle, and calls touch when bytes move.
type idleConn struct {
	net.Conn
	idle  time.Duration
	touch func()
}

func (c *idleConn) Read(p []byte) (int, error) {
	_ = c.Conn.SetDeadline(time.Now().Add(c.idle))
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.touch()
	}
	return n, err
}

func (c *idleConn) Write(p []byte) (int, error) {
	_ = c.Conn.SetDeadline(time.Now().Add(c.idle))
	n, err := c.Conn.Write(p)
	if n > 0 {
		c.touch()
	}
	return n, err
}

// CloseWrite half-closes the connection when it can (the WebSocket copy
// passes an EOF on).
func (c *idleConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// parsePort is s as a TCP port: 1..65535, decimal digits only.
func parsePort(s string) (int, bool) {
	if s == "" || len(s) > 5 || strings.TrimLeft(s, "0123456789") != "" {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return n, err == nil && n >= 1 && n <= 65535
}

func writeBadPort(w http.ResponseWriter, s string) {
	WriteError(w, http.StatusBadRequest, "invalid_port", fmt.Sprintf("port %q is not a TCP port: want 1..65535", truncate(s, 32)))
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// tail is the escaped path after its first n segments ("/" at least): the
// path on the sandbox's server.
func tail(escaped string, n int) string {
	rest := escaped
	for range n {
		i := strings.IndexByte(rest[1:], '/')
		if i < 0 {
			return "/"
		}
		rest = rest[i+1:]
	}
	return rest
}

// portRedirect answers a preview root without its trailing slash with a
// redirect to it, so the page's relative links resolve under the prefix.
func portRedirect(w http.ResponseWriter, r *http.Request) {
	u := r.URL.EscapedPath() + "/"
	if r.URL.RawQuery != "" {
		u += "?" + r.URL.RawQuery
	}
	http.Redirect(w, r, u, http.StatusPermanentRedirect)
}

// proxyPort serves /v1/sessions/{id}/ports/{port}/*: the request, to the
// caller's running session's port.
func (a *api) proxyPort(w http.ResponseWriter, r *http.Request) {
	if a.portsOff(w) {
		return
	}
	raw := chi.URLParam(r, "port")
	port, ok := parsePort(raw)
	if !ok {
		writeBadPort(w, raw)
		return
	}
	s, ok := a.dataSession(w, r)
	if !ok {
		return
	}
	// "/v1/sessions/{id}/ports/{port}" are five segments.
	escaped := r.URL.EscapedPath()
	rest := tail(escaped, 5)
	prefix := strings.TrimSuffix(escaped[:len(escaped)-len(rest)], "/")
	a.servePort(w, r, s, port, rest, portRoute{public: prefix, fwdPrefix: prefix})
}

// portsOff answers 403 ports_disabled when the gateway serves no
// preview, and says whether it did.
func (a *api) portsOff(w http.ResponseWriter) bool {
	if !a.cfg.NoPorts {
		return false
	}
	WriteError(w, http.StatusForbidden, "ports_disabled",
		"this gateway does not reach into sandboxes' ports (serve --ssh-allow-local-forward=false)")
	return true
}

// servePort proxies r to port in s's sandbox, at the escaped path rest.
func (a *api) servePort(w http.ResponseWriter, r *http.Request, s *gateway.Session, port int, rest string, route portRoute) {
	if r.Method == http.MethodConnect {
		WriteError(w, http.StatusMethodNotAllowed, "method_not_allowed", "CONNECT is not passed to a preview; every other method is")
		return
	}
	if refuseServiceWorker(w, r) {
		return
	}
	if err := s.Wake(r.Context()); err != nil { // a paused session resumes on a preview request
		WriteGatewayError(w, err)
		return
	}
	dialer, ok := sandbox.As[sandbox.LoopbackDialer](s.Sandbox())
	if !ok {
		WriteError(w, http.StatusNotImplemented, "ports_unsupported", "this gateway's sandbox driver cannot reach a sandbox's ports")
		return
	}
	if !a.ports.acquire(s.ID) {
		w.Header().Set("Retry-After", "1")
		WriteError(w, http.StatusServiceUnavailable, "too_many_connections",
			fmt.Sprintf("the session has %d preview requests open (WebSockets included); close some", portMaxConns))
		return
	}
	defer a.ports.release(s.ID)
	t := &portTarget{dialer: dialer, port: port, rawPath: rest, route: route,
		touch: func() { s.Touch(time.Now()) }}
	p, err := url.PathUnescape(rest)
	if err != nil {
		WriteError(w, http.StatusBadRequest, "invalid_path", "the path is not validly escaped")
		return
	}
	t.path = p
	if t.path == t.rawPath {
		t.rawPath = ""
	}
	if r.ContentLength > portBodyBytes {
		WriteError(w, http.StatusRequestEntityTooLarge, "body_too_large", fmt.Sprintf("a preview request body is at most %d bytes", portBodyBytes))
		return
	}
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = http.MaxBytesReader(w, r.Body, portBodyBytes)
	}
	ctx := context.WithValue(r.Context(), portTargetKey{}, t)
	a.ports.rp.ServeHTTP(w, r.WithContext(ctx))
}

func (p *portsProxy) acquire(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.open[id] >= portMaxConns {
		return false
	}
	p.open[id]++
	return true
}

func (p *portsProxy) release(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.open[id]--; p.open[id] <= 0 {
		delete(p.open, id)
	}
}

// portError answers a request the proxy could not complete.
func (a *api) portError(w http.ResponseWriter, r *http.Request, err error) {
	var mbe *http.MaxBytesError
	if !errors.Is(err, errPortRedirect) && !errors.As(err, &mbe) && errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		return // the client left: nobody reads an answer
	}
	WriteGatewayError(w, a.portFailure(r, err))
}

// portFailure is the client-facing form of the proxy's failure err.
func (a *api) portFailure(r *http.Request, err error) *gateway.Error {
	t, _ := r.Context().Value(portTargetKey{}).(*portTarget)
	port := 0
	if t != nil {
		port = t.port
	}
	var de *portDialError
	var mbe *http.MaxBytesError
	switch {
	case errors.Is(err, errPortRedirect):
		return &gateway.Error{Kind: gateway.KindUpstream, Code: "port_redirect_refused", Err: err,
			Message: fmt.Sprintf("the server on port %d redirected off its preview's origin; a preview only redirects within itself", port)}
	case errors.As(err, &mbe):
		return &gateway.Error{Kind: gateway.KindTooLarge, Code: "body_too_large", Err: err,
			Message: fmt.Sprintf("a preview request body is at most %d bytes", portBodyBytes)}
	case errors.As(err, &de) && errors.Is(err, sandbox.ErrStopped):
		return &gateway.Error{Kind: gateway.KindUpstream, Code: "port_unreachable", Err: err,
			Message: fmt.Sprintf("nothing listens on port %d: the session is stopped (its next command starts it again)", port)}
	case errors.As(err, &de):
		return &gateway.Error{Kind: gateway.KindUpstream, Code: "port_unreachable", Err: err,
			Message: fmt.Sprintf("nothing answers on port %d inside the sandbox (localhost, 127.0.0.1 or ::1): %s", port, connectErrText(de.err))}
	case isTimeout(err):
		return &gateway.Error{Kind: gateway.KindUpstreamTimeout, Code: "port_timeout", Err: err,
			Message: fmt.Sprintf("the server on port %d sent no response in time", port)}
	}
	a.cfg.Log.Info("port_proxy_failed", "port", port, "err", err)
	return &gateway.Error{Kind: gateway.KindUpstream, Code: "port_bad_response", Err: err,
		Message: fmt.Sprintf("the server on port %d broke off the exchange or answered with no valid HTTP", port)}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() || strings.Contains(err.Error(), "timeout awaiting response headers")
}

// connectErrText is a dial error without the gateway's own details.
func connectErrText(err error) string {
	var oe *net.OpError
	switch {
	case errors.As(err, &oe) && oe.Err != nil:
		return oe.Err.Error()
	case errors.Is(err, context.DeadlineExceeded):
		return "timed out"
	case errors.Is(err, sandbox.ErrClosed):
		return "the sandbox is gone"
	}
	return "cannot connect"
}

// portLinkRequest is the body of POST /v1/sessions/{id}/ports/link.
type portLinkRequest struct {
	Port      *int `json:"port"`
	ExpiresIn *int `json:"expiresIn"`
}

// portLinkPayload is what a port link carries, signed.
type portLinkPayload struct {
	V       int    `json:"v"`
	Session string `json:"s"`
	Port    int    `json:"port"`
	Expires int64  `json:"e"`
}

func signPortLink(key []byte, tenant, session string, port int, expires time.Time) string {
	return signToken(key, portLinkDomain, tenant, portLinkPayload{V: 1, Session: session, Port: port, Expires: expires.Unix()})
}

// parsePortLink decodes a port link's token without verifying it.
func parsePortLink(token string) (string, portLinkPayload, []byte, bool) {
	return parseToken(token, func(lp portLinkPayload) bool {
		return lp.V == 1 && lp.Session != "" && lp.Port >= 1 && lp.Port <= 65535
	})
}

// portLink serves /v1/sessions/{id}/ports/link: POST makes a link; any
// other method is a 405 (not a preview of a port named "link").
func (a *api) portLink(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		WriteError(w, http.StatusMethodNotAllowed, "method_not_allowed", fmt.Sprintf("method %s not allowed here", r.Method))
		return
	}
	a.createPortLink(w, r)
}

// createPortLink serves POST /v1/sessions/{id}/ports/link: a presigned
// URL for a port's preview, on an origin of its own (preview.go). Nothing
// need listen yet.
func (a *api) createPortLink(w http.ResponseWriter, r *http.Request) {
	if a.portsOff(w) {
		return
	}
	var req portLinkRequest
	if status, code, msg := DecodeJSON(w, r, &req); status != 0 {
		WriteError(w, status, code, msg)
		return
	}
	if req.Port == nil || *req.Port < 1 || *req.Port > 65535 {
		got := "none"
		if req.Port != nil {
			got = strconv.Itoa(*req.Port)
		}
		WriteError(w, http.StatusBadRequest, "invalid_port", "port must be a TCP port, 1..65535; got "+got)
		return
	}
	expiresIn, ok := linkExpiresIn(w, req.ExpiresIn)
	if !ok {
		return
	}
	s, ok := a.linkedSession(w, r)
	if !ok {
		return
	}
	expires := linkExpiry(expiresIn)
	u, err := a.previewURL(r, s.Tenant, s.ID, *req.Port, expires)
	if err != nil {
		a.cfg.Log.ErrorContext(r.Context(), "port_link_failed", "session", s.ID, "err", err)
		WriteError(w, http.StatusInternalServerError, "internal", "internal error")
		return
	}
	a.cfg.Log.Info("port_link_created", "session", s.ID, "tenant", s.Tenant, "port", *req.Port, "expires_at", expires)
	_ = WriteJSON(w, http.StatusOK, linkJSON{URL: u, ExpiresAt: expires})
}

// proxyPortLink serves /links/ports/{token}/*, the port links of earlier
// versions, without authentication: if the link verifies, has not
// expired and its session still runs, a redirect (307) to the same path
// on the port's preview origin, which expires with the link. Nothing of
// the sandbox is served on the API's origin.
func (a *api) proxyPortLink(w http.ResponseWriter, r *http.Request) {
	if a.portsOff(w) {
		return
	}
	token := chi.URLParam(r, "token")
	fail := func(status int, code, msg string) {
		a.cfg.Log.Info("port_link_refused", "remote", r.RemoteAddr, "code", code)
		WriteError(w, status, code, msg)
	}
	enc, lp, sig, ok := parsePortLink(token)
	if !ok {
		a.badLink(w, r, fail)
		return
	}
	tenant, s, ok := a.linkSession(w, r, fail, lp.Session, lp.Expires, func(tenant string) bool {
		return hmac.Equal(sig, tokenMAC(a.cfg.LinkKey, portLinkDomain, tenant, enc))
	}, func(err error) { WriteGatewayError(w, err) })
	if !ok {
		return
	}
	// The link is the credential: the call is the session tenant's, as
	// for a file link (fetchLink), so the owner sees it in GET /v1/audit.
	if c := callOf(r.Context()); c != nil {
		c.tenant, c.auth, c.session = tenant, "link", s.ID
	}
	u, err := a.previewURL(r, tenant, s.ID, lp.Port, time.Unix(lp.Expires, 0))
	if err != nil {
		a.cfg.Log.ErrorContext(r.Context(), "port_link_failed", "session", s.ID, "err", err)
		WriteError(w, http.StatusInternalServerError, "internal", "internal error")
		return
	}
	// "/links/ports/{token}" are three segments.
	u = strings.TrimSuffix(u, "/") + tail(r.URL.EscapedPath(), 3) + query(r.URL)
	http.Redirect(w, r, u, http.StatusTemporaryRedirect)
}

// servePreview serves every request on a preview origin
// (p{port}-{label}.{domain}): the request, to the label's port, if the
// label verifies, has not expired and its session still runs.
func (a *api) servePreview(w http.ResponseWriter, r *http.Request) {
	if c := callOf(r.Context()); c != nil {
		c.route = previewRoute
	}
	if a.portsOff(w) {
		return
	}
	fail := func(status int, code, msg string) {
		a.cfg.Log.Info("preview_refused", "remote", r.RemoteAddr, "code", code)
		WriteError(w, status, code, msg)
	}
	label, _ := a.previewHost(r.Host)
	l, ok := parsePreviewLabel(label)
	if !ok {
		a.badLink(w, r, fail)
		return
	}
	tenant, s, ok := a.linkSession(w, r, fail, l.session, l.expires, func(tenant string) bool {
		return l.verify(a.cfg.LinkKey, tenant)
	}, func(err error) { WriteGatewayError(w, err) })
	if !ok {
		return
	}
	if c := callOf(r.Context()); c != nil {
		c.tenant, c.auth, c.session = tenant, "link", s.ID
	}
	s.Touch(time.Now())
	route := portRoute{label: label}
	if base, err := url.Parse(a.baseURL(r)); err == nil {
		route.scheme, route.port = base.Scheme, portOf(base)
	}
	a.servePort(w, r, s, l.port, r.URL.EscapedPath(), route)
}

// previewRoute is the route a preview origin's calls are audited under.
const previewRoute = "{preview origin}/*"

// refuseServiceWorker answers 403 service_worker_refused to a browser's
// fetch of a service worker's script (Service-Worker: script), and says
// whether it did: content of a sandbox never installs a worker, whose
// scope would outlive the page.
func refuseServiceWorker(w http.ResponseWriter, r *http.Request) bool {
	if r.Header.Get("Service-Worker") == "" {
		return false
	}
	WriteError(w, http.StatusForbidden, "service_worker_refused",
		"content served by a sandbox cannot be a service worker's script")
	return true
}
