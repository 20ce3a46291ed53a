// Package tunnel carries SSH inside HTTP CONNECT, or inside a WebSocket
// for front ends that do not pass CONNECT: the server side authorises a
// tunnel to one session, takes the connection over and hands it on; the
// client side dials such a tunnel.
package tunnel

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coder/websocket"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/internal/rawio"
)

// Lookup finds a principal's session.
type Lookup interface {
	Get(ctx context.Context, p gateway.Principal, id string) (*gateway.Session, error)
}

// ConnHandler serves one tunnelled connection bound to its session. It owns
// conn and returns when the connection is over. ctx carries the CONNECT
// request's values (its principal and request id), not its cancellation.
type ConnHandler func(ctx context.Context, conn net.Conn, s *gateway.Session)

// Admitter decides at a CONNECT, before it is answered, whether the
// principal may open one more tunnel (sshd.Server's budgets of tunnels in
// SSH authentication). An error is the answer (a *gateway.Error). On
// success it returns the context to hand the ConnHandler, and release,
// which the Server calls once the tunnel is over, handed off or not.
type Admitter interface {
	AdmitTunnel(ctx context.Context, p gateway.Principal) (context.Context, func(), error)
}

// Option configures a Server.
type Option func(*Server)

// WithAdmitter checks every CONNECT with a before it is answered.
func WithAdmitter(a Admitter) Option { return func(t *Server) { t.admit = a } }

