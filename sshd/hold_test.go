package sshd

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"
)

// countingConn counts the writes that reach the connection under it.
type countingConn struct {
	net.Conn
	mu     sync.Mutex
	writes [][]byte
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.writes = append(c.writes, append([]byte(nil), p...))
	c.mu.Unlock()
	return c.Conn.Write(p)
}

func (c *countingConn) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.writes)
}

// TestHold: the packets written while a tunnel is held (a channel's
// exit-status, EOF and close) reach the socket in one write when it is
// released, in order, and the peer gets every byte; past maxHeld what is
// held goes out at once; writes outside a hold go straight through; a nil
// connection's hold does nothing.
func TestHold(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan []byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		b, _ := io.ReadAll(c)
		got <- b
	}()
	tc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	cc := &countingConn{Conn: tc}
	// No hold ends on its own here, however slow the machine.
	bc := &boundConn{Conn: cc, holdMax: time.Hour}
	var want bytes.Buffer
	write := func(s string) {
		t.Helper()
		if n, err := bc.Write([]byte(s)); err != nil || n != len(s) {
			t.Fatalf("write %q: %d, %v", s, n, err)
		}
		want.WriteString(s)
	}

	write("before;")
	if cc.count() != 1 {
		t.Fatalf("%d writes outside a hold, want 1", cc.count())
	}
	release := bc.hold()
	write("exit-status;")
	write("eof;")
	write("close;")
	if cc.count() != 1 {
		t.Fatalf("%d writes reached the socket during the hold, want none", cc.count()-1)
	}
	release()
	if cc.count() != 2 || string(cc.writes[1]) != "exit-status;eof;close;" {
		t.Fatalf("release wrote %q, want the three packets in one write", cc.writes[1:])
	}

	// Past maxHeld, what is held and the write that overflows go out.
	release = bc.hold()
	write("small;")
	big := string(bytes.Repeat([]byte{'x'}, maxHeld))
	write(big)
	if cc.count() != 4 || string(cc.writes[2]) != "small;" || len(cc.writes[3]) != maxHeld {
		t.Fatalf("overflow: %d writes, want the held one and the big one", cc.count()-2)
	}
	write("after;")
	release()
	if cc.count() != 5 || string(cc.writes[4]) != "after;" {
		t.Fatalf("release after an overflow: %d writes", cc.count())
	}
	release() // a second call has nothing to write
	if cc.count() != 5 {
		t.Fatal("a second release wrote again")
	}
	// Two channels' ends at once: the first release leaves the second's
	// hold on; the second lets both go.
	first := bc.hold()
	write("a-end;")
	second := bc.hold()
	write("b-end;")
	first()
	if cc.count() != 5 {
		t.Fatal("the first of two holds let the packets go")
	}
	second()
	if cc.count() != 6 || string(cc.writes[5]) != "a-end;b-end;" {
		t.Fatalf("the second release: %d writes, want the two ends in one", cc.count()-5)
	}
	tc.Close()
	if b := <-got; !bytes.Equal(b, want.Bytes()) {
		t.Fatalf("peer got %d bytes, want %d in order", len(b), want.Len())
	}

	var none *boundConn
	none.hold()()
}

