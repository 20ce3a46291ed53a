package egress

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// tunnel is an established CONNECT: the 200 was written, upstream dialed.
type tunnel struct {
	s        *Session
	rec      *record
	pol      *Policy
	host     string // normalized CONNECT host
	port     uint16
	ip       netip.Addr
	client   net.Conn // hijacked (*clientConn)
	up       net.Conn // *countConn
	buffered []byte   // client bytes the HTTP server read past the CONNECT
	// transparent: a redirected connection (ServeTransparent), whose
	// plain HTTP is served request by request (servePlainConn).
	transparent bool
	// approved: the connection was approved in ask mode (ask.go).
	approved bool

	last       atomic.Int64 // unix nanoseconds: when a byte last moved
	mu         sync.Mutex
	watch      *time.Timer // the idle watchdog (watchIdle)
	halfClosed bool        // one side has closed: the shorter grace applies
	stopped    bool        // the tunnel ended: the watchdog is off
}

func (t *tunnel) closeBoth() {
	t.client.Close()
	t.up.Close()
}

// touch notes that bytes moved.
func (t *tunnel) touch() { t.last.Store(time.Now().UnixNano()) }

// watchIdle starts the watchdog that closes the tunnel once no byte moved
// either way for IdleTimeout, or, after one side closed (halfClose), for
// HalfCloseTimeout. The returned func stops it.
func (t *tunnel) watchIdle() (stop func()) {
	t.touch()
	t.mu.Lock()
	t.watch = time.AfterFunc(t.s.p.cfg.IdleTimeout, t.checkIdle)
	t.mu.Unlock()
	return func() {
		t.mu.Lock()
		t.stopped = true
		t.watch.Stop()
		t.mu.Unlock()
	}
}

func (t *tunnel) checkIdle() {
	t.mu.Lock()
	if t.stopped {
		t.mu.Unlock()
		return
	}
	limit, what := t.s.p.cfg.IdleTimeout, "idle"
	if t.halfClosed {
		limit, what = t.s.p.cfg.HalfCloseTimeout, "half-closed and idle"
	}
	idle := time.Since(time.Unix(0, t.last.Load()))
	if idle < limit {
		t.watch.Reset(limit - idle)
		t.mu.Unlock()
		return
	}
	t.mu.Unlock()
	t.rec.fail(fmt.Sprintf("closed: %s for %v", what, limit))
	t.closeBoth()
}

// halfClose notes that one side has closed: the tunnel ends once the
// other moves nothing for HalfCloseTimeout.
func (t *tunnel) halfClose() {
	t.touch()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.halfClosed || t.watch == nil || t.stopped {
		return
	}
	t.halfClosed = true
	t.watch.Reset(t.s.p.cfg.HalfCloseTimeout)
}

// ended reports how a direction of the tunnel ended: at EOF (nil) the
// other side was told and the half-close grace starts; on an error other
// than the tunnel being closed, both sides close.
func (t *tunnel) ended(err error) {
	switch {
	case err == nil:
		t.halfClose()
	case errors.Is(err, net.ErrClosed):
		// The other direction, the watchdog or the session ended the tunnel.
	default:
		t.rec.fail(unwrapOpError(err).Error())
		t.closeBoth()
	}
}

// activeConn notes the tunnel's activity on every byte read or written
// (intercepted tunnels, whose bytes go through Go's TLS and HTTP).
type activeConn struct {
	net.Conn
	t *tunnel
}

func (c *activeConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.t.touch()
	}
	return n, err
}

func (c *activeConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if n > 0 {
		c.t.touch()
	}
	return n, err
}

// rawConn unwraps the session's wrappers so copies can splice.
func rawConn(c net.Conn) net.Conn {
	switch v := c.(type) {
	case *clientConn:
		return v.Conn
	case *countConn:
		return v.Conn
	}
	return c
}

// checkSNI applies the tunnel's SNI rules; "" when the SNI is fine.
func (t *tunnel) checkSNI(sni string) string {
	if sni == "" {
		return ""
	}
	name, _, ok := normalizeHost(sni)
	if !ok {
		return fmt.Sprintf("SNI %q is not a valid hostname", sni)
	}
	if _, err := netip.ParseAddr(t.host); err == nil {
		// CONNECT to an IP literal: the name the client asks for must be
		// allowed too.
		if !t.pol.Allow.Allows(name, t.port) {
			return fmt.Sprintf("SNI %s is not in this session's egress list", name)
		}
		return ""
	}
	if name != t.host {
		return fmt.Sprintf("SNI %s does not match CONNECT host", name)
	}
	return ""
}

