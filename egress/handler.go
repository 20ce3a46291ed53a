package egress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// record is one connection's or request's accounting, logged when it ends.
type record struct {
	kind  string // "connect", "http" or "https" (a request inside an intercepted tunnel)
	start time.Time
	in    atomic.Int64 // upstream -> sandbox
	out   atomic.Int64 // sandbox -> upstream

	mu      sync.Mutex
	host    string
	port    uint16
	ip      netip.Addr
	allowed bool
	reason  string // why denied
	err     string // why an allowed exchange failed
	// tripwire is the secret whose placeholder was headed elsewhere.
	tripwire string
	// approval is an approval's result (kind "ask"): AskApproved,
	// AskDenied or AskTimeout.
	approval string

	// x is a plain http:// exchange's stall watchdog (nil for others),
	// touched as its bodies move.
	x *plainExchange
}

func newRecord(kind string) *record { return &record{kind: kind, start: time.Now()} }

func (r *record) setTarget(host string, port uint16) {
	r.mu.Lock()
	r.host, r.port = host, port
	r.mu.Unlock()
}

func (r *record) setIP(ip netip.Addr) {
	r.mu.Lock()
	if ip.IsValid() {
		r.ip = ip
	}
	r.mu.Unlock()
}

func (r *record) allow() {
	r.mu.Lock()
	r.allowed = true
	r.mu.Unlock()
}

func (r *record) deny(reason string) {
	r.mu.Lock()
	r.allowed, r.reason = false, reason
	r.mu.Unlock()
}

func (r *record) fail(err string) {
	r.mu.Lock()
	if r.err == "" {
		r.err = err
	}
	r.mu.Unlock()
}

// logRecord writes the accounting line. It never carries header values.
func (s *Session) logRecord(r *record) {
	r.mu.Lock()
	defer r.mu.Unlock()
	attrs := []slog.Attr{
		slog.String("kind", r.kind),
		slog.String("host", r.host),
		slog.Int("port", int(r.port)),
		slog.String("ip", addrString(r.ip)),
		slog.Bool("allowed", r.allowed),
	}
	if !r.allowed {
		attrs = append(attrs, slog.String("reason", r.reason))
	}
	if r.tripwire != "" {
		attrs = append(attrs, slog.String("tripwire", r.tripwire))
	}
	if r.approval != "" {
		attrs = append(attrs, slog.String("approval", r.approval))
	}
	if r.err != "" {
		attrs = append(attrs, slog.String("error", r.err))
	}
	attrs = append(attrs,
		slog.Int64("bytesOut", r.out.Load()),
		slog.Int64("bytesIn", r.in.Load()),
		slog.Int64("durationMs", time.Since(r.start).Milliseconds()),
	)
	s.log.LogAttrs(context.Background(), slog.LevelInfo, "egress", attrs...)
	if fn := s.onRecord.Load(); fn != nil {
		ip := addrString(r.ip)
		if _, err := netip.ParseAddr(r.host); err != nil && !r.allowed {
			ip = "" // the private address a name was refused at is the operator's log's only
		}
		(*fn)(Record{Kind: r.kind, Host: r.host, Port: int(r.port), IP: ip, Allowed: r.allowed,
			Reason: r.reason, Error: r.err, BytesOut: r.out.Load(), BytesIn: r.in.Load(),
			Start: r.start, DurationMs: time.Since(r.start).Milliseconds(), Tripwire: r.tripwire, Approval: r.approval})
	}
}

// Record is one connection's accounting, as its log line says it.
type Record struct {
	Kind     string // connect, http, tcp (transparent), dns (a name refused) or ask (an approval)
	Host     string
	Port     int
	IP       string // the address dialled, "" when none was
	Allowed  bool
	Reason   string // why it was denied
	Error    string // what failed after it was allowed
	BytesOut int64  // sandbox -> upstream
	BytesIn  int64  // upstream -> sandbox
	// Tripwire is the name of the secret bound to other hosts whose
	// placeholder the refused request carried ("" for other refusals).
	Tripwire string
	// Approval is an approval's result, for kind "ask" (a decision on a
	// connection parked in ask mode): approved, denied or timeout.
	Approval string
	// Start is when the connection was accepted or the request read.
	Start time.Time
	// DurationMs is how long the connection lasted.
	DurationMs int64
}