// TestHoldKeyExchange: a hold that a key exchange meets does not stall the
// connection. While a re-key is under way, x/crypto/ssh queues a
// connection's packets (64 at most), then makes a writer wait for the new
// keys, which need the server's key exchange packets to reach the client:
// with those held, a sendEnd that waited there never released its hold,
// and every channel of the connection stopped for good. The hold lets
// them go after a while, as TCP_CORK did.
func TestHoldKeyExchange(t *testing.T) {
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := gossh.NewSignerFromKey(key)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type served struct {
		bc   *boundConn
		conn *gossh.ServerConn
		ch   gossh.Channel
		err  error
	}
	srvc := make(chan served, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			srvc <- served{err: err}
			return
		}
		bc := &boundConn{Conn: c}
		bc.in = readAhead{src: c, pool: &bufPool{}}
		// The server re-keys every 256 bytes it writes.
		cfg := &gossh.ServerConfig{NoClientAuth: true, Config: gossh.Config{RekeyThreshold: 256}}
		cfg.AddHostKey(signer)
		conn, chans, reqs, err := gossh.NewServerConn(bc, cfg)
		if err != nil {
			c.Close()
			srvc <- served{err: err}
			return
		}
		go gossh.DiscardRequests(reqs)
		nc := <-chans
		ch, creqs, err := nc.Accept()
		if err == nil {
			go gossh.DiscardRequests(creqs)
		}
		srvc <- served{bc: bc, conn: conn, ch: ch, err: err}
		for nc := range chans {
			_ = nc.Reject(gossh.Prohibited, "one channel")
		}
	}()
	// The client reaches the server through a relay whose way to the
	// server can be stopped: the client's key exchange packets then wait
	// in it, and the server's exchange stays under way.
	tc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	cliEnd, relEnd := net.Pipe()
	defer cliEnd.Close()
	defer relEnd.Close()
	go func() { _, _ = io.Copy(relEnd, tc) }() // to the client
	var (
		mu      sync.Mutex
		stopped bool
		waiting []byte
	)
	resume := make(chan struct{})
	go func() { // to the server
		b := make([]byte, 64<<10)
		for {
			n, err := relEnd.Read(b)
			if err != nil {
				return
			}
			mu.Lock() // held over the write: what waited goes first
			if stopped {
				waiting = append(waiting, b[:n]...)
			} else {
				_, err = tc.Write(b[:n])
			}
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	go func() {
		<-resume
		mu.Lock()
		defer mu.Unlock()
		stopped = false
		_, _ = tc.Write(waiting)
		waiting = nil
	}()
	cc, chans, reqs, err := gossh.NewClientConn(cliEnd, "relay", &gossh.ClientConfig{
		User: "u", HostKeyCallback: gossh.InsecureIgnoreHostKey(), Timeout: 10 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	client := gossh.NewClient(cc, chans, reqs)
	defer client.Close()
	cch, creqs, err := client.OpenChannel("session", nil)
	if err != nil {
		t.Fatal(err)
	}
	go gossh.DiscardRequests(creqs)
	go func() { _, _ = io.Copy(io.Discard, cch) }()
	s := <-srvc
	if s.err != nil {
		t.Fatal(s.err)
	}
	defer s.conn.Close()

	// A re-key, its answer kept in the relay: the server writes until
	// the client answers its KEXINIT (the client writes nothing else).
	mu.Lock()
	stopped = true
	mu.Unlock()
	answered := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(waiting) > 0
	}
	for deadline := time.Now().Add(30 * time.Second); !answered(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the server did not re-key")
		}
		if _, err := s.ch.SendRequest("keepalive@openssh.com", false, nil); err != nil {
			t.Fatal(err)
		}
	}
	// The other channels' packets fill x/crypto's queue (64): the writer
	// that finds it full waits for the exchange's end.
	var written atomic.Int32
	go func() {
		for range 64 {
			if _, err := s.ch.SendRequest("keepalive@openssh.com", false, nil); err != nil {
				return
			}
			written.Add(1)
		}
	}()
	for last, still := int32(-1), 0; still < 10; time.Sleep(20 * time.Millisecond) {
		if n := written.Load(); n == 64 || n != last {
			last, still = n, 0
			if n == 64 {
				break
			}
		} else {
			still++
		}
	}

	// The end of this channel, as sendEnd sends it, under a hold; the
	// client's answer reaches the server meanwhile.
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer s.bc.hold()()
		_, _ = s.ch.SendRequest("exit-status", false, gossh.Marshal(struct{ Status uint32 }{0}))
		_ = s.ch.CloseWrite()
		_ = s.ch.Close()
	}()
	close(resume)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		s.conn.Close() // lets the writers go
		<-done
		t.Fatal("a hold met a key exchange: the connection stalled")
	}
}
