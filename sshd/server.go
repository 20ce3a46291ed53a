// Package sshd is the embedded SSH server. It serves connections that the
// tunnel has already bound to a session: identity comes from that binding,
// and SSH authentication only ever narrows access.
package sshd

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	gliderssh "github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/internal/droplog"
)

// Auth method names accepted by Config.AuthMethods.
const (
	AuthNone      = "none"
	AuthPassword  = "password"
	AuthPublicKey = "publickey"
)

// Config configures the SSH server. Zero values get defaults.
type Config struct {
	HostSigners []gossh.Signer
	// AuthMethods are the SSH methods accepted on an authorised tunnel
	// (default none, password, publickey).
	AuthMethods []string
	// EnvAllow are extra environment names clients may set, beyond TERM,
	// LANG and LC_*; a trailing '*' matches a prefix.
	EnvAllow []string
	// HandshakeTimeout bounds the SSH handshake and authentication (default 30s).
	HandshakeTimeout time.Duration
	// MaxAuthTries caps authentication attempts per connection (default 6).
	MaxAuthTries int
	// OutputGrace is how long output is still forwarded after the command
	// exits while something else holds its stdout open (default 500ms).
	// What the command wrote before it exited is always forwarded first,
	// however slowly the client reads (procio.Drain).
	OutputGrace time.Duration
	// MaxStartups bounds the tunnels in SSH authentication at once
	// (default DefaultStartups).
	MaxStartups Startups
	// MaxStartupsPerPrincipal is each principal's (tenant's) budget among
	// the tunnels in authentication, checked at the CONNECT (AdmitTunnel:
	// 429 past it) ahead of MaxStartups (default
	// DefaultStartupsPerPrincipal; negative: none).
	MaxStartupsPerPrincipal int
	// WarnEvery is the window of the startup bounds' warnings: the first
	// drop of a burst is logged at once, the true count of the rest at
	// the end of each window (default 10s).
	WarnEvery time.Duration
	// LocalForward allows direct-tcpip channels (ssh -L) to the sandbox's
	// own loopback, through sandbox.LoopbackDialer; off, they are refused.
	// Remote, agent and X11 forwarding are always refused.
	LocalForward bool
	Log          *slog.Logger
	// Metrics counts failed authentications (nil: not counted; metrics.go).
	Metrics Metrics
	// Audit receives authentications, shells and SFTP file operations
	// (nil: none kept; exec commands are the gateway's history's).
	Audit audit.Auditor
}

// Server serves SSH on tunnelled connections.
type Server struct {
	cfg Config
	gs  *gliderssh.Server

	mu      sync.Mutex
	closing bool
	chans   map[*channel]struct{}
	idle    chan struct{} // closed and replaced when chans becomes empty

	bufs bufPool // large copy buffers, shared by the channels' copies

	startups startups
}

type ctxKey int

const (
	keySession ctxKey = iota
	keyConn
	keyRequest // the CONNECT's audit.Request
	keyTicket  // the tunnel's place among those in authentication (AdmitTunnel)
)

// AdmitTunnel decides, at the CONNECT and before it is answered, whether
// principal p may open one more tunnel: p's own budget among the tunnels
// in SSH authentication (MaxStartupsPerPrincipal: 429 too_many_ssh_startups
// past it), then the global bound (MaxStartups: 503 ssh_startups_full). An
// admitted tunnel holds its place from now until it authenticates or ends;
// ServeConnContext takes it over from the returned context, and release
// gives it back if the tunnel never gets there (safe to call in any case).
func (s *Server) AdmitTunnel(ctx context.Context, p gateway.Principal) (context.Context, func(), error) {
	t, why := s.startups.admit(p.Tenant)
	switch why {
	case droppedPrincipal:
		return ctx, func() {}, &gateway.Error{Kind: gateway.KindQuota, Code: "too_many_ssh_startups", RetryAfter: time.Second,
			Message: fmt.Sprintf("%d tunnels of this principal are already in SSH authentication (--ssh-max-startups-per-principal)", s.cfg.MaxStartupsPerPrincipal)}
	case droppedFull:
		return ctx, func() {}, &gateway.Error{Kind: gateway.KindUnavailable, Code: "ssh_startups_full", RetryAfter: time.Second,
			Message: "too many tunnels in SSH authentication on this gateway (--ssh-max-startups); retry"}
	}
	return context.WithValue(ctx, keyTicket, t), t.release, nil
}

