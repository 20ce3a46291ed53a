package tunnel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coder/websocket"
)

// Transports a Dialer may use.
const (
	// TransportConnect is an HTTP CONNECT to /v1/sessions/{id}.
	TransportConnect = "connect"
	// TransportWebSocket is a WebSocket to /v1/sessions/{id}/ssh, for
	// front ends that do not pass CONNECT.
	TransportWebSocket = "websocket"
	// TransportAuto tries CONNECT and falls back to a WebSocket when
	// something between client and gateway refuses the CONNECT.
	TransportAuto = "auto"
)

// ParseTransport checks a transport's name ("" is connect).
func ParseTransport(s string) (string, error) {
	switch s {
	case "", TransportConnect:
		return TransportConnect, nil
	case TransportWebSocket, TransportAuto:
		return s, nil
	}
	return "", fmt.Errorf("unknown transport %q: want connect, websocket or auto", s)
}

// WebSocketPath returns the WebSocket path for id under the API URL's path.
func WebSocketPath(apiPath, id string) string { return ConnectPath(apiPath, id) + "/ssh" }

// connectRefused reports whether err is a CONNECT refused by something
// other than the gateway, or answered with a refusal of the method: an
// answer that is no HTTP, or a status without the gateway's error
// envelope, or 400, 405 or 501 (what front ends that do not pass CONNECT
// answer). The gateway's own answers (401, 404, 429...) are final.
func connectRefused(err error) bool {
	var se *StatusError
	if errors.As(err, &se) {
		switch se.StatusCode {
		case http.StatusBadRequest, http.StatusMethodNotAllowed, http.StatusNotImplemented:
			return true
		}
		return se.Code == ""
	}
	var re *responseError
	return errors.As(err, &re)
}

// responseError is a CONNECT answer that could not be read as HTTP.
type responseError struct{ err error }

func (e *responseError) Error() string { return "read CONNECT response: " + e.err.Error() }
func (e *responseError) Unwrap() error { return e.err }

// dialWebSocket opens the SSH stream of session id in a WebSocket.
func (d *Dialer) dialWebSocket(ctx context.Context, u *url.URL, id string, timeout time.Duration) (net.Conn, error) {
	wu := *u
	wu.Path, wu.RawPath = WebSocketPath(u.Path, id), ""
	wu.RawQuery, wu.Fragment = "", ""
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = d.TLSConfig.Clone()
	tr.Proxy = nil
	// The connection under the WebSocket (and TLS), which gathers a large
	// frame's writes (wsClientConn.Write).
	var under *holdConn
	plain := canPeek && u.Scheme == "http"
	nd := &net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := nd.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		under = &holdConn{Conn: c}
		if plain {
			// The answer's reader takes no byte past its head: the
			// frames after it stay in the socket, for Socket.
			under.head = &headReader{}
			if sc, ok := c.(syscall.Conn); ok {
				under.head.rc, _ = sc.SyscallConn()
			}
			if under.head.rc == nil {
				under.head = nil
			}
		}
		return under, nil
	}
	h := http.Header{}
	if d.Token != "" {
		h.Set("Authorization", "Bearer "+d.Token)
	}
	hctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, resp, err := websocket.Dial(hctx, wu.String(), &websocket.DialOptions{
		HTTPClient: &http.Client{Transport: tr}, HTTPHeader: h,
	})
	if err != nil {
		// The refused upgrade's connection, if kept for reuse, is this
		// transport's alone: nothing reuses it.
		defer tr.CloseIdleConnections()
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			return nil, statusError(resp)
		}
		return nil, fmt.Errorf("websocket to gateway: %w", err)
	}
	nc := websocket.NetConn(context.WithoutCancel(ctx), c, websocket.MessageBinary)
	wc := &wsClientConn{Conn: nc, under: under, ws: c}
	if under != nil && under.head != nil {
		// The answer's reader took nothing past the answer's head: the
		// socket is at the first frame, and can be handed over (Socket).
		under.head.done.Store(true)
		wc.plain = true
	}
	return wc, nil
}

