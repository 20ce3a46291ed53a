package tunnel

import (
	"crypto/tls"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// lingerWait bounds a tunnel's end on the gateway (lingerConn, and a
// WebSocket's close handshake before it, wsConn.Close): what the gateway
// wrote goes out, then its FIN, and the client's last bytes are read and
// dropped until the client's own end, or this long.
const lingerWait = time.Second

// lingerMaxBytes bounds what a tunnel's end reads and drops of a client
// that goes on sending: more than two socket buffers' worth, which is
// what can be in flight when the gateway ends it.
const lingerMaxBytes = 16 << 20

// aLongTimeAgo is a deadline in the past: it wakes a read at once.
var aLongTimeAgo = time.Unix(1, 0)

// lingerConn is a tunnel's hijacked connection, as the gateway closes it.
// A socket closed with bytes of its peer unread in its receive queue
// makes the kernel answer with a reset instead of a FIN, and drop what it
// had not sent yet of the gateway's own: a client that was still sending
// (ssh's last packets, a WebSocket's close frame, an upload under way when
// the session was deleted) then saw "connection reset by peer", and lost
// the end of its output (an exec's exit status). So Close ends the
// connection as a well-behaved server does (a lingering close): it
// returns at once, and in the background lets a write under way finish,
// sends a FIN after everything written (a TLS close_notify first), reads
// and drops what the client still sends until its end, and only then
// closes the socket; all of it bounded by a deadline (lingerWait from
// Close, or the one closeBy names) and lingerMaxBytes, so that no client
// holds a goroutine or a descriptor past them. Reads and writes that
// start after Close fail with net.ErrClosed; a read under way is woken
// and fails so too. Done is closed once the socket is.
type lingerConn struct {
	net.Conn          // the hijacked connection: a rawio.Conn, a *net.TCPConn or a *tls.Conn
	tcp      net.Conn // the TCP connection under it: Conn itself, or the TLS connection's
	wait     time.Duration

	rmu, wmu sync.Mutex // held by a read, a write under way
	mu       sync.Mutex // orders wakeReader's deadline with closeBy's
	closing  atomic.Bool
	rearm    atomic.Int64 // a read deadline (Unix ns) the next read sets first (wakeReader), or 0
	until    atomic.Int64 // a deadline closeBy set (Unix ns), or 0
	// budget, once set (budgeted), is what reads may still take: a
	// WebSocket's close handshake reads and drops the client's frames
	// through this conn before it closes it.
	budgeted atomic.Bool
	budget   atomic.Int64
	once     sync.Once
	done     chan struct{}
}

func newLingerConn(c net.Conn, wait time.Duration) *lingerConn {
	l := &lingerConn{Conn: c, tcp: c, wait: wait, done: make(chan struct{})}
	if tc, ok := c.(*tls.Conn); ok {
		l.tcp = tc.NetConn()
	}
	return l
}

// NetConn returns the connection under c: its socket, for a probe (the
// read-ahead's). Its bytes must be read through c.
func (c *lingerConn) NetConn() net.Conn { return c.Conn }

func (c *lingerConn) Read(p []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if c.closing.Load() {
		return 0, net.ErrClosed
	}
	if d := c.rearm.Swap(0); d != 0 {
		_ = c.Conn.SetReadDeadline(time.Unix(0, d)) // after wakeReader's: see there
	}
	n, err := c.Conn.Read(p)
	if c.closing.Load() {
		return 0, net.ErrClosed // woken by Close: the rest is the linger's to drop
	}
	if c.budgeted.Load() && c.budget.Add(-int64(n)) < 0 {
		return 0, net.ErrClosed
	}
	return n, err
}

func (c *lingerConn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.closing.Load() {
		return 0, net.ErrClosed
	}
	return c.Conn.Write(p)
}

// CloseWrite half-closes the connection: a TLS close_notify, then the
// TCP FIN.
func (c *lingerConn) CloseWrite() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.closeWrite()
}

func (c *lingerConn) closeWrite() error {
	var err error
	if tc, ok := c.Conn.(*tls.Conn); ok {
		err = tc.CloseWrite() // close_notify: it does not half-close the TCP connection
	}
	if cw, ok := c.tcp.(interface{ CloseWrite() error }); ok {
		if e := cw.CloseWrite(); err == nil {
			err = e
		}
	}
	return err
}

