package sshd

import (
	"bytes"
	"io"
	"net"
	"sync"
	"testing"
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
	bc := &boundConn{Conn: cc}
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
	tc.Close()
	if b := <-got; !bytes.Equal(b, want.Bytes()) {
		t.Fatalf("peer got %d bytes, want %d in order", len(b), want.Len())
	}

	var none *boundConn
	none.hold()()
}
