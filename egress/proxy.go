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
	Metrics        Metrics       // nil: bytes are counted per session only (metrics.go)

	// Connections a sandbox opens to the proxy, counted from accept to
	// close, are bounded per session, per tenant and in all; past a bound
	// a connection gets a one-line 503 naming it and is closed.
	MaxConns          int // per session; default DefaultMaxConns
	MaxConnsPerTenant int // per tenant; default DefaultMaxConnsPerTenant
	// MaxConnsTotal bounds them across the gateway; default derived from
	// the descriptor limit (MaxConnsFor). Each holds up to FDsPerConn
	// descriptors.
	MaxConnsTotal int
	// IdleTimeout closes a tunnel, or a plain http:// exchange, that
	// moved no byte either way for this long; default DefaultIdleTimeout.
	IdleTimeout time.Duration
	// HalfCloseTimeout closes a tunnel once one side has closed and the
	// other moved no byte for this long; default DefaultHalfCloseTimeout.
	HalfCloseTimeout time.Duration
	// RefusalsPerSecond paces the connections a tenant's sessions refuse
	// past a bound (pacer): at most this many a second, after a burst of
	// as many; default DefaultRefusalsPerTenant.
	RefusalsPerSecond int

	// AskTimeout is how long a connection parked for approval waits for
	// a decision (ask.go); default DefaultAskTimeout.
	AskTimeout time.Duration
	// MaxPending bounds the connections parked for approval per session,
	// MaxPendingPerTenant per tenant, MaxPendingTotal on the gateway;
	// defaults DefaultMaxPending, DefaultMaxPendingPerTenant and
	// DefaultMaxPendingTotal (at most MaxConnsPerTenant, MaxConnsTotal).
	MaxPending, MaxPendingPerTenant, MaxPendingTotal int
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

	total     atomic.Int64 // connections counted against MaxConnsTotal
	rejecting atomic.Int64 // 503 answers being written (bounded too)
	tmu       sync.Mutex
	tenants   map[string]int // connections per tenant, against MaxConnsPerTenant
	pace      pacer          // each tenant's refusals
	namePace  pacer          // each tenant's refused names the log records
	nameCount nameCounts     // the resolvers' names, per tenant and in all
	pending   atomic.Int64   // connections parked for approval, against MaxPendingTotal (changed under tmu)
	// pendingTenants is the parked connections per tenant, against
	// MaxPendingPerTenant (under tmu).
	pendingTenants map[string]int
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
	if err := cfg.setLimits(nofileLimit()); err != nil {
		return nil, err
	}
	p := &Proxy{
		cfg:            cfg,
		log:            cfg.Log,
		resolver:       cfg.Resolver,
		hosts:          make(map[string][]netip.Addr),
		own:            make(map[netip.Addr]bool),
		tenants:        make(map[string]int),
		pendingTenants: make(map[string]int),
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	p.pace.rate = float64(p.cfg.RefusalsPerSecond)
	p.namePace.rate = RefusedNamesLoggedPerSecond
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
	// Ask parks a connection to a host:port outside Allow for approval
	// instead of refusing it (ask.go), when AskWithin (the operator's
	// ceiling) allows it and Deny does not hold it.
	Ask       bool
	AskWithin Bounds
	// Deny holds the host:ports a decision denied for good: in ask mode
	// they are refused without asking.
	Deny List
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
	tenant string
	ca     *CA
	log    *slog.Logger
	pol    atomic.Pointer[Policy]
	in     atomic.Int64 // upstream -> sandbox
	out    atomic.Int64 // sandbox -> upstream
	srv    *http.Server
	names  *names // the transparent egress's resolver's answers
	// unlogged counts the refused names past the tenant's pace of them
	// (namePace) since the last one logged.
	unlogged atomic.Int64
	plain    *http.Transport // absolute-URI http:// requests
	asks     asks            // connections parked for approval (ask.go)
	active   atomic.Int64    // accepted connections counted against MaxConns

	onRecord      atomic.Pointer[func(Record)]
	rejected      atomic.Int64 // connections refused for MaxConns, for the log
	lastRejectLog atomic.Int64 // unix nanoseconds: at most one warning a second

	mu     sync.Mutex
	closed bool
	done   chan struct{}       // closed with closed
	conns  map[io.Closer]bool  // every open client and upstream connection
	open   map[destination]int // the open tunnels by destination (OpenTo)
	wg     sync.WaitGroup      // every goroutine the session started itself
}

// NewSession makes the proxy of tenant's session id. ca may be nil when
// pol has no secrets (intercepting then fails closed).
func (p *Proxy) NewSession(tenant, id string, pol Policy, ca *CA) *Session {
	s := &Session{
		p:      p,
		id:     id,
		tenant: tenant,
		ca:     ca,
		log:    p.log.With("session", id),
		conns:  make(map[io.Closer]bool),
		done:   make(chan struct{}),
		names:  newNames(),
	}
	s.SetPolicy(pol)
	s.plain = &http.Transport{
		Proxy:                 nil,
		DialContext:           s.transportDial,
		MaxIdleConns:          maxIdleUpstream, // descriptors: see FDsPerConn
		MaxIdleConnsPerHost:   maxIdleUpstream,
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
		// A plain http:// exchange's stall watchdog reaches its
		// connection through this (plainStall).
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, clientConnKey{}, c)
		},
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
	close(s.done)
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
	s.p.nameCount.release(s.tenant, s.names.close())
	return nil
}