// statusError turns a refused upgrade into a *StatusError.
func statusError(resp *http.Response) *StatusError {
	se := &StatusError{StatusCode: resp.StatusCode}
	if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && secs > 0 {
		se.RetryAfter = time.Duration(secs) * time.Second
	}
	if resp.Body != nil {
		var body struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		if json.NewDecoder(io.LimitReader(resp.Body, 1024)).Decode(&body) == nil {
			se.Code, se.Message = body.Error.Code, body.Error.Message
		}
	}
	return se
}

// wsClientConn is a WebSocket's byte stream. A WebSocket has no half close:
// CloseWrite, which a relay calls when its input ends, closes it. A read
// that fails because the conn was closed says net.ErrClosed, as a socket's
// does (the library's says "context canceled").
type wsClientConn struct {
	net.Conn
	under  *holdConn       // the connection under the WebSocket, or nil
	ws     *websocket.Conn // kept reachable: its finalizer closes the socket
	plain  bool            // under is the TCP socket, at a frame's start after the handshake
	read   atomic.Bool     // Read was called: the library may hold bytes of the socket
	taken  atomic.Bool     // Socket handed the socket over: Close only closes it
	closed atomic.Bool
}

// Socket hands the TCP socket under the WebSocket to a caller that
// speaks the frames itself (piperelay.RelayWebSocket: the gateway's data
// frames spliced into ssh's pipe, as a CONNECT tunnel's bytes are, and
// ssh's written up as masked frames): the library reads and writes
// nothing from then on (Read and Write report net.ErrClosed, so that no
// frame of the library's lands inside one of the caller's), and Close
// closes the socket without the close handshake (the caller's to make).
// It reports false, handing nothing over, over TLS, where the
// handshake's reader may have taken bytes past the answer, or once Read
// was called.
func (c *wsClientConn) Socket() (net.Conn, bool) {
	if !c.plain || c.read.Load() || c.closed.Load() || !c.taken.CompareAndSwap(false, true) {
		return nil, false
	}
	return c.under.Conn, true
}

// gatherMin is the smallest message whose frame is gathered (wsClientConn,
// wsConn): one that fits in the library's 4 KiB write buffer leaves in
// one write(2) anyway.
const gatherMin = 4 << 10

// Write sends p as one binary message. The library masks a client's frame
// into a 4 KiB buffer and writes each buffer as it fills: 64 write(2)s
// for a 256 KiB frame, which the gateway would receive as as many small
// segments, a wake-up each. A large frame's writes are gathered below the
// library (holdConn) and leave in one write(2) once the frame is complete.
func (c *wsClientConn) Write(p []byte) (int, error) {
	if c.taken.Load() {
		return 0, net.ErrClosed // the socket's frames are the caller's (Socket)
	}
	if len(p) < gatherMin || c.under == nil {
		return c.Conn.Write(p)
	}
	c.under.hold()
	n, err := c.Conn.Write(p)
	if rerr := c.under.release(); err == nil && rerr != nil {
		n, err = 0, rerr
	}
	return n, err
}

// holdMax bounds what a holdConn gathers before it writes: a frame of
// the proxy's largest write (256 KiB) and its header.
const holdMax = 256<<10 + 64

// holdConn is the connection under a client's WebSocket (or under the TLS
// over it). Between hold and release its writes gather in one buffer,
// written on release, or before holdMax would be passed; at other times a
// write goes straight through. Writes keep their order: the library
// writes one frame at a time (a control frame waits for the data frame
// being written), and every write takes mu.
type holdConn struct {
	net.Conn
	mu   sync.Mutex
	held bool
	buf  []byte
	head *headReader // until the handshake's answer is read, or nil
}

// headReader reads the handshake's answer from a socket without taking a
// byte past its head (up to the empty line): it peeks at what is in and
// takes up to the line's end (of every head, should an informational
// answer come first). Go's HTTP client reads an answer through a buffer
// of its own, which would otherwise take the first frames with it.
type headReader struct {
	rc    syscall.RawConn
	state int         // where the last byte taken left the head (headMid...)
	done  atomic.Bool // the handshake is over: reads go straight through
}

