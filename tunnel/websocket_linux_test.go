package tunnel

import (
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
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
// client in one write(2) and the gateway in one writev(2) (gathered
// under the library); a small one is not held. The bytes arrive intact,
// both ways.
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
	// Gateway to client: one writev(2) of the whole frame (gathered
	// under the library), a small one straight through.
	if s.gather == nil {
		t.Fatal("the gateway's WebSocket writes through no gatherConn")
	}
	for _, size := range []int{100, 256 << 10} {
		before := s.gather.flushes
		want := msg(size)
		done := make(chan error, 1)
		go func() {
			_, err := s.Write(want)
			done <- err
		}()
		got := make([]byte, size)
		if _, err := io.ReadFull(c, got); err != nil || string(got) != string(want) {
			t.Fatalf("gateway to client, %d bytes: read %v", size, err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		wantFlushes := 0
		if size >= gatherMin {
			wantFlushes = 1
		}
		if n := s.gather.flushes - before; n != wantFlushes {
			t.Errorf("gateway to client, %d bytes: %d gathered writes, want %d", size, n, wantFlushes)
		}
	}
}

// waitAvailable waits until s's ReadAvailable says want.
func waitAvailable(t *testing.T, s *wsConn, want int, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.ReadAvailable() != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s: ReadAvailable says %d, want %d", what, s.ReadAvailable(), want)
		}
		time.Sleep(time.Millisecond)
	}
}

// The gateway's end tells the SSH server's read-ahead how much a read
// returns without waiting: nothing while the client sends nothing; the
// rest of a message once it is in; then a frame whose payload stalls
// half-way (its header says more than is sent): what is in of it, and
// a read of that much returns at once; nothing once it is read, until
// the rest comes.
func TestWebSocketReadAvailable(t *testing.T) {
	c, s := wsPair(t)
	if n := s.ReadAvailable(); n != 0 {
		t.Fatalf("%d available before the client sent anything", n)
	}
	if _, err := c.Write(make([]byte, 64<<10)); err != nil {
		t.Fatal(err)
	}
	waitAvailable(t, s, 64<<10, "a 64 KiB message sent")
	if _, err := io.ReadFull(s, make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
	if n := s.ReadAvailable(); n != 64<<10-100 {
		t.Errorf("%d available with 100 bytes of 64 KiB read, want the rest", n)
	}
	if _, err := io.ReadFull(s, make([]byte, 64<<10-100)); err != nil {
		t.Fatal(err)
	}
	if n := s.ReadAvailable(); n != 0 {
		t.Errorf("%d available after the whole message was read", n)
	}
	// A binary frame (masked with a zero key) of 60,000 bytes, of which
	// 1,000 are sent, then a ping the library answers, in a frame
	// header: only what is in of the payload is available.
	const size, sent = 60000, 1000
	hdr := []byte{0x82, 0x80 | 126, size >> 8, size & 0xff, 0, 0, 0, 0}
	if _, err := c.under.Conn.Write(append(hdr, make([]byte, sent)...)); err != nil {
		t.Fatal(err)
	}
	waitAvailable(t, s, sent, "a stalled frame")
	read := make(chan error, 1)
	go func() {
		_, err := io.ReadFull(s, make([]byte, sent))
		read <- err
	}()
	select {
	case err := <-read:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a read of what ReadAvailable said waits for the client")
	}
	if n := s.ReadAvailable(); n != 0 {
		t.Errorf("%d available with the rest of the frame not sent", n)
	}
	if _, err := c.under.Conn.Write(make([]byte, size-sent)); err != nil {
		t.Fatal(err)
	}
	waitAvailable(t, s, size-sent, "the frame's rest sent")
	if _, err := io.ReadFull(s, make([]byte, size-sent)); err != nil {
		t.Fatal(err)
	}
	// A ping (which the library answers itself) before a message, both
	// in the library's buffer: the message's bytes are available past it.
	ping := []byte{0x89, 0x80 | 4, 0, 0, 0, 0, 'p', 'i', 'n', 'g'}
	msg := []byte{0x82, 0x80 | 5, 0, 0, 0, 0, 'h', 'e', 'l', 'l', 'o'}
	if _, err := c.under.Conn.Write(append(append(msg, ping...), msg...)); err != nil {
		t.Fatal(err)
	}
	waitAvailable(t, s, 5, "a 5-byte message")
	got := make([]byte, 5)
	if _, err := io.ReadFull(s, got); err != nil || string(got) != "hello" {
		t.Fatalf("read %q %v", got, err)
	}
	if n := s.ReadAvailable(); n != 5 {
		t.Errorf("%d available past a ping, want the next message's 5", n)
	}
	if _, err := io.ReadFull(s, got); err != nil || string(got) != "hello" {
		t.Fatalf("read %q %v", got, err)
	}
	var _ net.Conn = s
}

// ReadAvailable, asked by the reading goroutine, and Close, whose close
// handshake reads the library's buffer in another goroutine, do not race
// (go test -race).
func TestWebSocketReadAvailableClose(t *testing.T) {
	c, s := wsPair(t)
	if _, err := c.Write(make([]byte, 1000)); err != nil {
		t.Fatal(err)
	}
	waitAvailable(t, s, 1000, "a message sent")
	go func() { _, _ = io.Copy(io.Discard, c) }() // the client answers the close
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
				s.ReadAvailable()
			}
		}
	}()
	s.Close()
	close(stop)
	<-done
	if n := s.ReadAvailable(); n != 0 {
		t.Errorf("%d available after Close", n)
	}
}