// New returns a Server for cfg.
func New(cfg Config) (*Server, error) {
	if len(cfg.HostSigners) == 0 {
		return nil, fmt.Errorf("no host keys")
	}
	if len(cfg.AuthMethods) == 0 {
		cfg.AuthMethods = []string{AuthNone, AuthPassword, AuthPublicKey}
	}
	for _, m := range cfg.AuthMethods {
		if m != AuthNone && m != AuthPassword && m != AuthPublicKey {
			return nil, fmt.Errorf("unknown ssh auth method %q (want none, password or publickey)", m)
		}
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = 30 * time.Second
	}
	if cfg.MaxAuthTries <= 0 {
		cfg.MaxAuthTries = 6
	}
	if cfg.OutputGrace <= 0 {
		cfg.OutputGrace = 500 * time.Millisecond
	}
	if cfg.MaxStartups == (Startups{}) {
		cfg.MaxStartups = DefaultStartups
	}
	if cfg.MaxStartupsPerPrincipal == 0 {
		cfg.MaxStartupsPerPrincipal = DefaultStartupsPerPrincipal
	}
	s := &Server{cfg: cfg, chans: map[*channel]struct{}{}, startups: startups{limit: cfg.MaxStartups, perPrincipal: max(cfg.MaxStartupsPerPrincipal, 0)}}
	s.startups.drops = droplog.New(cfg.WarnEvery, func(n int) {
		s.cfg.Log.Warn("ssh_max_startups", "dropped", n, "in_auth", s.startups.inAuth(),
			"max_startups", s.cfg.MaxStartups.String(), "reason", "too many tunnels in SSH authentication")
	})
	s.startups.perDrops = droplog.New(cfg.WarnEvery, func(n int) {
		s.cfg.Log.Warn("ssh_max_startups_per_principal", "dropped", n, "max_startups_per_principal", s.cfg.MaxStartupsPerPrincipal,
			"reason", "a principal's tunnels in SSH authentication reached its budget: answered 429 at CONNECT")
	})
	signers := make([]gliderssh.Signer, len(cfg.HostSigners))
	for i, k := range cfg.HostSigners {
		sg, err := sha2Only(k)
		if err != nil {
			return nil, err
		}
		signers[i] = sg
	}
	gs := &gliderssh.Server{
		HostSigners:          signers,
		Version:              "sandgate",
		ChannelHandlers:      map[string]gliderssh.ChannelHandler{"session": s.handleSession, "direct-tcpip": s.handleDirectTCPIP},
		RequestHandlers:      map[string]gliderssh.RequestHandler{},
		SubsystemHandlers:    map[string]gliderssh.SubsystemHandler{},
		ConnCallback:         s.bind,
		ServerConfigCallback: s.serverConfig,
	}
	if slices.Contains(cfg.AuthMethods, AuthPassword) {
		gs.PasswordHandler = s.checkPassword
	}
	if slices.Contains(cfg.AuthMethods, AuthPublicKey) {
		gs.PublicKeyHandler = s.checkPublicKey
	}
	s.gs = gs
	return s, nil
}

// boundConn is a tunnelled connection and the session it was authorised for.
type boundConn struct {
	net.Conn
	sess   *gateway.Session
	req    audit.Request // the CONNECT request's id and caller
	authed atomic.Bool
	chans  atomic.Int32 // open session channels
	fwds   atomic.Int32 // open forwarded (direct-tcpip) channels

	startup *ticket // its place among the tunnels in authentication

	in readAhead // x/crypto/ssh's transport reads through it

	// A hold's packets (see hold), guarded by wmu; holds counts the
	// holds, so that only the last one's end lets them go.
	wmu     sync.Mutex
	holding bool
	holds   uint64
	held    []byte
	holdMax time.Duration // how long a hold lasts at most; 0: maxHold
}

// Read reads the tunnel through the read-ahead buffer (see readAhead).
func (c *boundConn) Read(p []byte) (int, error) { return c.in.Read(p) }

// leaveAuth uncounts the connection from those in authentication, once:
// when it authenticates, or ends.
func (c *boundConn) leaveAuth() { c.startup.release() }

