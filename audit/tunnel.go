package audit

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Tunnel records a CONNECT tunnel of session opened, and returns conn
// counting the bytes each way and the func that records its close.
func Tunnel(ctx context.Context, a Auditor, conn net.Conn, session string) (net.Conn, func()) {
	a.Record(ctx, Event{Kind: KindTunnelOpen, Session: session, Addr: conn.RemoteAddr().String()})
	began := time.Now()
	c := &countConn{Conn: conn}
	var once sync.Once
	return c, func() {
		once.Do(func() {
			a.Record(ctx, Event{Kind: KindTunnelClose, Session: session, BytesIn: c.in.Load(), BytesOut: c.out.Load(),
				DurationMs: time.Since(began).Milliseconds()})
		})
	}
}

type countConn struct {
	net.Conn
	in, out atomic.Int64
}

// NetConn returns the connection under c, as (*tls.Conn).NetConn does, so
// that a reader can reach its socket (the SSH server's read-ahead probe
// and cork); reads and writes must still go through c to be counted.
func (c *countConn) NetConn() net.Conn { return c.Conn }

func (c *countConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.in.Add(int64(n))
	return n, err
}

func (c *countConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.out.Add(int64(n))
	return n, err
}

// CloseWrite half-closes the underlying connection when it can.
func (c *countConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