// Server is the CONNECT endpoint. It expects the request's principal in its
// context (the REST authentication middleware puts it there).
type Server struct {
	lookup     Lookup
	handle     ConnHandler
	writeError func(http.ResponseWriter, error)
	log        *slog.Logger
	admit      Admitter      // nil: every CONNECT is admitted
	metrics    Metrics       // nil: not counted (account.go)
	audit      audit.Auditor // nil: not recorded
	lingerWait time.Duration // bounds a tunnel's end (linger.go)

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// NewServer returns a CONNECT server that finds sessions with lookup,
// answers failures with writeError and hands established tunnels to handle.
func NewServer(lookup Lookup, handle ConnHandler, writeError func(http.ResponseWriter, error), log *slog.Logger, opts ...Option) *Server {
	t := &Server{lookup: lookup, handle: handle, writeError: writeError, log: log, conns: map[net.Conn]struct{}{}, lingerWait: lingerWait}
	for _, o := range opts {
		o(t)
	}
	return t
}

// ServeHTTP implements http.Handler for CONNECT /v1/sessions/{id}, for
// GET /v1/sessions/{id}/ssh with Upgrade: websocket (the same byte stream
// in binary messages), and for GET /v1/sessions/{id}/terminal (a shell on
// a PTY, terminal.go). The caller checks a WebSocket's Origin.
func (t *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ws := false
	switch {
	case r.Method == http.MethodConnect:
	case r.Method == http.MethodGet && IsWebSocket(r):
		ws = true
	case r.Method == http.MethodGet:
		w.Header().Set("Upgrade", "websocket")
		t.writeError(w, &gateway.Error{Kind: gateway.KindInvalid, Code: "websocket_required",
			Message: "this endpoint carries SSH in a WebSocket: send Upgrade: websocket"})
		return
	default:
		http.Error(w, "CONNECT only", http.StatusMethodNotAllowed)
		return
	}
	p, ok := gateway.PrincipalFrom(r.Context())
	if !ok {
		t.writeError(w, gateway.ErrUnauthorized)
		return
	}
	id := path.Base(r.URL.Path)
	terminal := false
	if ws {
		id = path.Base(path.Dir(r.URL.Path))
		terminal = path.Base(r.URL.Path) == "terminal" // terminal.go
	}
	s, err := t.lookup.Get(r.Context(), p, id)
	if err != nil {
		t.writeError(w, err)
		return
	}
	// A stopped session is live: its first process starts it again. A
	// paused one resumes now, while the client's SSH handshake runs.
	if snap := s.Snapshot(); snap.Status != gateway.StatusRunning && snap.Status != gateway.StatusStopped && snap.Status != gateway.StatusPaused {
		if snap.Status != gateway.StatusFailed { // ended since the lookup
			t.writeError(w, gateway.ErrNotFound)
			return
		}
		t.writeError(w, &gateway.Error{Kind: gateway.KindConflict, Code: "session_not_running",
			Message: "session " + s.ID + " has failed: " + snap.StatusReason})
		return
	}
	if err := s.Wake(r.Context()); err != nil {
		t.writeError(w, err)
		return
	}
	if !t.track(nil) {
		t.writeError(w, &gateway.Error{Kind: gateway.KindUnavailable, Code: "shutting_down", Message: "gateway is shutting down"})
		return
	}
	defer t.wg.Done()
	ctx := r.Context()
	if t.admit != nil {
		actx, release, err := t.admit.AdmitTunnel(ctx, p)
		if err != nil {
			t.writeError(w, err)
			return
		}
		defer release()
		ctx = actx
	}

	var conn net.Conn
	var wsc *websocket.Conn
	if ws {
		conn, wsc = t.upgrade(w, r, s.ID)
	} else {
		conn = t.hijack(w, r, s.ID)
	}
	if conn == nil {
		return
	}
	defer t.untrack(conn)
	remove, live := s.AddPausedConn(func() { conn.Close() })
	defer remove()
	if !live {
		conn.Close()
		return
	}
	s.Touch(time.Now())
	transport := "connect"
	if ws {
		transport = "websocket"
	}
	if terminal {
		transport = "terminal"
	}
	t.log.InfoContext(r.Context(), "tunnel_opened", "session", s.ID, "tenant", p.Tenant, "remote", r.RemoteAddr, "transport", transport)
	ctx = context.WithoutCancel(ctx)
	if terminal {
		// The SSH stream runs over a pipe inside the gateway: it is what
		// is counted and audited.
		t.serveTerminal(ctx, wsc, s, func(pipe net.Conn) {
			counted, done := t.account(ctx, pipe, s)
			defer done()
			t.handle(ctx, counted, s)
		})
		return
	}
	counted, done := t.account(ctx, conn, s)
	defer done()
	t.handle(ctx, counted, s)
}

// hijack takes a CONNECT's connection over and answers 200. It returns
// nil when the tunnel is not to go on (the answer, if any, is written).
func (t *Server) hijack(w http.ResponseWriter, r *http.Request, id string) net.Conn {
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		t.log.ErrorContext(r.Context(), "tunnel_hijack_failed", "session", id, "err", err)
		t.writeError(w, err)
		return nil
	}
	// A plain TCP tunnel moves its bulk data with raw system calls (see
	// internal/rawio); TLS stays as it is. Its end is a lingering close
	// (linger.go).
	lc := newLingerConn(rawio.Wrap(conn), t.lingerWait)
	conn = lc
	// Bytes the client sent with the request (often its SSH version line)
	// sit in the server's buffer; they must come first.
	if n := brw.Reader.Buffered(); n > 0 {
		buf, _ := brw.Reader.Peek(n)
		conn = &prefixConn{Conn: conn, head: bytes.Clone(buf)}
	}
	// Tracked from the hijack on, so Shutdown can always close it; a tunnel
	// that arrives while the server shuts down is closed at once.
	if !t.track(conn) {
		conn.Close()
		<-lc.Done()
		return nil
	}
	_ = conn.SetDeadline(time.Time{})
	if _, err := io.WriteString(conn, "HTTP/1.1 200 Connection Established\r\n\r\n"); err != nil {
		t.untrack(conn)
		return nil
	}
	return conn
}