// OnRecord makes fn receive each connection's Record when it ends (the
// audit trail's egress decisions). Set it before Serve.
func (s *Session) OnRecord(fn func(Record)) { s.onRecord.Store(&fn) }

func addrString(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}

// writeLine answers with a one-line text body "sandgate egress: msg".
func writeLine(w http.ResponseWriter, status int, msg string) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	body := "sandgate egress: " + oneLine(msg) + "\n"
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	io.WriteString(w, body)
}

func oneLine(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '\n' || r == '\r' {
			return ' '
		}
		return r
	}, s)
}

// serveHTTP dispatches a sandbox request: CONNECT, an absolute http://
// URI, or nothing else.
func (s *Session) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if !s.enter() {
		writeLine(w, http.StatusServiceUnavailable, "session closed")
		return
	}
	defer s.wg.Done()
	switch {
	case r.Method == http.MethodConnect:
		s.handleConnect(w, r)
	case r.URL.IsAbs():
		s.handlePlain(w, r)
	default:
		writeLine(w, http.StatusBadRequest, "not a proxy request: want CONNECT host:port or an absolute http:// URI")
	}
}

// splitHostPort splits and normalizes host:port (port required).
func splitHostPort(hp string) (string, uint16, error) {
	h, p, err := net.SplitHostPort(hp)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.ParseUint(p, 10, 16)
	if err != nil || port == 0 {
		return "", 0, fmt.Errorf("invalid port %q", p)
	}
	host, _, ok := normalizeHost(h)
	if !ok {
		return "", 0, fmt.Errorf("invalid host %q", h)
	}
	return host, uint16(port), nil
}

// hostHeader is the Host header for host:port, the port left out when it
// is the scheme's default.
func hostHeader(host string, port, defaultPort uint16) string {
	if port == defaultPort {
		if strings.Contains(host, ":") {
			return "[" + host + "]"
		}
		return host
	}
	return hostPort(host, port)
}

// upgradeOf returns the protocol a request asks to switch to (its
// Upgrade header, when Connection names it), "" when none.
func upgradeOf(h http.Header) string {
	for _, v := range h.Values("Connection") {
		for tok := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), "upgrade") {
				return strings.TrimSpace(h.Get("Upgrade"))
			}
		}
	}
	return ""
}

// writeDenial answers d, its code (if any) in the X-Sandgate-Code header.
func writeDenial(w http.ResponseWriter, target string, d *denial) {
	if d.Code != "" {
		w.Header().Set("X-Sandgate-Code", d.Code)
	}
	writeLine(w, d.Status, denyMsg(target, d))
}

func denyMsg(target string, d *denial) string {
	if d.Status == http.StatusForbidden {
		return target + " denied: " + d.Reason
	}
	return target + ": " + d.Reason
}

// handleConnect serves CONNECT host:port: policy, checked dial, then a
// spliced tunnel or, for hosts with bound secrets, TLS interception.
func (s *Session) handleConnect(w http.ResponseWriter, r *http.Request) {
	rec := newRecord("connect")
	defer s.logRecord(rec)
	w.Header().Set("Connection", "close") // a refused CONNECT ends its connection
	host, port, err := splitHostPort(r.Host)
	if err != nil {
		rec.setTarget(r.Host, 0)
		rec.deny("bad CONNECT target")
		writeLine(w, http.StatusBadRequest, fmt.Sprintf("bad CONNECT target %q: want host:port", r.Host))
		return
	}
	rec.setTarget(host, port)
	target := hostPort(host, port)
	pol := s.pol.Load()
	if !pol.Allow.Allows(host, port) {
		if d := s.ask(r.Context(), pol, host, port, "proxy", r.UserAgent()); d != nil {
			rec.deny(d.Reason)
			writeDenial(w, target, d)
			return
		}
		pol = s.pol.Load() // approved: as the policy now stands
	}
	intercept := len(pol.bound(host, port)) > 0
	if intercept && s.ca == nil {
		rec.deny("secrets are bound to this host but the session has no CA")
		writeLine(w, http.StatusBadGateway, target+": secrets are bound to this host but the session has no CA")
		return
	}
	// Rules per request are read in what the CA intercepts.
	intercept = intercept || s.ca != nil && pol.Allow.OnlyRules(host, port)
	if !intercept && pol.Allow.OnlyRules(host, port) {
		rec.deny(errRulesUnread)
		writeLine(w, http.StatusForbidden, target+" denied: "+errRulesUnread)
		return
	}
	up, ip, err := s.dialCounted(r.Context(), host, port)
	rec.setIP(ip)
	if err != nil {
		var d *denial
		if !errors.As(err, &d) {
			d = denied(http.StatusBadGateway, "%v", err)
		}
		rec.deny(d.Reason)
		writeLine(w, d.Status, denyMsg(target, d))
		return
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		up.Close()
		rec.deny("hijack failed")
		writeLine(w, http.StatusInternalServerError, "cannot take over the connection")
		return
	}
	var buffered []byte
	if n := brw.Reader.Buffered(); n > 0 {
		b, _ := brw.Reader.Peek(n)
		buffered = append([]byte(nil), b...)
	}
	conn.SetWriteDeadline(time.Now().Add(s.p.cfg.HeaderTimeout))
	if _, err := io.WriteString(conn, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		conn.Close()
		up.Close()
		rec.deny("client gone")
		return
	}
	conn.SetWriteDeadline(time.Time{})
	rec.allow()
	t := &tunnel{s: s, rec: rec, pol: pol, host: host, port: port, ip: ip, client: conn, up: up, buffered: buffered}
	if intercept {
		s.intercept(t)
	} else {
		s.splice(t)
	}
}