// splice runs a pass-through tunnel: upstream -> client starts at once
// (server-speaks-first protocols), client -> upstream after the first
// client bytes were checked for a TLS ClientHello and its SNI. Bytes move
// by relay (splice(2) through pipes of the tunnel's own, closed when it
// ends); the idle watchdog ends a tunnel nobody uses.
func (s *Session) splice(t *tunnel) {
	defer s.opened(t)()
	client, up := rawConn(t.client), rawConn(t.up)
	stop := t.watchIdle()
	defer stop()
	down := make(chan struct{})
	if !s.goTracked(func() {
		defer close(down)
		t.ended(relay(client, up, func(n int64) {
			s.addIn(n)
			t.rec.in.Add(n)
			t.touch()
		}))
	}) {
		t.closeBoth()
		return
	}
	defer func() {
		<-down
		t.closeBoth()
	}()
	hello, err := peekHello(client, t.buffered, s.p.cfg.HeaderTimeout)
	if err != nil {
		if errors.Is(err, net.ErrClosed) {
			return // the watchdog or the session ended the tunnel
		}
		t.rec.deny(err.Error())
		t.closeBoth()
		return
	}
	if reason := t.checkSNI(hello.sni); reason != "" {
		t.rec.deny(reason)
		t.closeBoth()
		return
	}
	if t.transparent && !hello.tls && len(hello.replay) > 0 {
		replay, isHTTP, err := s.readMethod(client, hello.replay)
		if err != nil {
			t.rec.fail(err.Error())
			t.closeBoth()
			return
		}
		hello.replay = replay
		if isHTTP {
			// Plain HTTP: served request by request, each checked
			// (Host, rules, tripwire) and dialled by the proxy's
			// transport, as through the proxy. The dial made for the
			// connection is let go; the HTTP server's timeouts replace
			// the tunnel's watchdog.
			stop()
			t.up.Close()
			s.servePlainConn(t.client, replay, t.host, t.port, t.approved)
			return
		}
	}
	if len(hello.replay) > 0 {
		n, err := up.Write(hello.replay)
		s.addOut(int64(n))
		t.rec.out.Add(int64(n))
		t.touch()
		if err != nil {
			t.rec.fail(err.Error())
			t.closeBoth()
			return
		}
	}
	if hello.eof {
		closeWrite(up)
		t.halfClose()
		return
	}
	t.ended(relay(up, client, func(n int64) {
		s.addOut(n)
		t.rec.out.Add(n)
		t.touch()
	}))
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
}

// hello is what peekHello saw of a tunnel's first client bytes.
type hello struct {
	tls    bool
	sni    string
	replay []byte // every byte read, to be sent on first
	eof    bool   // the client half-closed before sending anything more
}

var errPeeked = errors.New("peeked")

// peekHello reads the client's first bytes (buffered ones first). The
// first byte may take as long as the client likes (an idle tunnel; the
// server's bytes flow meanwhile); from it on, a TLS ClientHello must be
// complete within timeout, so a slow client cannot slip past the SNI check.
// The ClientHello is parsed by crypto/tls on a read-only recording
// connection. Anything that is not TLS passes through; starting like TLS
// but not parsing is an error.
//
// The replay is every byte read, followed by every buffered byte not read:
// a client may send its first bytes in the CONNECT's own segment, and
// none of them may be lost.
func peekHello(c net.Conn, buffered []byte, timeout time.Duration) (hello, error) {
	pending := bytes.NewReader(buffered)
	rec := &recorder{r: io.MultiReader(pending, c)}
	replay := func() []byte {
		out := rec.buf.Bytes()
		if pending.Len() > 0 {
			rest := make([]byte, pending.Len())
			n, _ := pending.Read(rest)
			out = append(out, rest[:n]...)
		}
		return out
	}
	var first [1]byte
	if _, err := io.ReadFull(rec, first[:]); err != nil {
		if errors.Is(err, io.EOF) {
			return hello{eof: true}, nil
		}
		return hello{}, fmt.Errorf("reading the client's first bytes: %w", unwrapOpError(err))
	}
	if first[0] != 0x16 { // not a TLS handshake record
		return hello{replay: replay()}, nil
	}
	c.SetReadDeadline(time.Now().Add(timeout))
	defer c.SetReadDeadline(time.Time{})
	var sni string
	var got bool
	tc := tls.Server(&readOnlyConn{Conn: c, r: io.MultiReader(bytes.NewReader(first[:]), rec)}, &tls.Config{
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			sni, got = h.ServerName, true
			return nil, errPeeked
		},
	})
	err := tc.Handshake()
	if !got {
		return hello{}, fmt.Errorf("malformed or incomplete TLS ClientHello: %v", unwrapOpError(err))
	}
	return hello{tls: true, sni: sni, replay: replay()}, nil
}