// upgrade accepts a WebSocket (the caller has checked its Origin) and
// returns its binary messages as a byte stream, or nil.
func (t *Server) upgrade(w http.ResponseWriter, r *http.Request, id string) (net.Conn, *websocket.Conn) {
	hr := &hijackRecorder{ResponseWriter: w, lingerWait: t.lingerWait}
	c, err := websocket.Accept(hr, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
	if err != nil { // Accept has answered
		t.log.InfoContext(r.Context(), "tunnel_upgrade_failed", "session", id, "err", err)
		return nil, nil
	}
	// The connection outlives the request: its context is not the
	// request's, whose end would close it. (A terminal reads c's messages
	// itself, never this stream's; its Close ends c all the same.)
	conn := &wsConn{Conn: websocket.NetConn(context.WithoutCancel(r.Context()), c, websocket.MessageBinary), ws: c,
		raw: hr.raw, sock: hr.sock, br: hr.br, frames: hr.frames, gather: hr.gather, wait: t.lingerWait, done: make(chan struct{})}
	if !t.track(conn) {
		c.CloseNow()
		<-hr.raw.Done()
		return nil, nil
	}
	return conn, c
}

// hijackRecorder keeps the connection a WebSocket's Accept hijacks.
type hijackRecorder struct {
	http.ResponseWriter
	lingerWait time.Duration
	raw        *lingerConn     // the hijacked connection
	sock       syscall.RawConn // its socket, when it is one (not TLS)
	br         *bufio.Reader   // the library reads the frames through it
	frames     *frameTracker   // what the library reads, frame by frame
	gather     *gatherConn     // the library writes the frames through it (nil: straight to raw)
}

func (h *hijackRecorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(h.ResponseWriter).Hijack()
	if err != nil {
		return c, brw, err
	}
	// The library reads frames from the connection it is handed (after
	// the bytes brw holds): raw system calls on a plain TCP socket, as a
	// CONNECT tunnel's (internal/rawio), through a tracker of the frames.
	// The library's Close closes it: a lingering close (linger.go).
	c = rawio.Wrap(c)
	if sc, ok := c.(syscall.Conn); ok {
		h.sock, _ = sc.SyscallConn()
	}
	h.raw = newLingerConn(c, h.lingerWait)
	h.frames = &frameTracker{Conn: h.raw}
	// It writes them through a buffer of ours (net/http's is as large)
	// over a gatherConn, so that wsConn.Write sends a frame in one
	// writev(2): a socket's only (TLS writes records of its own).
	if h.sock != nil && brw != nil && brw.Writer.Buffered() == 0 {
		h.gather = &gatherConn{Conn: h.raw, rc: h.sock}
		brw.Writer = bufio.NewWriterSize(h.gather, wsWriteBuf)
	}
	if brw != nil {
		h.br = brw.Reader
		if n := brw.Reader.Buffered(); n > 0 {
			head, _ := brw.Reader.Peek(n)
			h.frames.feed(head)
		}
	}
	return h.frames, brw, nil
}

// wsCloseWait is how long a client's Close waits for the gateway's
// answer to its close frame before it drops the connection
// (wsClientConn.Close).
const wsCloseWait = time.Second

// wsConn is a WebSocket tunnel's byte stream. Close returns at once; in
// the background it sends a close frame, reads and drops the client's
// frames up to its answer, then closes the connection under it, which
// lingers (lingerConn): all of it within one deadline, wait from Close
// (the library would wait 5 s for the answer, and 5 s more to write the
// close frame), so that a session's end, or a shutdown, is not held up
// by a client that does not answer, nor one closed after another.
type wsConn struct {
	net.Conn                 // the binary messages (websocket.NetConn)
	ws       *websocket.Conn // the library's connection
	raw      *lingerConn     // the hijacked connection under it
	br       *bufio.Reader   // the library's reader of raw (nil: unknown)
	frames   *frameTracker   // the frames the library reads (nil: unknown)
	sock     syscall.RawConn // raw's socket, when it is one (not TLS)
	gather   *gatherConn     // under the library's writes, or nil
	wait     time.Duration   // bounds Close's handshake and linger
	once     sync.Once
	ended    atomic.Bool   // Close was called: reads fail (Read)
	done     chan struct{} // closed once Close has closed raw
	// mu orders ReadAvailable's look at br and frames before Close,
	// whose close handshake reads br in another goroutine; closing is
	// set under it, and ReadAvailable answers 0 from then on.
	mu      sync.Mutex
	closing bool
}

// Write sends p as one binary message. The library writes a frame through
// a 4 KiB buffer, one write each time it fills and the rest of a large
// payload at once: gathered below it (gatherConn), the frame leaves in
// one writev(2) once complete. (Over TLS, which writes records of its
// own, and for a small message, which fits in the buffer, the library's
// writes go as they are.)
func (c *wsConn) Write(p []byte) (int, error) {
	if c.gather == nil || len(p) < gatherMin {
		return c.Conn.Write(p)
	}
	c.gather.hold()
	n, err := c.Conn.Write(p)
	if rerr := c.gather.release(); err == nil && rerr != nil {
		n, err = 0, rerr
	}
	return n, err
}

// SetWriteDeadline sets the library's write deadline and the socket's: a
// large frame gathered below the library (gatherConn) is written after
// the library's write has returned, out of its deadline's reach.
func (c *wsConn) SetWriteDeadline(t time.Time) error {
	if c.gather != nil {
		_ = c.raw.SetWriteDeadline(t)
	}
	return c.Conn.SetWriteDeadline(t)
}

// SetDeadline is SetReadDeadline and SetWriteDeadline.
func (c *wsConn) SetDeadline(t time.Time) error {
	if c.gather != nil {
		_ = c.raw.SetWriteDeadline(t)
	}
	return c.Conn.SetDeadline(t)
}

// ReadAvailable returns how many bytes a Read returns without waiting for
// the client: the rest of the data frame being read, or of the next one
// when its header is in, as far as its bytes are in the library's buffer
// or the socket. The library reads a frame's payload in full up to the
// size asked, so a larger read would wait for the client (holding its
// buffer). The SSH server's read-ahead asks it before it lends a big
// buffer to a read, and reads no more than it says. Called by the one
// goroutine that reads the stream.
func (c *wsConn) ReadAvailable() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing || c.br == nil || c.frames == nil || c.sock == nil {
		return 0
	}
	sock := int64(rawio.Available(c.sock))
	t := c.frames
	t.mu.Lock()
	pos := t.in - int64(c.br.Buffered())
	n := t.available(pos, t.in+sock)
	t.mu.Unlock()
	if n < 0 && sock > 0 {
		// The next frame's header is in the socket: peek at it.
		var head [14]byte
		h := rawio.Peek(c.sock, head[:])
		n = availableAt(head[:h], sock)
	}
	return int(min(max(n, 0), 1<<30))
}