// limitReads bounds what reads take from now on to n bytes: past them,
// a read fails (net.ErrClosed).
func (c *lingerConn) limitReads(n int64) {
	c.budget.Store(n)
	c.budgeted.Store(true)
}

// Close starts the lingering close (see lingerConn) and returns; Done
// says when it is over.
func (c *lingerConn) Close() error {
	d := time.Now().Add(c.wait)
	if u := c.until.Load(); u != 0 {
		d = time.Unix(0, u)
	}
	c.closeBy(d)
	return nil
}

// setDeadline makes a later Close end the linger at d (a WebSocket's
// close handshake shares its deadline with the linger after it).
func (c *lingerConn) setDeadline(d time.Time) { c.until.Store(d.UnixNano()) }

// closeBy starts the lingering close, over by deadline at the latest.
func (c *lingerConn) closeBy(deadline time.Time) {
	c.once.Do(func() {
		c.mu.Lock()
		c.closing.Store(true)
		// Wake a read under way: it fails, and leaves the socket to the
		// linger (see Read).
		_ = c.Conn.SetReadDeadline(aLongTimeAgo)
		c.mu.Unlock()
		go c.linger(deadline)
	})
}

// wakeReader makes a read under way fail at once (a timeout), and the
// reads after it fail at deadline: a WebSocket's Close ends x/crypto's
// read, which the library would otherwise hold until the client answers
// its close frame, so that the SSH connection ends now (a pause waits
// for its shells' SIGHUP), while the close handshake reads on. The next
// read sets the deadline before it reads (rearm), so that the
// handshake's read, which waited for the woken one, is not woken too.
// It does nothing once Close was called: the linger has the socket.
func (c *lingerConn) wakeReader(deadline time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing.Load() {
		return
	}
	_ = c.Conn.SetReadDeadline(aLongTimeAgo)
	c.rearm.Store(deadline.UnixNano())
}

// readBy makes reads fail at deadline, the read under way too, unless
// Close was called (the linger has the socket then).
func (c *lingerConn) readBy(deadline time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing.Load() {
		return
	}
	_ = c.Conn.SetReadDeadline(deadline)
}

// Done is closed once the connection is closed.
func (c *lingerConn) Done() <-chan struct{} { return c.done }

func (c *lingerConn) linger(deadline time.Time) {
	defer close(c.done)
	// At the deadline the socket closes, whatever is still under way:
	// the deadlines set on it below bound the reads and writes only as
	// long as nothing sets others (a SetDeadline after Close, or
	// crypto/tls, which gives a close_notify 5 s of its own to find room
	// in the send buffer, and whose Close waits for it).
	stop := time.AfterFunc(time.Until(deadline), func() { _ = c.tcp.Close() })
	defer stop.Stop()
	// A write under way (to a client that reads slowly) may finish until
	// the deadline; then the FIN follows what was written. In another
	// goroutine: a client that writes and only then reads needs its
	// bytes read meanwhile.
	_ = c.Conn.SetWriteDeadline(deadline)
	fin := make(chan struct{})
	go func() {
		defer close(fin)
		c.wmu.Lock()
		defer c.wmu.Unlock()
		_ = c.closeWrite()
	}()
	c.rmu.Lock() // the read Close woke has returned
	_ = c.tcp.SetReadDeadline(deadline)
	buf := make([]byte, 32<<10)
	for left := int64(lingerMaxBytes); left > 0; {
		n, err := c.tcp.Read(buf[:min(int64(len(buf)), left)])
		left -= int64(n)
		if err != nil {
			break // the client's end (EOF), the deadline, or a reset
		}
	}
	c.rmu.Unlock()
	// The FIN is out, or the deadline passed: a TLS close_notify still
	// waiting for room is dropped with the socket.
	<-fin
	_ = c.Conn.Close()
}

// lingerDone returns when conn (a tunnel's connection, as the server
// tracks it) is closed, or nil if conn does not say.
func lingerDone(conn net.Conn) <-chan struct{} {
	if l, ok := conn.(interface{ Done() <-chan struct{} }); ok {
		return l.Done()
	}
	return nil
}