// MaxChannelsPerConn bounds the session channels open at once on one
// connection (OpenSSH's MaxSessions is 10): each may buffer a 2 MiB window.
const MaxChannelsPerConn = 32

// MaxForwardsPerConn bounds the forwarded connections (ssh -L, -D) open at
// once on one connection, apart from the session channels as OpenSSH's
// MaxSessions is: a browser or a connection pool opens dozens. Each may
// buffer a 2 MiB window too.
const MaxForwardsPerConn = 256

// SetDeadline and friends are no-ops: gliderlabs/ssh resets the deadline on
// every read and write (to zero, without an idle timeout), which would undo
// the handshake bound; that bound is a timer instead (see ServeConn).
func (c *boundConn) SetDeadline(time.Time) error      { return nil }
func (c *boundConn) SetReadDeadline(time.Time) error  { return nil }
func (c *boundConn) SetWriteDeadline(time.Time) error { return nil }

// CloseWrite half-closes the tunnel when the transport can.
func (c *boundConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// maxHeld bounds what a hold keeps back (see hold): past it, what is held
// and the write that overflows go out at once.
const maxHeld = 64 << 10

// Write writes p to the tunnel, or keeps it back while the connection is
// held (see hold). x/crypto/ssh writes each packet with one Write, one at
// a time; wmu also orders them with a release's write.
func (c *boundConn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.holding {
		if len(c.held)+len(p) <= maxHeld {
			c.held = append(c.held, p...)
			return len(p), nil
		}
		if err := c.flushHeld(); err != nil {
			return 0, err
		}
	}
	return c.Conn.Write(p)
}

// flushHeld writes what a hold kept back. wmu is held.
func (c *boundConn) flushHeld() error {
	if len(c.held) == 0 {
		return nil
	}
	_, err := c.Conn.Write(c.held)
	c.held = c.held[:0]
	return err
}

// maxHold bounds how long a hold keeps packets back, as the kernel's
// TCP_CORK does (200 ms): a write in a hold that waits for the peer (one
// x/crypto/ssh makes wait for a key exchange's end, which needs the
// server's key exchange packets to reach the client) costs a delay, never
// a stalled connection.
const maxHold = 200 * time.Millisecond

// hold keeps the packets written to the tunnel back until the returned
// function is called, which writes them all with one write(2), so that
// they leave in one TCP segment, as OpenSSH's buffered output sends them
// (a channel's exit-status, EOF and close: sendEnd). At most maxHeld bytes
// are kept, for at most maxHold; a hold taken while another is on ends
// with the later one. It does nothing on a nil connection.
func (c *boundConn) hold() (release func()) {
	if c == nil {
		return func() {}
	}
	c.wmu.Lock()
	c.holds++
	n := c.holds
	c.holding = true
	c.wmu.Unlock()
	end := func() {
		c.wmu.Lock()
		defer c.wmu.Unlock()
		if c.holds != n || !c.holding {
			return // a later hold is on, or this one ended
		}
		c.holding = false
		_ = c.flushHeld() // a failed write fails the packets after it too
		if cap(c.held) > 4<<10 {
			c.held = nil
		}
	}
	d := c.holdMax
	if d == 0 {
		d = maxHold
	}
	timer := time.AfterFunc(d, end)
	return func() {
		timer.Stop()
		end()
	}
}

// ServeConn runs SSH on conn, which the tunnel authorised for sess. It
// returns when the connection ends.
func (s *Server) ServeConn(conn net.Conn, sess *gateway.Session) {
	s.ServeConnContext(context.Background(), conn, sess)
}

// ServeConnContext is ServeConn for a tunnel whose CONNECT request ctx
// carries (audit.RequestFrom): the connection's log lines and audit
// events name that request's id and caller.
func (s *Server) ServeConnContext(ctx context.Context, conn net.Conn, sess *gateway.Session) {
	t, _ := ctx.Value(keyTicket).(*ticket)
	if t == nil || t.s != &s.startups {
		// Not admitted at a CONNECT (AdmitTunnel): admit it now.
		p, _ := gateway.PrincipalFrom(ctx)
		if t, _ = s.startups.admit(p.Tenant); t == nil {
			conn.Close()
			return
		}
	}
	bc := &boundConn{Conn: conn, sess: sess, req: audit.RequestFrom(ctx), startup: t}
	bc.in = readAhead{src: conn, pool: &s.bufs}
	defer bc.leaveAuth()
	// x/crypto/ssh has no timeouts of its own: a connection that has not
	// authenticated when the handshake timeout fires is closed. The
	// deadline counts from the CONNECT, so that time spent before the
	// first SSH byte counts too.
	timer := time.AfterFunc(s.cfg.HandshakeTimeout-time.Since(t.start), func() {
		if !bc.authed.Load() {
			s.cfg.Log.InfoContext(ctx, "ssh_handshake_timeout", "session", sess.ID)
			bc.Conn.Close()
		}
	})
	defer timer.Stop()
	s.gs.HandleConn(bc)
}

func (s *Server) bind(ctx gliderssh.Context, conn net.Conn) net.Conn {
	bc, ok := conn.(*boundConn)
	if !ok || bc.sess == nil {
		conn.Close()
		return nil
	}
	ctx.SetValue(keySession, bc.sess)
	ctx.SetValue(keyConn, bc)
	// gliderlabs' context is a context.Context: the channels' contexts
	// derive from it, so their log lines and audit events see the request.
	withRequest(ctx, bc.req)
	return conn
}

func sessionOf(ctx context.Context) *gateway.Session {
	s, _ := ctx.Value(keySession).(*gateway.Session)
	return s
}

// authenticated reports whether an auth attempt for the connection's
// session may succeed. The handshake timer stops, and the attempt is
// logged, only in AuthLogCallback: x/crypto also asks the public key
// callback for unsigned queries, which prove nothing.
func (s *Server) authenticated(ctx gliderssh.Context, ok bool) bool {
	sess := sessionOf(ctx)
	return ok && sess != nil && sess.Live()
}

// logAuth records a finished authentication attempt and, on success, ends
// the handshake bound.
func (s *Server) logAuth(ctx gliderssh.Context, md gossh.ConnMetadata, method string, err error) {
	if err == nil {
		if bc, _ := ctx.Value(keyConn).(*boundConn); bc != nil {
			bc.authed.Store(true)
			bc.leaveAuth()
		}
	}
	id := ""
	if sess := sessionOf(ctx); sess != nil {
		id = sess.ID
	}
	s.cfg.Log.InfoContext(requestCtx(ctx), "ssh_auth", "session", id, "method", method, "user", md.User(), "ok", err == nil)
	s.countAuth(method, err)
	s.auditAuth(ctx, method, err)
}

// Ciphers offered to clients. chacha20-poly1305@openssh.com is left out on
// purpose: OpenSSH clients prefer it, and x/crypto's chacha20 has no amd64
// assembly (about 0.6 GB/s per core here, against 5.5 GB/s for AES-GCM with
// AES-NI), so it alone made bulk transfers CPU-bound in the gateway. Without
// it OpenSSH (6.2+), Paramiko (3.5+) and x/crypto clients settle on
// aes128-gcm. The aes-ctr modes are left out too, or OpenSSH would pick
// aes128-ctr + HMAC (1.4 GB/s) ahead of GCM.
var serverCiphers = []string{"aes128-gcm@openssh.com", "aes256-gcm@openssh.com"}

// Key exchanges offered: OpenSSH 9.x's default set as far as x/crypto has
// it (no sntrup761), SHA-2 only. x/crypto adds strict KEX
// (kex-strict-s-v00@openssh.com) on its own.
var serverKeyExchanges = []string{
	gossh.KeyExchangeMLKEM768X25519, gossh.KeyExchangeCurve25519, "curve25519-sha256@libssh.org",
	gossh.KeyExchangeECDHP256, gossh.KeyExchangeECDHP384, gossh.KeyExchangeECDHP521,
	gossh.KeyExchangeDHGEXSHA256, gossh.KeyExchangeDH16SHA512, gossh.KeyExchangeDH14SHA256,
}

// MACs offered (used with no cipher above, which are all AEAD, but
// explicit): SHA-2 only.
var serverMACs = []string{gossh.HMACSHA256ETM, gossh.HMACSHA512ETM, gossh.HMACSHA256, gossh.HMACSHA512}

// Client public key signature algorithms accepted: no SHA-1 ssh-rsa.
var serverPublicKeyAlgorithms = []string{
	gossh.KeyAlgoED25519, gossh.KeyAlgoSKED25519,
	gossh.KeyAlgoECDSA256, gossh.KeyAlgoECDSA384, gossh.KeyAlgoECDSA521, gossh.KeyAlgoSKECDSA256,
	gossh.KeyAlgoRSASHA512, gossh.KeyAlgoRSASHA256,
}

// sha2Only restricts an RSA host key to SHA-2 signatures (rsa-sha2-512,
// rsa-sha2-256): the server then offers no SHA-1 ssh-rsa host key
// algorithm. Other keys are returned as they are.
func sha2Only(k gossh.Signer) (gossh.Signer, error) {
	if k.PublicKey().Type() != gossh.KeyAlgoRSA {
		return k, nil
	}
	as, ok := k.(gossh.AlgorithmSigner)
	if !ok {
		return nil, fmt.Errorf("RSA host key cannot sign with SHA-2")
	}
	return gossh.NewSignerWithAlgorithms(as, []string{gossh.KeyAlgoRSASHA512, gossh.KeyAlgoRSASHA256})
}

func (s *Server) serverConfig(ctx gliderssh.Context) *gossh.ServerConfig {
	cfg := &gossh.ServerConfig{MaxAuthTries: s.cfg.MaxAuthTries}
	cfg.Ciphers = serverCiphers
	cfg.KeyExchanges = serverKeyExchanges
	cfg.MACs = serverMACs
	cfg.PublicKeyAuthAlgorithms = serverPublicKeyAlgorithms
	cfg.AuthLogCallback = func(md gossh.ConnMetadata, method string, err error) { s.logAuth(ctx, md, method, err) }
	if slices.Contains(s.cfg.AuthMethods, AuthNone) {
		cfg.NoClientAuth = true
		cfg.NoClientAuthCallback = func(gossh.ConnMetadata) (*gossh.Permissions, error) {
			if !s.authenticated(ctx, true) {
				return nil, fmt.Errorf("session is gone")
			}
			return nil, nil
		}
	}
	return cfg
}

func (s *Server) checkPassword(ctx gliderssh.Context, pw string) bool {
	sess := sessionOf(ctx)
	return s.authenticated(ctx, sess != nil && sess.CheckPassword(pw))
}

// checkPublicKey accepts only the session's own key. x/crypto verifies the
// signature afterwards; identity is still the tunnel's session.
func (s *Server) checkPublicKey(ctx gliderssh.Context, key gliderssh.PublicKey) bool {
	sess := sessionOf(ctx)
	if sess == nil || sess.SSHPublicKey == "" {
		return s.authenticated(ctx, false)
	}
	want, _, _, _, err := gossh.ParseAuthorizedKey([]byte(sess.SSHPublicKey))
	ok := err == nil && bytes.Equal(want.Marshal(), key.Marshal())
	return s.authenticated(ctx, ok)
}

// envAllowed reports whether a client may set name.
func (s *Server) envAllowed(name string) bool {
	return gateway.EnvAllowed(name, s.cfg.EnvAllow)
}

func (s *Server) addChan(c *channel) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	s.chans[c] = struct{}{}
	return true
}

func (s *Server) removeChan(c *channel) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.chans, c)
	if len(s.chans) == 0 && s.idle != nil {
		close(s.idle)
		s.idle = nil
	}
}

// Shutdown refuses new channels, tells interactive users, and waits for
// running commands until ctx is done; then it kills what still runs, closes
// every connection and returns.
func (s *Server) Shutdown(ctx context.Context) {
	s.mu.Lock()
	s.closing = true
	var idle chan struct{}
	if len(s.chans) > 0 {
		s.idle = make(chan struct{})
		idle = s.idle
	}
	for c := range s.chans {
		c.notify("\r\nsandgate: the gateway is shutting down\r\n")
	}
	s.mu.Unlock()
	if idle != nil {
		select {
		case <-idle:
		case <-ctx.Done():
		}
	}
	s.mu.Lock()
	for c := range s.chans {
		c.abort()
	}
	s.mu.Unlock()
	_ = s.gs.Close()
	s.startups.drops.Stop()
	s.startups.perDrops.Stop()
}
