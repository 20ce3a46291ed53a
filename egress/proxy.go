package egress

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Config configures a Proxy. Zero values get the defaults noted.
type Config struct {
	Log *slog.Logger // nil: discard
	// AllowCIDRs are ranges dialed despite the address rule
	// (--egress-allow-cidr).
	AllowCIDRs []netip.Prefix
	// Hosts are static name -> addresses entries consulted before DNS (like
	// curl --resolve). Names are case-insensitive.
	Hosts    map[string][]netip.Addr
	Resolver *net.Resolver // nil: net.DefaultResolver
	// UpstreamRoots verify upstream certificates when intercepting; nil:
	// the system roots.
	UpstreamRoots  *x509.CertPool
	DialTimeout    time.Duration // default 10s; also bounds name resolution
	HeaderTimeout  time.Duration // time to read a request's headers or a tunnel's TLS ClientHello; default 10s
	MaxHeaderBytes int           // default 32 KiB; beyond: 431 and close
	MaxConns       int           // concurrent connections per session; default 256; beyond: 503 and close
	Metrics        Metrics       // nil: bytes are counted per session only (metrics.go)
}

// Proxy holds what every session shares: configuration and the gateway's
// own addresses.
type Proxy struct {
	cfg        Config
	log        *slog.Logger
	resolver   *net.Resolver
	allowCIDRs []netip.Prefix
	hosts      map[string][]netip.Addr
	own        map[netip.Addr]bool
}

// New makes a Proxy. It records the host's interface addresses as the
// gateway's own: those are never dialed unless inside AllowCIDRs.
func New(cfg Config) (*Proxy, error) {
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	if cfg.HeaderTimeout <= 0 {
		cfg.HeaderTimeout = 10 * time.Second
	}
	if cfg.MaxHeaderBytes <= 0 {
		cfg.MaxHeaderBytes = 32 << 10
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = 256
	}
	p := &Proxy{
		cfg:      cfg,
		log:      cfg.Log,
		resolver: cfg.Resolver,
		hosts:    make(map[string][]netip.Addr),
		own:      make(map[netip.Addr]bool),
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	if p.resolver == nil {
		p.resolver = net.DefaultResolver
	}
	for _, pf := range cfg.AllowCIDRs {
		if !pf.IsValid() {
			return nil, fmt.Errorf("egress: invalid allowed CIDR %v", pf)
		}
		p.allowCIDRs = append(p.allowCIDRs, netip.PrefixFrom(pf.Addr().Unmap(), unmappedBits(pf)).Masked())
	}
	for name, addrs := range cfg.Hosts {
		n, err := normalizeName(name)
		if err != nil {
			return nil, fmt.Errorf("egress: hosts entry %q: %w", name, err)
		}
		for _, a := range addrs {
			if !a.IsValid() {
				return nil, fmt.Errorf("egress: hosts entry %q: invalid address", name)
			}
			p.hosts[n] = append(p.hosts[n], a.Unmap())
		}
	}
	ifAddrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("egress: list the gateway's own addresses: %w", err)
	}
	for _, ia := range ifAddrs {
		var ip net.IP
		switch v := ia.(type) {
		case *net.IPNet:
			ip = v.IP
		case *net.IPAddr:
			ip = v.IP
		}
		if a, ok := netip.AddrFromSlice(ip); ok {
			p.own[a.Unmap()] = true
		}
	}
	return p, nil
}

func unmappedBits(pf netip.Prefix) int {
	if pf.Addr().Is4In6() {
		return max(pf.Bits()-96, 0)
	}
	return pf.Bits()
}

// Placeholder is the deterministic placeholder the sandbox sees in $name
// instead of a secret's value. It is not secret.
func Placeholder(name string) string { return "sandgate-placeholder-" + name }

// Secret is a credential bound to destinations: the proxy sets Header to
// Format with "{value}" replaced by the value on HTTPS requests to Hosts
// (intercepted with the session's CA), and only there.
type Secret struct {
	Name        string
	Hosts       List
	Header      string // e.g. "Authorization"
	Format      string // contains "{value}"; "" means "{value}"
	Placeholder string // what the sandbox sees in $Name instead of the value
	// Value is resolved at request time; false: the secret is no longer
	// defined.
	Value func() (string, bool)
}