// handlePlain checks an absolute-URI http:// request and forwards it
// (forwardPlain).
func (s *Session) handlePlain(w http.ResponseWriter, r *http.Request) {
	rec := newRecord("http")
	defer s.logRecord(rec)
	u := r.URL
	if u.Scheme != "http" {
		rec.setTarget(u.Host, 0)
		rec.deny("not http")
		writeLine(w, http.StatusBadRequest, fmt.Sprintf("absolute URI with scheme %q: only http:// URIs are proxied; use CONNECT for TLS", u.Scheme))
		return
	}
	port := uint16(80)
	if ps := u.Port(); ps != "" {
		p, err := strconv.ParseUint(ps, 10, 16)
		if err != nil || p == 0 {
			rec.setTarget(u.Host, 0)
			rec.deny("bad port")
			writeLine(w, http.StatusBadRequest, fmt.Sprintf("invalid port in %q", u.Host))
			return
		}
		port = uint16(p)
	}
	host, _, ok := normalizeHost(u.Hostname())
	if !ok {
		rec.setTarget(u.Host, port)
		rec.deny("bad host")
		writeLine(w, http.StatusBadRequest, fmt.Sprintf("invalid host %q", u.Hostname()))
		return
	}
	rec.setTarget(host, port)
	target := hostPort(host, port)
	pol := s.pol.Load()
	approved := false
	if !pol.Allow.Allows(host, port) {
		if d := s.ask(r.Context(), pol, host, port, "proxy", r.UserAgent()); d != nil {
			rec.deny(d.Reason)
			writeDenial(w, target, d)
			return
		}
		pol, approved = s.pol.Load(), true
	}
	if ok, rule := pol.Allow.AllowsRequest(host, port, r.Method, u.Path); !ok && !(approved && rule == "") {
		rec.deny("refused by the rule " + rule)
		writeLine(w, http.StatusForbidden, fmt.Sprintf("%s %s%s denied by the rule %s", r.Method, target, u.EscapedPath(), rule))
		return
	}
	s.forwardPlain(w, r, rec, pol, host, port)
}