// Read reads the binary messages' bytes; once Close was called, it
// fails (net.ErrClosed): what the client still sends is the close
// handshake's to read and drop. (A read under way when Close came ends
// with the next bytes, or the handshake's end.)
func (c *wsConn) Read(p []byte) (int, error) {
	if c.ended.Load() {
		return 0, net.ErrClosed
	}
	n, err := c.Conn.Read(p)
	if err != nil && c.ended.Load() {
		err = net.ErrClosed // woken by Close (wakeReader)
	}
	return n, err
}

// Close ends the tunnel (see wsConn) and returns; Done says when it is
// over.
func (c *wsConn) Close() error {
	c.once.Do(func() {
		c.ended.Store(true)
		c.mu.Lock()
		c.closing = true
		c.mu.Unlock()
		go c.closeHandshake(time.Now().Add(c.wait))
	})
	return nil
}

// Done is closed once the connection under the WebSocket is closed.
func (c *wsConn) Done() <-chan struct{} { return c.done }

// closeHandshake is Close's work: the library's close handshake, whose
// end closes raw (a lingering close), all by deadline. Not the NetConn's
// Close, which cancels a read under way (x/crypto's, which always has
// one while the connection is open): the library then closes the socket
// at once, without waiting for the client's close frame, nor reading
// what the client still sends, so that the kernel answered it with a
// reset.
func (c *wsConn) closeHandshake(deadline time.Time) {
	defer close(c.done)
	c.raw.setDeadline(deadline)
	// What the handshake reads and drops of a client that goes on
	// sending is bounded as the linger's is.
	c.raw.limitReads(lingerMaxBytes)
	done := make(chan struct{})
	go func() {
		// The close frame (after a data frame under way), then the
		// client's frames up to its answer; then the library closes raw.
		_ = c.ws.Close(websocket.StatusNormalClosure, "")
		close(done)
	}()
	// x/crypto's read under way (there always is one) ends now: it
	// ends the SSH connection, as a closed socket did. Not in the middle
	// of a frame: the library's read would return what it has of the
	// payload without counting it, and the handshake would then skip
	// that many bytes too many, into the client's answer. That read ends
	// with the frame (a client sends its frames whole), and the next
	// fails (Read).
	if c.frames != nil && c.frames.midFrame() {
		c.raw.readBy(deadline)
	} else {
		c.raw.wakeReader(deadline)
	}
	timer := time.NewTimer(time.Until(deadline))
	select {
	case <-done:
	case <-timer.C:
		// No answer in time: raw's close (past its deadline: at once)
		// wakes the library's read or write under way.
		_ = c.raw.Close()
		<-done
	}
	timer.Stop()
	_ = c.Conn.Close() // the NetConn's own timers; the library is closed
	_ = c.raw.Close()  // the library closed it already: a no-op
	<-c.raw.Done()
}

