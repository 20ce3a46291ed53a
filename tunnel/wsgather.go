package tunnel

import (
	"net"
	"sync"
	"syscall"

	"github.com/sandgate/sandgate/internal/rawio"
)

// wsWriteBuf is the size of the buffer the library writes a gateway's
// frames through (as net/http's hijacked one): a write to the
// connection under it that is longer comes straight from the message
// being written (bufio writes a long piece past an empty buffer as it
// is), a shorter one from the buffer itself.
const wsWriteBuf = 4 << 10

// gatherConn is the hijacked socket under a gateway's WebSocket, as the
// library writes to it. Between hold and release (wsConn.Write, one
// message) the library's writes are gathered and leave in one writev(2)
// on release: a long piece by reference (the message's own bytes, which
// outlive the hold), the buffer's pieces copied. Outside a hold a write
// goes straight through. The library writes one frame at a time (a
// control frame from another goroutine waits for the data frame's end),
// and every write takes mu, so the order is kept.
type gatherConn struct {
	net.Conn
	rc      syscall.RawConn // the socket under Conn
	mu      sync.Mutex
	held    bool
	g       *gatherBuf // while held and written to
	flushes int        // writev(2) batches sent (tests)
}

// gatherBuf is a hold's pieces; pooled, so an idle tunnel keeps none.
type gatherBuf struct {
	copied []byte   // copies of the buffer's pieces
	iov    [][]byte // the pieces, in order
}

var gatherPool = sync.Pool{New: func() any { return &gatherBuf{copied: make([]byte, 0, 2*wsWriteBuf)} }}

func (c *gatherConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.held {
		return c.Conn.Write(p)
	}
	if c.g == nil {
		c.g = gatherPool.Get().(*gatherBuf)
	}
	g := c.g
	if len(p) > wsWriteBuf {
		g.iov = append(g.iov, p)
		return len(p), nil
	}
	if cap(g.copied)-len(g.copied) < len(p) {
		// A fresh array: the pieces already gathered point into the old.
		g.copied = make([]byte, 0, max(2*wsWriteBuf, len(p)))
	}
	start := len(g.copied)
	g.copied = append(g.copied, p...)
	g.iov = append(g.iov, g.copied[start:])
	return len(p), nil
}

func (c *gatherConn) hold() {
	c.mu.Lock()
	c.held = true
	c.mu.Unlock()
}

// release writes what was gathered, in one writev(2) as far as the
// socket takes it, and lets writes through again.
func (c *gatherConn) release() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.held = false
	g := c.g
	if g == nil {
		return nil
	}
	c.g = nil
	c.flushes++
	_, err := rawio.Writev(c.rc, g.iov)
	clear(g.iov) // no reference to a message's bytes stays in the pool
	g.iov, g.copied = g.iov[:0], g.copied[:0]
	if cap(g.copied) <= 4*wsWriteBuf {
		gatherPool.Put(g)
	}
	return err
}