// Policy is what a session may reach.
type Policy struct {
	Allow   List
	Secrets []Secret
}

// bound returns the secrets whose Hosts allow host:port.
func (pol *Policy) bound(host string, port uint16) []Secret {
	var out []Secret
	for _, s := range pol.Secrets {
		if s.Hosts.Allows(host, port) {
			out = append(out, s)
		}
	}
	return out
}

// placeholders returns every non-empty placeholder of pol's secrets.
func (pol *Policy) placeholders() []string {
	var out []string
	for _, s := range pol.Secrets {
		if s.Placeholder != "" {
			out = append(out, s.Placeholder)
		}
		if s.Name != "" {
			out = append(out, Placeholder(s.Name))
		}
	}
	return out
}

// stripPlaceholders deletes every header with a value containing one of
// phs: a placeholder never leaves the gateway.
func stripPlaceholders(h http.Header, phs []string) {
	if len(phs) == 0 {
		return
	}
	for k, vs := range h {
		for _, v := range vs {
			if containsAny(v, phs) {
				delete(h, k)
				break
			}
		}
	}
}

func containsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// Session is one sandbox session's proxy state.
type Session struct {
	p      *Proxy
	id     string
	ca     *CA
	log    *slog.Logger
	pol    atomic.Pointer[Policy]
	in     atomic.Int64 // upstream -> sandbox
	out    atomic.Int64 // sandbox -> upstream
	srv    *http.Server
	plain  *http.Transport // absolute-URI http:// requests
	active atomic.Int64    // accepted connections counted against MaxConns

	onRecord      atomic.Pointer[func(Record)]
	rejected      atomic.Int64 // connections refused for MaxConns, for the log
	lastRejectLog atomic.Int64 // unix nanoseconds: at most one warning a second

	mu     sync.Mutex
	closed bool
	conns  map[io.Closer]bool // every open client and upstream connection
	wg     sync.WaitGroup     // every goroutine the session started itself
}

// NewSession makes a session's proxy. ca may be nil when pol has no
// secrets (intercepting then fails closed).
func (p *Proxy) NewSession(id string, pol Policy, ca *CA) *Session {
	s := &Session{
		p:     p,
		id:    id,
		ca:    ca,
		log:   p.log.With("session", id),
		conns: make(map[io.Closer]bool),
	}
	s.SetPolicy(pol)
	s.plain = &http.Transport{
		Proxy:                 nil,
		DialContext:           s.transportDial,
		MaxIdleConnsPerHost:   8,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 0, // long polls are fine
		DisableCompression:    true,
	}
	s.srv = &http.Server{
		Handler:           http.HandlerFunc(s.serveHTTP),
		ReadHeaderTimeout: p.cfg.HeaderTimeout,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    p.cfg.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	return s
}

// SetPolicy replaces the policy; new connections and new requests use it at
// once.
func (s *Session) SetPolicy(pol Policy) {
	pol.Secrets = slices.Clone(pol.Secrets)
	s.pol.Store(&pol)
}

// Policy returns the current policy.
func (s *Session) Policy() Policy { return *s.pol.Load() }

// Bytes returns the totals so far: in is upstream -> sandbox, out is
// sandbox -> upstream. They are updated at least every MiB.
func (s *Session) Bytes() (in, out int64) { return s.in.Load(), s.out.Load() }

// AddBytes adds to the totals, e.g. to restore them after a restart.
func (s *Session) AddBytes(in, out int64) {
	s.in.Add(in)
	s.out.Add(out)
}

// Serve serves ln until ln is closed or the session is closed; it returns
// nil then. It may be called for several listeners.
func (s *Session) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ln.Close()
		return nil
	}
	s.mu.Unlock()
	err := s.srv.Serve(&limitListener{Listener: ln, s: s})
	if errors.Is(err, http.ErrServerClosed) || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// Close closes the listeners being served and every open connection, and