// A client's write deadline holds for a large frame, which is gathered
// below the library and written after the library's write returned: a
// gateway that reads nothing makes the write fail at the deadline, not
// block for ever.
func TestWebSocketClientWriteDeadline(t *testing.T) {
	c, _ := wsPair(t)
	if err := c.SetWriteDeadline(time.Now().Add(500 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, 256<<10)
		for {
			if _, err := c.Write(buf); err != nil {
				done <- err
				return
			}
		}
	}()
	select {
	case err := <-done:
		t.Logf("the write failed: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("a write to a gateway that reads nothing is still blocked, long past its deadline")
	}
}

// A WebSocket over plain http hands its socket over at the start of the
// gateway's first frame, even when that frame came in the same segment
// as the 101 answer (the HTTP client's buffered reader would have taken
// it): the handshake reads no byte past the answer's head. Once the
// socket is handed over, the library reads nothing and Close only closes
// it, and Write refuses; after a Read, or over TLS, nothing is handed
// over. The same with a head cut in many segments, far larger than any
// buffer on the way, or with bare LF line ends.
func TestWebSocketSocketHandOver(t *testing.T) {
	frame := []byte{0x82, 0x06, 'b', 'a', 'n', 'n', 'e', 'r'}
	after := make(chan int64, 2) // bytes the server got after the handshake, to the client's close
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		h := sha1.Sum([]byte(r.Header.Get("Sec-WebSocket-Key") + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
		answer := "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " +
			base64.StdEncoding.EncodeToString(h[:]) + "\r\n\r\n"
		if strings.Contains(r.URL.Path, "sbx-hints") { // an informational answer first
			answer = "HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n" + answer
		}
		if strings.Contains(r.URL.Path, "sbx-bighead") { // a head far larger than any buffer on the way
			answer = strings.Replace(answer, "\r\n\r\n", "\r\n"+strings.Repeat("X-Big: "+strings.Repeat("a", 1000)+"\r\n", 100)+"\r\n", 1)
		}
		if strings.Contains(r.URL.Path, "-lf/") { // bare LF line ends, which Go's HTTP client reads as well
			answer = strings.ReplaceAll(answer, "\r\n", "\n")
		}
		if strings.Contains(r.URL.Path, "sbx-dribble") { // the head in many segments, "\r\n\r\n" cut apart
			for len(answer) > 3 {
				_, _ = conn.Write([]byte(answer[:3]))
				answer = answer[3:]
				time.Sleep(time.Millisecond)
			}
		}
		_, _ = conn.Write(append([]byte(answer), frame...)) // one write: one segment on loopback
		n, _ := io.Copy(io.Discard, brw)                    // until the client closes
		after <- n
	}))
	t.Cleanup(srv.Close)
	dial := func(id string) *wsClientConn {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := (&Dialer{APIURL: srv.URL, Transport: TransportWebSocket}).Dial(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*wsClientConn)
	}

	for _, id := range []string{"sbx-test", "sbx-hints", "sbx-bighead", "sbx-dribble", "sbx-lf", "sbx-hints-lf"} {
		c := dial(id)
		sock, ok := c.Socket()
		if !ok {
			t.Fatalf("%s: the socket of a plain http WebSocket was not handed over", id)
		}
		_ = sock.SetReadDeadline(time.Now().Add(10 * time.Second)) // bounds a failure only
		got := make([]byte, len(frame))
		if _, err := io.ReadFull(sock, got); err != nil || string(got) != string(frame) {
			t.Fatalf("%s: the handed-over socket starts with %x (%v), want the first frame %x", id, got, err, frame)
		}
		if _, ok := c.Socket(); ok {
			t.Fatalf("%s: the socket was handed over twice", id)
		}
		if n, err := c.Read(make([]byte, 8)); n != 0 || !errors.Is(err, net.ErrClosed) {
			t.Fatalf("%s: a Read after the hand-over: %d, %v; want net.ErrClosed", id, n, err)
		}
		// The caller is the socket's only writer: a frame of the library's
		// would land among its own.
		for _, size := range []int{10, 64 << 10} {
			if n, err := c.Write(make([]byte, size)); n != 0 || !errors.Is(err, net.ErrClosed) {
				t.Fatalf("%s: a Write of %d bytes after the hand-over: %d, %v; want net.ErrClosed", id, size, n, err)
			}
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if n := <-after; n != 0 {
			t.Fatalf("%s: Close after the hand-over sent %d bytes (a close frame through the library), want none", id, n)
		}
	}

	c := dial("sbx-test")
	if _, err := c.Read(make([]byte, 64)); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.Socket(); ok {
		t.Fatal("the socket was handed over after the library had read from it")
	}
	c.under.Conn.Close() // (the library's Close would wait for an answer to its close frame)
	<-after
}

// The gateway's write deadline holds for a large frame too, which is
// gathered below the library and written (writev) after the library's
// write returned: a client that reads nothing makes the write fail at
// the deadline, not block for ever.
func TestWebSocketGatewayWriteDeadline(t *testing.T) {
	_, s := wsPair(t)
	if s.gather == nil {
		t.Fatal("the gateway's WebSocket writes through no gatherConn")
	}
	for _, set := range []func(time.Time) error{s.SetWriteDeadline, s.SetDeadline} {
		if err := set(time.Now().Add(500 * time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			buf := make([]byte, 256<<10)
			for {
				if _, err := s.Write(buf); err != nil {
					done <- err
					return
				}
			}
		}()
		select {
		case err := <-done:
			t.Logf("the write failed: %v", err)
		case <-time.After(60 * time.Second):
			t.Fatal("a write to a client that reads nothing is still blocked, long past its deadline")
		}
	}
}

// Messages the gateway writes from several goroutines at once, large
// (gathered, some of their pieces by reference) and small (straight
// through, or gathered with another's frame), arrive whole and unmixed,
// each writer's in order, although the gathering buffers go back to
// their pool and are reused between them, and each writer clears its
// message once Write returned.
func TestWebSocketGatewayConcurrentWrites(t *testing.T) {
	c, s := wsPair(t)
	if s.gather == nil {
		t.Fatal("the gateway's WebSocket writes through no gatherConn")
	}
	const writers, perWriter = 4, 40
	sizes := []int{100, 5000, 70 << 10, 300 << 10}
	errs := make(chan error, writers)
	for w := range writers {
		go func() {
			for seq := range perWriter {
				size := sizes[(w+seq)%len(sizes)]
				m := make([]byte, 12+size)
				binary.BigEndian.PutUint32(m, uint32(w))
				binary.BigEndian.PutUint32(m[4:], uint32(seq))
				binary.BigEndian.PutUint32(m[8:], uint32(size))
				for i := range size {
					m[12+i] = byte(w*31 + seq + i)
				}
				if _, err := s.Write(m); err != nil {
					errs <- err
					return
				}
				clear(m) // the caller's buffer is its own again: nothing may still send it
			}
			errs <- nil
		}()
	}
	next := make([]int, writers)
	for range writers * perWriter {
		var h [12]byte
		if _, err := io.ReadFull(c, h[:]); err != nil {
			t.Fatal(err)
		}
		w, seq, size := int(binary.BigEndian.Uint32(h[:])), int(binary.BigEndian.Uint32(h[4:])), int(binary.BigEndian.Uint32(h[8:]))
		if w >= writers || seq != next[w] || size > 300<<10 {
			t.Fatalf("a message of writer %d, number %d, %d bytes: want writer < %d in order (next %v)", w, seq, size, writers, next)
		}
		next[w]++
		p := make([]byte, size)
		if _, err := io.ReadFull(c, p); err != nil {
			t.Fatal(err)
		}
		for i, b := range p {
			if b != byte(w*31+seq+i) {
				t.Fatalf("writer %d's message %d: byte %d is %d, want %d", w, seq, i, b, byte(w*31+seq+i))
			}
		}
	}
	for range writers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// A client's Close returns although the gateway stopped inside a frame
// (its write deadline passed half-way): the library's close handshake
// reads the rest of the frame first, with no deadline of its own.
func TestWebSocketClientCloseInsideFrame(t *testing.T) {
	c, s := wsPair(t)
	if c.under == nil {
		t.Fatal("the client's WebSocket has no connection under it")
	}
	// A binary frame's header announcing 1,000 bytes, and 10 of them.
	frame := append([]byte{0x82, 126, 0x03, 0xe8}, bytes.Repeat([]byte{'x'}, 10)...)
	if _, err := s.raw.Write(frame); err != nil {
		t.Fatal(err)
	}
	p := make([]byte, 10)
	if _, err := io.ReadFull(c, p); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- c.Close() }()
	select {
	case err := <-done:
		t.Logf("Close returned after %v: %v", time.Since(start).Round(time.Millisecond), err)
	case <-time.After(20 * time.Second):
		t.Fatal("Close is still blocked 20 s after a gateway stopped inside a frame")
	}
}