// A headReader's states: the head ends at an empty line, "\n" or "\r\n"
// after a line's "\n" (Go's HTTP client takes a bare LF as a line's end,
// as RFC 9112 §2.2 lets it).
const (
	headMid       = iota // inside a line
	headLineStart        // just after a line's '\n'
	headLineCR           // after a line's '\n' and a '\r'
)

// Read implements the answer's reads (see headReader).
func (c *holdConn) Read(p []byte) (int, error) {
	h := c.head
	if h == nil || h.done.Load() || len(p) == 0 {
		return c.Conn.Read(p)
	}
	n, err := peekWait(h.rc, p)
	if err != nil {
		return 0, err
	}
	if n == 0 {
		return c.Conn.Read(p) // the peer's end: let the read say so
	}
	take := n
	for i, b := range p[:n] {
		end := false
		switch {
		case b == '\n' && h.state != headMid:
			end, h.state = true, headMid // the empty line: the next answer, if any, starts
		case b == '\n':
			h.state = headLineStart
		case b == '\r' && h.state == headLineStart:
			h.state = headLineCR
		default:
			h.state = headMid
		}
		if end {
			take = i + 1
			break
		}
	}
	return io.ReadFull(c.Conn, p[:take])
}

func (c *holdConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.held {
		return c.Conn.Write(p)
	}
	if len(c.buf)+len(p) > holdMax {
		if err := c.flushLocked(); err != nil {
			return 0, err
		}
		if len(p) > holdMax {
			return c.Conn.Write(p)
		}
	}
	if c.buf == nil {
		c.buf = make([]byte, 0, holdMax)
	}
	c.buf = append(c.buf, p...)
	return len(p), nil
}

func (c *holdConn) hold() {
	c.mu.Lock()
	c.held = true
	c.mu.Unlock()
}

// release writes what was gathered and lets writes through again.
func (c *holdConn) release() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.held = false
	return c.flushLocked()
}

func (c *holdConn) flushLocked() error {
	if len(c.buf) == 0 {
		return nil
	}
	_, err := c.Conn.Write(c.buf)
	c.buf = c.buf[:0]
	return err
}

// HandedOver reports whether Socket handed the socket over.
func (c *wsClientConn) HandedOver() bool { return c.taken.Load() }

func (c *wsClientConn) Read(p []byte) (int, error) {
	c.read.Store(true)
	if c.taken.Load() {
		return 0, net.ErrClosed
	}
	n, err := c.Conn.Read(p)
	if err != nil && err != io.EOF && c.closed.Load() {
		err = net.ErrClosed
	}
	return n, err
}

func (c *wsClientConn) Close() error {
	c.closed.Store(true)
	if c.taken.Load() {
		// The frames are the caller's: no close handshake through the
		// library, which would wait for an answer it no longer reads.
		err := c.under.Conn.Close()
		runtime.KeepAlive(c.ws)
		return err
	}
	if c.under == nil {
		return c.Conn.Close()
	}
	// The library's close handshake first reads the rest of a frame it
	// is inside, with no deadline: a gateway that stopped in the middle
	// of one (its write deadline passed) would hold Close for ever. Wait
	// for the handshake as the gateway does (wsCloseWait), then close
	// the socket under it.
	done := make(chan error, 1)
	go func() { done <- c.Conn.Close() }()
	timer := time.NewTimer(wsCloseWait)
	defer timer.Stop()
	select {
	case err := <-done:
		return err
	case <-timer.C:
		err := c.under.Conn.Close()
		<-done
		return err
	}
}

func (c *wsClientConn) CloseWrite() error { return c.Close() }

// SetWriteDeadline sets the library's write deadline and the connection
// under it: a large frame gathered below the library (holdConn) is
// written after the library's write has returned, out of its deadline's
// reach.
func (c *wsClientConn) SetWriteDeadline(t time.Time) error {
	if c.under != nil {
		_ = c.under.SetWriteDeadline(t)
	}
	return c.Conn.SetWriteDeadline(t)
}

// SetDeadline is SetReadDeadline and SetWriteDeadline.
func (c *wsClientConn) SetDeadline(t time.Time) error {
	if c.under != nil {
		_ = c.under.SetWriteDeadline(t)
	}
	return c.Conn.SetDeadline(t)
}
