package sshd

import (
	"context"
	"net"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/internal/metrics"
)

// TestCork: cork holds a TCP tunnel's segments (TCP_CORK) until uncork,
// through the gateway's byte-counting wrappers, and is a no-op on a
// connection that is not TCP, or none.
func TestCork(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			defer c.Close()
			var b [1]byte
			_, _ = c.Read(b[:])
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	corked := func() int {
		rc, err := c.(*net.TCPConn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		v := -1
		_ = rc.Control(func(fd uintptr) { v, err = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_CORK) })
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	// As serve wraps a tunnel: the byte counters of the audit, the
	// session and the metrics, each naming the one under it.
	wrapped, closed := audit.Tunnel(context.Background(), audit.Discard, c, "sbx-test")
	defer closed()
	wrapped, done := metrics.New().Tunnel((&gateway.Session{}).CountTunnel(wrapped))
	defer done()
	bc := &boundConn{Conn: wrapped}
	uncork := bc.cork()
	if corked() != 1 {
		t.Fatal("cork did not set TCP_CORK")
	}
	uncork()
	if corked() != 0 {
		t.Fatal("uncork left TCP_CORK set")
	}

	var none *boundConn
	none.cork()()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	(&boundConn{Conn: a}).cork()()
	u, err := net.ListenUnix("unix", &net.UnixAddr{Name: t.TempDir() + "/s", Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	uc, err := net.Dial("unix", u.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	(&boundConn{Conn: uc}).cork()()
}
