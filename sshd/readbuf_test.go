package sshd

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"testing"

	"go.uber.org/goleak"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/internal/metrics"
)

// TestReadAheadStream reads a stream the way x/crypto/ssh's transport
// does (a 4 KiB bufio.Reader, then packet-sized ReadFulls) through
// readAhead, over a source that sends bursts and quiet spells, and checks
// every byte and the source's final error.
func TestReadAheadStream(t *testing.T) {
	data := make([]byte, 6<<20)
	for i := range data {
		data[i] = byte(rand.Uint32())
	}
	wantErr := errors.New("tunnel closed")
	src := &chunkReader{data: data, sizes: []int{copyBufMax, copyBufMax, 100, 4 << 10, 7, copyBufMax, 33 << 10, 1}, err: wantErr}
	pool := &bufPool{}
	ra := &readAhead{src: src, pool: pool, ready: func() bool { return true }} // in memory: always ready
	br := bufio.NewReader(ra)                                                  // the transport's: 4 KiB
	var got bytes.Buffer
	pkt := make([]byte, 32<<10)
	var err error
	for i := 0; ; i++ {
		n := []int{4, 32 << 10, 13, 32<<10 - 4, 4096}[i%5]
		var m int
		m, err = io.ReadFull(br, pkt[:n])
		got.Write(pkt[:m])
		if err != nil {
			break
		}
	}
	if !errors.Is(err, wantErr) {
		t.Fatalf("read ended with %v, want %v", err, wantErr)
	}
	if _, err := br.Read(pkt); !errors.Is(err, wantErr) {
		t.Fatalf("next read: %v, want %v", err, wantErr)
	}
	if !bytes.Equal(got.Bytes(), data) {
		t.Fatalf("got %d bytes, want %d, or they differ", got.Len(), len(data))
	}
	if ra.big != nil {
		t.Fatal("buffer still held after the stream ended")
	}
}

// TestReadAheadOnlyWhileFull: reads that do not fill the caller's buffer
// go straight to it; a full one makes the next read a large one into a
// pooled buffer, which goes back once served.
func TestReadAheadOnlyWhileFull(t *testing.T) {
	data := make([]byte, 1<<20)
	src := &chunkReader{data: data, sizes: []int{100, 4 << 10, copyBufMax, 10}}
	ra := &readAhead{src: src, pool: &bufPool{}, ready: func() bool { return true }}
	p := make([]byte, 4<<10)

	if n, _ := ra.Read(p); n != 100 || ra.ahead || ra.big != nil {
		t.Fatalf("short read: n=%d ahead=%v big=%v", n, ra.ahead, ra.big != nil)
	}
	if n, _ := ra.Read(p); n != 4<<10 || !ra.ahead || ra.big != nil {
		t.Fatalf("full read: n=%d ahead=%v big=%v", n, ra.ahead, ra.big != nil)
	}
	// The source hands copyBufMax at once: 4 KiB to the caller, the rest kept.
	if n, _ := ra.Read(p); n != 4<<10 || ra.big == nil || ra.w-ra.r != copyBufMax-4<<10 {
		t.Fatalf("read ahead: n=%d big=%v buffered=%d", n, ra.big != nil, ra.w-ra.r)
	}
	large := make([]byte, copyBufMax)
	if n, _ := ra.Read(large); n != copyBufMax-4<<10 || ra.big != nil {
		t.Fatalf("drain: n=%d big=%v", n, ra.big != nil)
	}
	// Quiet again: the 10-byte read goes straight into the caller's buffer.
	if n, _ := ra.Read(p); n != 10 || ra.ahead || ra.big != nil {
		t.Fatalf("quiet read: n=%d ahead=%v big=%v", n, ra.ahead, ra.big != nil)
	}
}

// lenConn is a TCP connection that tells the length of each Read's buffer
// as the Read starts.
type lenConn struct {
	*net.TCPConn
	lens chan int
}

func (c *lenConn) Read(p []byte) (int, error) {
	c.lens <- len(p)
	return c.TCPConn.Read(p)
}

