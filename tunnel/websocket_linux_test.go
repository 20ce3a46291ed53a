package tunnel

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// wsPair is a WebSocket tunnel's two ends as the proxy (Dialer) and the
// gateway (Server.upgrade) make them, over loopback TCP.
func wsPair(t *testing.T) (*wsClientConn, *wsConn) {
	t.Helper()
	s := NewServer(nil, nil, nil, slog.New(slog.DiscardHandler))
	got := make(chan *wsConn, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, _ := s.upgrade(w, r, "sbx-test")
		got <- conn.(*wsConn)
	}))
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := (&Dialer{APIURL: srv.URL, Transport: TransportWebSocket}).Dial(ctx, "sbx-test")
	if err != nil {
		t.Fatal(err)
	}
	sc := <-got
	t.Cleanup(func() { c.Close(); s.untrack(sc) })
	return c.(*wsClientConn), sc
}

// corkOf is the socket's TCP_CORK, or -1 if it cannot be read.
func corkOf(rc syscall.RawConn) int {
	v, gerr := -1, error(nil)
	if err := rc.Control(func(fd uintptr) { v, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_CORK) }); err != nil || gerr != nil {
		return -1
	}
	return v
}

// spyWriter records the socket's TCP_CORK while each write runs.
type spyWriter struct {
	w     io.Writer
	rc    syscall.RawConn
	corks []int
}

func (s *spyWriter) Write(p []byte) (int, error) {
	s.corks = append(s.corks, corkOf(s.rc))
	return s.w.Write(p)
}

// countConn counts the writes that reach it.
type countConn struct {
	net.Conn
	writes int
}

func (c *countConn) Write(p []byte) (int, error) {
	c.writes++
	return c.Conn.Write(p)
}

// A large message, which the library writes 4 KiB at a time, leaves the
// client in one write(2) (gathered under the library), and the gateway
// with TCP_CORK set (full segments), uncorked once it is written; a small
// one is neither held nor corked. The bytes arrive intact, both ways.
func TestWebSocketLargeWritesGathered(t *testing.T) {
	c, s := wsPair(t)
	if c.under == nil || s.sock == nil {
		t.Fatalf("no connection under the WebSocket: client %v, gateway %v", c.under, s.sock)
	}
	msg := func(size int) []byte {
		b := make([]byte, size)
		for i := range b {
			b[i] = byte(i * 7)
		}
		return b
	}
	// Client to gateway: one write of the whole frame.
	counter := &countConn{Conn: c.under.Conn}
	c.under.Conn = counter
	for _, size := range []int{100, 256 << 10} {
		counter.writes = 0
		want := msg(size)
		done := make(chan error, 1)
		go func() {
			_, err := c.Write(want)
			done <- err
		}()
		got := make([]byte, size)
		if _, err := io.ReadFull(s, got); err != nil || string(got) != string(want) {
			t.Fatalf("client to gateway, %d bytes: read %v", size, err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if counter.writes != 1 {
			t.Errorf("client to gateway, %d bytes: %d writes to the socket, want 1", size, counter.writes)
		}
	}
	// Gateway to client: corked while the frame is written.
	for _, size := range []int{100, 256 << 10} {
		spy := &spyWriter{w: s.Conn, rc: s.sock}
		want := msg(size)
		done := make(chan error, 1)
		go func() {
			_, err := corkedWrite(s.sock, spy, want)
			done <- err
		}()
		got := make([]byte, size)
		if _, err := io.ReadFull(c, got); err != nil || string(got) != string(want) {
			t.Fatalf("gateway to client, %d bytes: read %v", size, err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		wantCork := 0
		if size >= corkMin {
			wantCork = 1
		}
		if len(spy.corks) != 1 || spy.corks[0] != wantCork || corkOf(s.sock) != 0 {
			t.Errorf("gateway to client, %d bytes: TCP_CORK %v during the write (want %d), %d after", size, spy.corks, wantCork, corkOf(s.sock))
		}
	}
}

// The gateway's end tells the SSH server's read-ahead whether a read would
// wait: not while the client sends nothing, yes once bytes are in the
// socket or in the library's buffer.
func TestWebSocketReadReady(t *testing.T) {
	c, s := wsPair(t)
	if s.ReadReady() {
		t.Fatal("ready before the client sent anything")
	}
	if _, err := c.Write(make([]byte, 64<<10)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !s.ReadReady() {
		if time.Now().After(deadline) {
			t.Fatal("not ready after the client sent 64 KiB")
		}
		time.Sleep(time.Millisecond)
	}
	buf := make([]byte, 100)
	if _, err := io.ReadFull(s, buf); err != nil {
		t.Fatal(err)
	}
	if !s.ReadReady() {
		t.Error("not ready with most of the message still unread")
	}
	if _, err := io.ReadFull(s, make([]byte, 64<<10-100)); err != nil {
		t.Fatal(err)
	}
	if s.ReadReady() {
		t.Error("ready after the whole message was read")
	}
	var _ net.Conn = s
}