// recorder keeps a copy of everything read through it.
type recorder struct {
	r   io.Reader
	buf bytes.Buffer
}

func (r *recorder) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	r.buf.Write(p[:n])
	return n, err
}

// readOnlyConn reads from r; writes (TLS alerts) and Close go nowhere.
type readOnlyConn struct {
	net.Conn
	r io.Reader
}

func (c *readOnlyConn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c *readOnlyConn) Write(p []byte) (int, error) { return len(p), nil }
func (c *readOnlyConn) Close() error                { return nil }

// replayConn reads r (replayed bytes, then the connection) and otherwise
// is its connection.
type replayConn struct {
	net.Conn
	r io.Reader
}

func (c *replayConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// intercept terminates the client's TLS with a leaf minted by the session
// CA and serves HTTP/1.1 on it, forwarding each request over verified TLS
// to the checked upstream with the bound secrets set.
func (s *Session) intercept(t *tunnel) {
	defer s.opened(t)()
	defer t.closeBoth()
	stop := t.watchIdle()
	defer stop()
	client := &activeConn{Conn: t.client, t: t}
	hello, err := peekHello(client, t.buffered, s.p.cfg.HeaderTimeout)
	if err != nil {
		t.rec.deny(err.Error())
		return
	}
	if !hello.tls {
		t.rec.deny("not TLS on an intercepted connection (bound secrets or rules per request)")
		return
	}
	if reason := t.checkSNI(hello.sni); reason != "" {
		t.rec.deny(reason)
		return
	}
	leaf, err := s.ca.leaf(t.host)
	if err != nil {
		t.rec.deny(err.Error())
		return
	}
	tc := tls.Server(&replayConn{Conn: client, r: io.MultiReader(bytes.NewReader(hello.replay), client)}, &tls.Config{
		Certificates: []tls.Certificate{*leaf},
		NextProtos:   []string{"http/1.1"},
		MinVersion:   tls.VersionTLS12,
	})
	client.SetDeadline(time.Now().Add(s.p.cfg.HeaderTimeout))
	if err := tc.Handshake(); err != nil {
		t.rec.fail("TLS handshake with the sandbox client: " + err.Error())
		return
	}
	client.SetDeadline(time.Time{})

	var (
		mu     sync.Mutex
		preUp  = t.up // the CONNECT's checked dial serves the first request, if soon
		dialed = t.rec.start
		target = hostPort(t.host, t.port)
	)
	tr := &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			mu.Lock()
			c := preUp
			preUp = nil
			mu.Unlock()
			if c != nil {
				if time.Since(dialed) < s.p.cfg.HeaderTimeout {
					return c, nil
				}
				c.Close() // the upstream may have given up on it: dial afresh
			}
			c, _, err := s.dialCounted(ctx, t.host, t.port)
			return c, err
		},
		TLSClientConfig:     &tls.Config{RootCAs: s.p.cfg.UpstreamRoots, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout: s.p.cfg.DialTimeout,
		MaxIdleConnsPerHost: 1, // one client connection asks one request at a time
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	defer func() {
		tr.CloseIdleConnections()
		mu.Lock()
		if preUp != nil {
			preUp.Close()
		}
		preUp = nil
		mu.Unlock()
	}()
	ic := &interceptor{s: s, t: t, tr: tr, target: target}
	ln := newOneConnListener(tc)
	srv := &http.Server{
		Handler:           ic,
		ReadHeaderTimeout: s.p.cfg.HeaderTimeout,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    s.p.cfg.MaxHeaderBytes,
		ErrorLog:          s.srv.ErrorLog,
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateClosed || st == http.StateHijacked {
				ln.Close()
			}
		},
	}
	srv.Serve(ln) // until the client's connection ends
}