// forwardPlain forwards a plain HTTP request for host:port, its policy
// checked but for the tripwire, in origin form to the checked address
// (the session's transport): from the proxy (an absolute http:// URI) and
// from a transparent connection (servePlainConn) alike. Placeholders are
// stripped: secrets never travel in cleartext.
func (s *Session) forwardPlain(w http.ResponseWriter, r *http.Request, rec *record, pol *Policy, host string, port uint16) {
	target := hostPort(host, port)
	if up := upgradeOf(r.Header); up != "" && !strings.EqualFold(up, "websocket") && pol.Allow.OnlyRules(host, port) {
		// After a protocol switch the rules could not read the requests
		// (h2c would carry any method and path): only WebSocket, whose
		// opening request the rules judged, goes on.
		rec.deny("an Upgrade to a host held to rules per request")
		writeLine(w, http.StatusForbidden, fmt.Sprintf("%s %s%s denied: Upgrade %.64q to a host held to rules per request (only websocket)", r.Method, target, r.URL.EscapedPath(), up))
		return
	}
	if !s.checkTripwire(w, r, pol, rec, host, port) {
		return
	}
	rec.allow()
	ctx, x, stop := s.plainStall(r, rec, target)
	defer stop()
	rec.x = x
	r = r.WithContext(ctx)
	phs := pol.placeholders()
	rp := s.reverseProxy(rec, target, func(out *http.Request) {
		out.URL.Scheme = "http"
		out.URL.Host = target
		out.Host = hostHeader(host, port, 80)
		if out.URL.User != nil && containsAny(out.URL.User.String(), phs) {
			out.URL.User = nil
		}
		stripPlaceholders(out.Header, phs)
	}, s.plain)
	rp.ServeHTTP(w, withTrace(r, rec))
}

// withTrace records the address of the connection a request goes out on,
// and counts the request body.
func withTrace(r *http.Request, rec *record) *http.Request {
	ctx := httptrace.WithClientTrace(r.Context(), &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) {
			if ap, err := netip.ParseAddrPort(info.Conn.RemoteAddr().String()); err == nil {
				rec.setIP(ap.Addr().Unmap())
			}
		},
	})
	r = r.WithContext(ctx)
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = &countBody{ReadCloser: r.Body, n: &rec.out, x: rec.x}
	}
	return r
}

// reverseProxy forwards to target with rewrite applied to the outgoing
// request; errors become one-line 502s (403 for the address rule).
func (s *Session) reverseProxy(rec *record, target string, rewrite func(*http.Request), tr http.RoundTripper) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite:       func(pr *httputil.ProxyRequest) { rewrite(pr.Out) },
		Transport:     tr,
		FlushInterval: 100 * time.Millisecond,
		ErrorLog:      slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
		ModifyResponse: func(resp *http.Response) error {
			if rec.x != nil {
				rec.x.w.touch()
				rec.x.responded.Store(true)
			}
			if resp.StatusCode != http.StatusSwitchingProtocols {
				resp.Body = &countBody{ReadCloser: resp.Body, n: &rec.in, x: rec.x}
			} else if rwc, ok := resp.Body.(io.ReadWriteCloser); ok && rec.x != nil {
				// An upgraded connection (a WebSocket) stays under the
				// watchdog: both directions touch it.
				resp.Body = &upgradedBody{ReadWriteCloser: rwc, x: rec.x}
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			var d *denial
			switch {
			case errors.As(err, &d):
				rec.deny(d.Reason)
				writeLine(w, d.Status, denyMsg(target, d))
			case errors.Is(context.Cause(r.Context()), errStalled):
				// The watchdog's read deadline ended the connection's
				// reads (and the server's context for it): it takes no
				// next request.
				w.Header().Set("Connection", "close")
				writeLine(w, http.StatusGatewayTimeout, fmt.Sprintf("%s: closed: no byte moved either way for %v (serve --egress-idle-timeout)", target, s.p.cfg.IdleTimeout))
			case r.Context().Err() != nil:
				rec.fail("client gone")
				w.WriteHeader(http.StatusBadGateway)
			default:
				msg := unwrapOpError(err).Error()
				rec.fail(msg)
				writeLine(w, http.StatusBadGateway, target+": upstream error: "+msg)
			}
		},
	}
}

// countBody counts the bytes read through a body.
type countBody struct {
	io.ReadCloser
	n *atomic.Int64
	x *plainExchange // touched as bytes move (nil: none)
}

// upgradedBody is the upstream side of an upgraded plain http://
// exchange, touching its watchdog as bytes move either way.
type upgradedBody struct {
	io.ReadWriteCloser
	x *plainExchange
}

func (b *upgradedBody) Read(p []byte) (int, error) {
	n, err := b.ReadWriteCloser.Read(p)
	if n > 0 {
		b.x.w.touch()
	}
	return n, err
}

func (b *upgradedBody) Write(p []byte) (int, error) {
	n, err := b.ReadWriteCloser.Write(p)
	if n > 0 {
		b.x.w.touch()
	}
	return n, err
}

func (b *countBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	if n > 0 && b.x != nil {
		b.x.w.touch()
	}
	return n, err
}