// IsWebSocket reports whether r asks for a WebSocket upgrade.
func IsWebSocket(r *http.Request) bool {
	return headerHasToken(r.Header, "Connection", "upgrade") && headerHasToken(r.Header, "Upgrade", "websocket")
}

func headerHasToken(h http.Header, key, token string) bool {
	for _, v := range h.Values(key) {
		for _, f := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(f), token) {
				return true
			}
		}
	}
	return false
}

// track registers conn (nil: only reserves a place in the wait group) and
// reports false, registering nothing, once the server is shutting down.
func (t *Server) track(conn net.Conn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if conn == nil {
		if t.closed {
			return false
		}
		t.wg.Add(1)
		return true
	}
	if t.closed {
		return false
	}
	t.conns[conn] = struct{}{}
	return true
}

// untrack closes conn, forgets it, and waits for its close to be over
// (a lingering close, bounded: linger.go).
func (t *Server) untrack(conn net.Conn) {
	conn.Close()
	t.mu.Lock()
	delete(t.conns, conn)
	t.mu.Unlock()
	if done := lingerDone(conn); done != nil {
		<-done
	}
}

// Shutdown refuses new tunnels and waits for open ones to end until ctx is
// done, then closes those still open and waits for their handlers. The
// tunnels' ends linger side by side (linger.go): one lingerWait at most
// past ctx.
func (t *Server) Shutdown(ctx context.Context) {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	done := make(chan struct{})
	go func() {
		t.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return
	case <-ctx.Done():
	}
	t.mu.Lock()
	for c := range t.conns {
		c.Close()
	}
	t.mu.Unlock()
	<-done
}

type prefixConn struct {
	net.Conn
	head []byte // read from Conn already; Read gives these first
}

// NetConn returns the connection under c, as (*tls.Conn).NetConn does:
// its socket, for a probe or a socket option. Its bytes must still be read
// through c, which gives head first.
func (c *prefixConn) NetConn() net.Conn { return c.Conn }

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.head) > 0 {
		n := copy(p, c.head)
		c.head = c.head[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// Unwrap returns the connection under c and the bytes already read from
// it that c's reader has not had yet, so that a caller can pass those on
// and then move data with the socket itself (splice(2) needs it). A
// connection that holds no such bytes is returned as it is. c must not be
// read after the call.
func Unwrap(c net.Conn) (net.Conn, []byte) {
	if pc, ok := c.(*prefixConn); ok {
		head := pc.head
		pc.head = nil
		return pc.Conn, head
	}
	return c, nil
}

// Done is the connection's under c (lingerConn.Done), or nil.
func (c *prefixConn) Done() <-chan struct{} { return lingerDone(c.Conn) }

// CloseWrite half-closes the underlying connection when it can.
func (c *prefixConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