// interceptor serves the requests of one intercepted tunnel.
type interceptor struct {
	s      *Session
	t      *tunnel
	tr     *http.Transport
	target string
}

func (ic *interceptor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s, t := ic.s, ic.t
	rec := newRecord("https")
	rec.setTarget(t.host, t.port)
	rec.setIP(t.ip)
	defer func() {
		t.rec.in.Add(rec.in.Load())
		t.rec.out.Add(rec.out.Load())
		s.logRecord(rec)
	}()
	pol := s.pol.Load()
	if !pol.Allow.Allows(t.host, t.port) {
		rec.deny("not in this session's egress list")
		writeLine(w, http.StatusForbidden, ic.target+" denied: not in this session's egress list")
		return
	}
	if !hostMatches(r.Host, t.host, t.port) {
		rec.deny("Host header does not match CONNECT host")
		writeLine(w, http.StatusForbidden, fmt.Sprintf("%s denied: Host header %q does not match CONNECT host", ic.target, r.Host))
		return
	}
	if ok, rule := pol.Allow.AllowsRequest(t.host, t.port, r.Method, r.URL.Path); !ok {
		rec.deny("refused by the rule " + rule)
		writeLine(w, http.StatusForbidden, fmt.Sprintf("%s %s%s denied by the rule %s", r.Method, ic.target, r.URL.EscapedPath(), rule))
		return
	}
	if !s.checkTripwire(w, r, pol, rec, t.host, t.port) {
		return
	}
	set := make(http.Header)
	for _, sec := range pol.bound(t.host, t.port) {
		name := http.CanonicalHeaderKey(sec.Header)
		if name == "" {
			rec.deny(fmt.Sprintf("secret %s has no header", sec.Name))
			writeLine(w, http.StatusBadGateway, fmt.Sprintf("secret %s has no header", sec.Name))
			return
		}
		v, ok := "", false
		if sec.Value != nil {
			v, ok = sec.Value()
		}
		if !ok {
			rec.deny(fmt.Sprintf("secret %s is no longer defined", sec.Name))
			writeLine(w, http.StatusBadGateway, fmt.Sprintf("secret %s is no longer defined", sec.Name))
			return
		}
		format := sec.Format
		if format == "" {
			format = "{value}"
		}
		set[name] = []string{replaceValue(format, v)}
	}
	rec.allow()
	phs := pol.placeholders()
	host := hostHeader(t.host, t.port, 443)
	rp := s.reverseProxy(rec, ic.target, func(out *http.Request) {
		out.URL.Scheme = "https"
		out.URL.Host = ic.target
		out.Host = host
		stripPlaceholders(out.Header, phs)
		for k, v := range set {
			out.Header[k] = v
		}
	}, ic.tr)
	rp.ServeHTTP(w, withTrace(r, rec))
}

func replaceValue(format, v string) string {
	return string(bytes.ReplaceAll([]byte(format), []byte("{value}"), []byte(v)))
}

// hostMatches reports whether a request's Host header names host (and
// port, when it has one).
func hostMatches(hostHdr, host string, port uint16) bool {
	h, p := hostHdr, ""
	if hh, pp, err := net.SplitHostPort(hostHdr); err == nil {
		h, p = hh, pp
	}
	n, _, ok := normalizeHost(h)
	if !ok || n != host {
		return false
	}
	return p == "" || p == fmt.Sprint(port)
}

// oneConnListener hands out one connection, then blocks until closed.
type oneConnListener struct {
	mu   sync.Mutex
	c    net.Conn
	addr net.Addr
	done chan struct{}
	once sync.Once
}

func newOneConnListener(c net.Conn) *oneConnListener {
	return &oneConnListener{c: c, addr: c.LocalAddr(), done: make(chan struct{})}
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	c := l.c
	l.c = nil
	l.mu.Unlock()
	if c != nil {
		return c, nil
	}
	<-l.done
	return nil, net.ErrClosed
}

func (l *oneConnListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *oneConnListener) Addr() net.Addr { return l.addr }