// TestReadAheadIdleAfterBurstHoldsNoBuffer: over a real TCP connection, a
// burst that ends exactly with a full read (read-ahead turned on) and
// then silence: the next read blocks in the caller's buffer, not in a
// pooled one. Then a burst that is ready is read ahead.
func TestReadAheadIdleAfterBurstHoldsNoBuffer(t *testing.T) {
	defer goleak.VerifyNone(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peer, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	conn := &lenConn{TCPConn: c.(*net.TCPConn), lens: make(chan int, 1)}
	ra := &readAhead{src: conn, pool: &bufPool{}}
	p := make([]byte, 4<<10)
	for !ra.ahead { // a burst ending exactly with a full read
		if _, err := peer.Write(p); err != nil {
			t.Fatal(err)
		}
		for got := 0; got < len(p) && !ra.ahead; {
			n, err := ra.Read(p[:len(p)-got])
			<-conn.lens
			if err != nil {
				t.Fatal(err)
			}
			got += n
		}
	}
	// Silence: nothing is on the socket. The read must block in p.
	done := make(chan int)
	go func() {
		n, _ := ra.Read(p)
		done <- n
	}()
	if l := <-conn.lens; l != len(p) {
		t.Fatalf("idle read blocks with a %d-byte buffer, want the caller's %d", l, len(p))
	}
	if _, err := peer.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if n := <-done; n != 1 || ra.big != nil {
		t.Fatalf("read %d, big %v", n, ra.big != nil)
	}
	// Data ready after a full read: the next read is a large one.
	ra.ahead = true
	if _, err := peer.Write(make([]byte, 64<<10)); err != nil {
		t.Fatal(err)
	}
	for ra.ready == nil || !ra.ready() {
		ra.ready = readyOf(conn) // wait for the bytes to arrive: a probe, not a timer
	}
	go func() { ra.Read(p); close(done) }()
	if l := <-conn.lens; l != copyBufMax {
		t.Fatalf("ready read with a %d-byte buffer, want %d", l, copyBufMax)
	}
	<-done
}

// availConn is a tunnel that says itself how much a read returns
// without waiting (as a WebSocket tunnel does), with no socket the
// read-ahead could probe; it tells the length of each Read's buffer.
type availConn struct {
	net.Conn
	avail int
	lens  []int
}

func (c *availConn) ReadAvailable() int { return c.avail }

func (c *availConn) Read(p []byte) (int, error) {
	c.lens = append(c.lens, len(p))
	return c.Conn.Read(p)
}

// TestReadyOfAsksTheTunnel: under the gateway's byte counters, a layer
// with ReadAvailable answers the read-ahead's probe, rather than a socket
// (which a WebSocket tunnel's bytes may not be in: its library buffers
// them, and the socket also carries frame headers).
func TestReadyOfAsksTheTunnel(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	rc := &availConn{Conn: a}
	wrapped, closed := audit.Tunnel(context.Background(), audit.Discard, rc, "sbx-test")
	defer closed()
	wrapped, done := metrics.New().Tunnel((&gateway.Session{}).CountTunnel(wrapped))
	defer done()
	r := readAvailableOf(wrapped)
	if r == nil || r.ReadAvailable() != 0 {
		t.Fatal("the tunnel's ReadAvailable is not found under its wrappers")
	}
	rc.avail = 5000
	if r.ReadAvailable() != 5000 {
		t.Fatal("not the tunnel's answer")
	}
	if readAvailableOf(a) != nil {
		t.Error("a pipe has no ReadAvailable")
	}
}

// TestReadAheadAvailable: over a tunnel that says how much a read returns
// without waiting (a WebSocket: a burst, then a frame whose payload
// stalls), the read-ahead takes a pooled buffer only for more than the
// caller asks, and reads no more than that into it: it never waits for
// the client with a pooled buffer.
func TestReadAheadAvailable(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go func() { _, _ = b.Write(make([]byte, 64<<10)) }()
	src := &availConn{Conn: a}
	ra := &readAhead{src: src, pool: &bufPool{}}
	p := make([]byte, 4<<10)
	for i, avail := range []int{20 << 10, 1 << 10, 0, copyBufMax * 2} {
		ra.ahead, src.avail, src.lens = true, avail, nil
		if _, err := io.ReadFull(ra, p); err != nil {
			t.Fatal(err)
		}
		want := min(avail, copyBufMax)
		if avail <= len(p) {
			want = len(p) // the caller's buffer
		}
		if len(src.lens) == 0 || src.lens[0] != want {
			t.Errorf("read %d, %d bytes available: the first read asked %v, want %d", i, avail, src.lens, want)
		}
		for ra.big != nil { // serve what was read ahead
			if _, err := ra.Read(p); err != nil {
				t.Fatal(err)
			}
		}
	}
}