// waits for the session's goroutines. It is idempotent.
func (s *Session) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.wg.Wait()
		return nil
	}
	s.closed = true
	conns := make([]io.Closer, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	// The listeners (one closed by its owner already is fine) and the
	// server's own connections; then the hijacked ones and upstreams.
	s.srv.Close()
	for _, c := range conns {
		c.Close()
	}
	s.plain.CloseIdleConnections()
	s.wg.Wait()
	s.plain.CloseIdleConnections()
	return nil
}

// track registers c to be closed by Close; false (and c closed) when the
// session is closed already.
func (s *Session) track(c io.Closer) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		c.Close()
		return false
	}
	s.conns[c] = true
	return true
}

func (s *Session) untrack(c io.Closer) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// goTracked runs f in a goroutine Close waits for; false when closed.
func (s *Session) goTracked(f func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer s.recoverPanic()
		f()
	}()
	return true
}

// enter counts a handler Close waits for; false when closed.
func (s *Session) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.wg.Add(1)
	return true
}

func (s *Session) recoverPanic() {
	if r := recover(); r != nil {
		if r == http.ErrAbortHandler {
			return
		}
		s.log.Error("egress: panic", "panic", fmt.Sprint(r))
	}
}

// limitListener bounds a session's concurrent connections: past MaxConns a
// new connection gets a one-line 503 and is closed, without blocking Accept.
type limitListener struct {
	net.Listener
	s *Session
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		s := l.s
		if s.active.Add(1) > int64(s.p.cfg.MaxConns) {
			s.active.Add(-1)
			s.reject(c)
			continue
		}
		cc := &clientConn{Conn: c, s: s}
		if !s.track(cc) {
			s.active.Add(-1)
			continue
		}
		return cc, nil
	}
}

// reject answers an over-limit connection with a one-line 503.
func (s *Session) reject(c net.Conn) {
	s.rejected.Add(1)
	if now := time.Now().UnixNano(); now-s.lastRejectLog.Load() > int64(time.Second) {
		s.lastRejectLog.Store(now)
		s.log.Warn("egress: too many connections", "max", s.p.cfg.MaxConns, "refusedSoFar", s.rejected.Load())
	}
	if !s.track(c) {
		return
	}
	started := s.goTracked(func() {
		defer s.untrack(c)
		defer c.Close()
		body := fmt.Sprintf("sandgate egress: too many connections (at most %d per session)\n", s.p.cfg.MaxConns)
		c.SetDeadline(time.Now().Add(time.Second))
		fmt.Fprintf(c, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
		// Read what the client sent so closing does not reset the
		// connection before it reads the answer.
		if cw, ok := c.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		}
		io.Copy(io.Discard, io.LimitReader(c, 64<<10))
	})
	if !started {
		s.untrack(c)
		c.Close()
	}
}

// clientConn is an accepted connection counted against MaxConns until
// closed.
type clientConn struct {
	net.Conn
	s    *Session
	once sync.Once
}

func (c *clientConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.s.active.Add(-1)
		c.s.untrack(c)
	})
	return err
}

// countConn counts an upstream connection's bytes into the session's
// totals and is closed by Session.Close.
type countConn struct {
	net.Conn
	s    *Session
	once sync.Once
}

func (c *countConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.s.addIn(int64(n))
	return n, err
}

func (c *countConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.s.addOut(int64(n))
	return n, err
}

func (c *countConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.s.untrack(c) })
	return err
}

// dialCounted is a checked dial whose connection counts into the session
// and is closed by Close.
func (s *Session) dialCounted(ctx context.Context, host string, port uint16) (net.Conn, netip.Addr, error) {
	c, ip, err := s.p.dialChecked(ctx, host, port)
	if err != nil {
		return nil, ip, err
	}
	cc := &countConn{Conn: c, s: s}
	if !s.track(cc) {
		return nil, ip, denied(http.StatusBadGateway, "session closed")
	}
	return cc, ip, nil
}

// transportDial is http.Transport's DialContext for plain requests: the
// handler checked the policy; this checks the address.
func (s *Session) transportDial(ctx context.Context, network, addr string) (net.Conn, error) {
	host, port, err := splitHostPort(addr)
	if err != nil {
		return nil, denied(http.StatusBadRequest, "bad address %q", addr)
	}
	c, _, err := s.dialCounted(ctx, host, port)
	return c, err
}