// track registers c to be closed by Close; false (and c closed) when the
// session is closed already. c is closed outside s.mu: a tracked
// connection's Close untracks itself.
func (s *Session) track(c io.Closer) bool {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		c.Close()
		return false
	}
	s.conns[c] = true
	s.mu.Unlock()
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

// limitListener bounds a session's concurrent connections (per session,
// per tenant, in all): past a bound a new connection gets a one-line 503
// and is closed, without blocking Accept.
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
		if scope := s.acquire(); scope != "" {
			s.reject(c, scope)
			// Past the tenant's pace, accept nothing until the next
			// refusal is due: what comes meanwhile waits in the backlog.
			if d := s.p.pace.reserve(s.tenant, time.Now()); d > 0 {
				t := time.NewTimer(d)
				select {
				case <-t.C:
				case <-s.done:
					t.Stop()
				}
			}
			continue
		}
		cc := &clientConn{Conn: c, s: s}
		if !s.track(cc) {
			// track closed cc, and its Close gave the counts back.
			continue
		}
		return cc, nil
	}
}

// The scopes of the connection bounds, as a refusal names them.
const (
	scopeSession = "session"
	scopeTenant  = "tenant"
	scopeTotal   = "gateway"
)

// acquire counts a new connection against the three bounds; it returns
// the scope of the bound it would cross ("" when none, and counted).
func (s *Session) acquire() string {
	p := s.p
	if s.active.Add(1) > int64(p.cfg.MaxConns) {
		s.active.Add(-1)
		return scopeSession
	}
	p.tmu.Lock()
	if p.tenants[s.tenant] >= p.cfg.MaxConnsPerTenant {
		p.tmu.Unlock()
		s.active.Add(-1)
		return scopeTenant
	}
	p.tenants[s.tenant]++
	p.tmu.Unlock()
	if p.total.Add(1) > int64(p.cfg.MaxConnsTotal) {
		p.total.Add(-1)
		s.releaseTenant()
		s.active.Add(-1)
		return scopeTotal
	}
	return ""
}

// release gives back what acquire counted.
func (s *Session) release() {
	s.p.total.Add(-1)
	s.releaseTenant()
	s.active.Add(-1)
}

func (s *Session) releaseTenant() {
	p := s.p
	p.tmu.Lock()
	if p.tenants[s.tenant]--; p.tenants[s.tenant] <= 0 {
		delete(p.tenants, s.tenant)
	}
	p.tmu.Unlock()
}

// limitMessage is a refusal's one line: which bound, and the flag that
// sets it.
func (p *Proxy) limitMessage(scope string) string {
	switch scope {
	case scopeTenant:
		return fmt.Sprintf("too many connections (at most %d per tenant, in all of its sessions; serve --egress-max-conns-per-tenant)", p.cfg.MaxConnsPerTenant)
	case scopeTotal:
		return fmt.Sprintf("too many connections (at most %d on this gateway; serve --egress-max-conns); try again later", p.cfg.MaxConnsTotal)
	}
	return fmt.Sprintf("too many connections (at most %d per session; serve --egress-max-conns-per-session)", p.cfg.MaxConns)
}

// maxRejecting bounds the 503 answers in flight: past it a refused
// connection is closed at once, so a flood of refused connections holds
// no descriptors either.
const maxRejecting = 64

// reject answers an over-limit connection with a one-line 503.
func (s *Session) reject(c net.Conn, scope string) {
	s.rejected.Add(1)
	msg := s.p.limitMessage(scope)
	if now := time.Now().UnixNano(); now-s.lastRejectLog.Load() > int64(time.Second) {
		s.lastRejectLog.Store(now)
		s.log.Warn("egress: too many connections", "scope", scope, "tenant", s.tenant, "limit", msg, "refusedSoFar", s.rejected.Load())
	}
	body := "sandgate egress: " + msg + "\n"
	answer := fmt.Sprintf("HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
	if s.p.rejecting.Add(1) > maxRejecting {
		// A new connection's send buffer is empty: the answer goes out
		// at once (the deadline is a backstop; a short one could pass
		// before the write under load, and the client would see no
		// answer). What the client sent by now is read so that closing
		// does not reset the connection under the answer.
		s.p.rejecting.Add(-1)
		c.SetWriteDeadline(time.Now().Add(time.Second))
		io.WriteString(c, answer)
		closeWrite(c)
		discardBuffered(c)
		c.Close()
		return
	}
	if !s.track(c) {
		s.p.rejecting.Add(-1)
		return
	}
	started := s.goTracked(func() {
		defer s.p.rejecting.Add(-1)
		defer s.untrack(c)
		defer c.Close()
		c.SetDeadline(time.Now().Add(time.Second))
		io.WriteString(c, answer)
		// Read what the client sent so closing does not reset the
		// connection before it reads the answer.
		closeWrite(c)
		io.Copy(io.Discard, io.LimitReader(c, 64<<10))
	})
	if !started {
		s.p.rejecting.Add(-1)
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
		c.s.release()
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
