package tunnel_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/tcptest"
	"github.com/sandgate/sandgate/tunnel"
)

// tlsPair returns the two ends of a TLS connection over loopback TCP,
// handshaken: the server's (a *tls.Conn) and its TCP connection, and the
// client's.
func tlsPair(t *testing.T) (srv *tls.Conn, srvTCP *net.TCPConn, cli *tls.Conn) {
	t.Helper()
	hs := httptest.NewUnstartedServer(nil)
	hs.StartTLS()
	pool := x509.NewCertPool()
	pool.AddCert(hs.Certificate())
	scfg := hs.TLS.Clone()
	hs.Close()
	cc, sc := tcptest.Pair(t)
	srv = tls.Server(sc, scfg)
	cli = tls.Client(cc, &tls.Config{RootCAs: pool, ServerName: "example.com"})
	done := make(chan error, 1)
	go func() { done <- srv.Handshake() }()
	if err := cli.Handshake(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	return srv, sc, cli
}

// A tunnel's end over TLS holds its socket no longer than its bound
// when the client reads nothing and the send buffer is full to the byte
// (the gateway's last writes were small, as an SSH connection's last
// packets are): the close_notify before the FIN finds no room and waits
// only until the bound. crypto/tls gives that write a deadline of its
// own, 5 s from its start, and its Close waits for the write: the socket
// stayed open 5 s past the bound (and a shutdown with it). The bound
// here is 100 ms; the socket must be closed well before the TLS
// library's 5 s: at most 3 s after Close.
func TestLingerTLSCloseNotifyBounded(t *testing.T) {
	srv, tcp, cli := tlsPair(t)
	_ = cli // reads nothing, and never closes
	// Fill the buffers: bulk, then single bytes until none fits. Below
	// TLS: what the client never reads need not be records.
	for _, chunk := range [][]byte{bytes.Repeat([]byte{'o'}, 64<<10), bytes.Repeat([]byte{'o'}, 24)} {
		_ = tcp.SetWriteDeadline(time.Now().Add(300 * time.Millisecond))
		for {
			if _, err := tcp.Write(chunk); err != nil {
				break
			}
		}
	}
	_ = tcp.SetWriteDeadline(time.Time{})
	l, done := tunnel.NewLingerConn(srv, 100*time.Millisecond)
	start := time.Now()
	l.Close()
	select {
	case <-done:
		t.Logf("closed %v after Close", time.Since(start))
	case <-time.After(3 * time.Second):
		t.Fatal("the socket is still open 3 s after Close (bound: 100 ms): its TLS close_notify holds it")
		<-done
	}
}

// A deadline set on a tunnel's connection after its Close (the hijack
// clears the server's deadlines once it has tracked the connection, and
// a shutdown may close it in between) does not undo the linger's bound:
// a client that neither sends nor closes does not hold the socket, the
// linger's goroutine, nor the shutdown that waits for it. (The linger
// read with the deadline it had set on the socket, which the later
// SetDeadline cleared: it waited for the client's end for ever.)
func TestLingerDeadlineAfterClose(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close() // silent: it neither sends nor closes until the end
	sc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	l, done := tunnel.NewLingerConn(sc, 100*time.Millisecond)
	l.Close()
	// However late the linger sets its deadlines, a deadline set after
	// Close comes after them.
	give := time.After(30 * time.Second)
	for {
		_ = l.SetDeadline(time.Time{})
		select {
		case <-done:
			return
		case <-give:
			t.Fatal("the linger still holds the socket 30 s after Close (bound: 100 ms): a deadline set after Close cleared its own")
		case <-time.After(time.Millisecond):
		}
	}
}
