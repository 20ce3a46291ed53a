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

// Preview URLs: /v1/sessions/{id}/ports/{port}/{path...} (authenticated)
// and /links/ports/{token}/{path...} (a presigned link, POST
// /v1/sessions/{id}/ports/link) reverse-proxy HTTP, WebSocket upgrades
// included, to localhost:port inside the session's sandbox. The gateway
// connects through sandbox.LoopbackDialer, as `ssh -L` does (sshd/forward.go):
// the sandbox's own loopback, never another host.
//
// The client's Authorization header never reaches the sandbox, nor does a
// link's token (it is in the path the gateway strips, and a Referer that
// carries it is dropped). The server sees Host localhost:port (dev servers
// check it), X-Forwarded-For, -Host and -Proto, and, on the authenticated
// route, X-Forwarded-Prefix.

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
	// route's prefix); prefix is the route's prefix for X-Forwarded-Prefix
	// ("" on a link: it would carry the token); token is a link's token.
	path, rawPath, prefix, token string
	// touch counts moved bytes as the session's activity (a WebSocket
	// that only talks keeps its session from the idle timeout).
	touch func()
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
		Rewrite:        rewritePortRequest,
		Transport:      tr,
		FlushInterval:  -1, // stream as the server writes (server-sent events, progress)
		ModifyResponse: rewritePortResponse,
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

func rewritePortRequest(pr *httputil.ProxyRequest) {
	t := pr.In.Context().Value(portTargetKey{}).(*portTarget)
	host := "localhost:" + strconv.Itoa(t.port)
	pr.Out.URL = &url.URL{Scheme: "http", Host: host, Path: t.path, RawPath: t.rawPath, RawQuery: pr.In.URL.RawQuery}
	pr.Out.Host = host
	pr.SetXForwarded()
	pr.Out.Header.Del("Authorization")
	if t.prefix != "" {
		pr.Out.Header.Set("X-Forwarded-Prefix", t.prefix)
	}
	if t.token != "" && strings.Contains(pr.Out.Header.Get("Referer"), t.token) {
		pr.Out.Header.Del("Referer")
	}
}

// rewritePortResponse keeps the server's redirects inside the preview: a
// Location on the server's own origin (a path, or http://localhost:port/...)
// is put under the route's prefix.
func rewritePortResponse(res *http.Response) error {
	loc := res.Header.Get("Location")
	if loc == "" {
		return nil
	}
	t := res.Request.Context().Value(portTargetKey{}).(*portTarget)
	prefix := res.Request.Context().Value(portPrefixKey{}).(string)
	u, err := url.Parse(loc)
	if err != nil {
		return nil
	}
	own := u.Host == "" && u.Scheme == "" && strings.HasPrefix(u.Path, "/") && !strings.HasPrefix(loc, "//")
	if u.Scheme == "http" && (u.Host == "localhost:"+strconv.Itoa(t.port) || u.Host == "127.0.0.1:"+strconv.Itoa(t.port)) {
		own = true
	}
	if own {
		u.Scheme, u.Host = "", ""
		res.Header.Set("Location", strings.TrimSuffix(prefix, "/")+u.RequestURI()+fragment(u))
	}
	return nil
}

func fragment(u *url.URL) string {
	if u.Fragment == "" {
		return ""
	}
	return "#" + u.EscapedFragment()
}

// portPrefixKey holds the public prefix of the request's route (a link's
// included), for redirects.
type portPrefixKey struct{}

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
	a.servePort(w, r, s, port, rest, prefix, prefix, "")
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
func (a *api) servePort(w http.ResponseWriter, r *http.Request, s *gateway.Session, port int, rest, public, fwdPrefix, token string) {
	if r.Method == http.MethodConnect {
		WriteError(w, http.StatusMethodNotAllowed, "method_not_allowed", "CONNECT is not passed to a preview; every other method is")
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
	t := &portTarget{dialer: dialer, port: port, rawPath: rest, prefix: fwdPrefix, token: token,
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
	ctx = context.WithValue(ctx, portPrefixKey{}, public)
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
	t, _ := r.Context().Value(portTargetKey{}).(*portTarget)
	port := 0
	if t != nil {
		port = t.port
	}
	var de *portDialError
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		WriteError(w, http.StatusRequestEntityTooLarge, "body_too_large", fmt.Sprintf("a preview request body is at most %d bytes", portBodyBytes))
	case errors.Is(err, context.Canceled) && r.Context().Err() != nil:
		// The client left: nobody reads an answer.
	case errors.As(err, &de) && errors.Is(err, sandbox.ErrStopped):
		WriteError(w, http.StatusBadGateway, "port_unreachable",
			fmt.Sprintf("nothing listens on port %d: the session is stopped (its next command starts it again)", port))
	case errors.As(err, &de):
		WriteError(w, http.StatusBadGateway, "port_unreachable",
			fmt.Sprintf("nothing answers on port %d inside the sandbox (localhost, 127.0.0.1 or ::1): %s", port, connectErrText(de.err)))
	case isTimeout(err):
		WriteError(w, http.StatusGatewayTimeout, "port_timeout",
			fmt.Sprintf("the server on port %d sent no response in time", port))
	default:
		a.cfg.Log.Info("port_proxy_failed", "port", port, "err", err)
		WriteError(w, http.StatusBadGateway, "port_bad_response",
			fmt.Sprintf("the server on port %d broke off the exchange or answered with no valid HTTP", port))
	}
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
// URL for the prefix of a port's preview. Nothing need listen yet.
func (a *api) createPortLink(w http.ResponseWriter, r *http.Request) {
	if a.portsOff(w) {
		return
	}
	var req portLinkRequest
	if status, code, msg := decodeJSON(w, r, &req); status != 0 {
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
	token := signPortLink(a.cfg.LinkKey, s.Tenant, s.ID, *req.Port, expires)
	a.cfg.Log.Info("port_link_created", "session", s.ID, "tenant", s.Tenant, "port", *req.Port, "expires_at", expires)
	_ = writeJSON(w, http.StatusOK, linkJSON{URL: gatewayURL(r) + "/links/ports/" + token + "/", ExpiresAt: expires})
}

// proxyPortLink serves /links/ports/{token}/*, without authentication: the
// request, to the link's port, if the link verifies, has not expired and
// its session still runs.
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
	s.Touch(time.Now())
	// "/links/ports/{token}" are three segments.
	escaped := r.URL.EscapedPath()
	rest := tail(escaped, 3)
	public := strings.TrimSuffix(escaped[:len(escaped)-len(rest)], "/")
	a.servePort(w, r, s, lp.Port, rest, public, "", token)
}
