package egress

import (
	"context"
	"net"
	"testing"
	"time"
)

// tcpPair is a connected loopback pair: the accepted side (the proxy's)
// and the dialled side (the client's).
func tcpPair(t *testing.T) (server, client *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return s.(*net.TCPConn), c.(*net.TCPConn)
}

// A parked transparent connection is let go when its client closes (FIN,
// with bytes it sent still unread) or resets it, and not while it stays:
// whilePeerOpen's context ends then, and only then.
func TestWhilePeerOpen(t *testing.T) {
	for _, tc := range []struct {
		name  string
		leave func(c *net.TCPConn)
	}{
		{"close", func(c *net.TCPConn) { c.Close() }},
		{"close after sending", func(c *net.TCPConn) { c.Write([]byte("GET / HTTP/1.1\r\n")); c.Close() }},
		{"reset", func(c *net.TCPConn) { c.SetLinger(0); c.Close() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, cl := tcpPair(t)
			ctx, stop := whilePeerOpen(context.Background(), &clientConn{Conn: srv})
			defer stop()
			cl.Write([]byte("\x16\x03\x01")) // a client speaks first, unread
			select {
			case <-ctx.Done():
				t.Fatal("let go while the client is still there")
			case <-time.After(3 * peerPoll):
			}
			tc.leave(cl)
			select {
			case <-ctx.Done():
			case <-time.After(30 * time.Second):
				t.Fatal("the client left but the connection stays parked")
			}
		})
	}
	// stop ends the poll at once, the client still there.
	srv, _ := tcpPair(t)
	ctx, stop := whilePeerOpen(context.Background(), srv)
	stop()
	if ctx.Err() == nil {
		t.Error("stop did not end the context")
	}
}
