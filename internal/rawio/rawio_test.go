//go:build linux && (amd64 || arm64)

package rawio

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/tcptest"
)

// tcpPair is a TCP connection on loopback, both ends wrapped.
func tcpPair(t *testing.T) (a, b *Conn) {
	t.Helper()
	c, s := tcptest.Pair(t)
	wa, ok := Wrap(c).(*Conn)
	if !ok {
		t.Fatalf("Wrap(%T) = %T, want *Conn", c, Wrap(c))
	}
	wb, ok := Wrap(s).(*Conn)
	if !ok {
		t.Fatalf("Wrap(%T) = %T, want *Conn", s, Wrap(s))
	}
	return wa, wb
}

// Bulk data goes both ways at once, whole and in order, through sockets
// that fill up (each reader starts late), so that writes wait in the
// poller; the end reads as io.EOF.
func TestConnBothWays(t *testing.T) {
	a, b := tcpPair(t)
	up := make([]byte, 24<<20+7)
	down := make([]byte, 16<<20+3)
	_, _ = rand.Read(up)
	_, _ = rand.Read(down)
	send := func(c *Conn, p []byte) <-chan error {
		done := make(chan error, 1)
		go func() {
			n, err := c.Write(p)
			if err == nil && n != len(p) {
				err = io.ErrShortWrite
			}
			if err == nil {
				err = c.CloseWrite()
			}
			done <- err
		}()
		return done
	}
	recv := func(c *Conn) <-chan []byte {
		got := make(chan []byte, 1)
		go func() {
			time.Sleep(100 * time.Millisecond) // let the sender fill the socket
			var buf bytes.Buffer
			p := make([]byte, 100<<10)
			for {
				n, err := c.Read(p)
				buf.Write(p[:n])
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Errorf("read: %v", err)
					break
				}
			}
			got <- buf.Bytes()
		}()
		return got
	}
	sa, sb := send(a, up), send(b, down)
	ra, rb := recv(a), recv(b)
	if err := <-sa; err != nil {
		t.Fatalf("write up: %v", err)
	}
	if err := <-sb; err != nil {
		t.Fatalf("write down: %v", err)
	}
	if got := <-rb; !bytes.Equal(got, up) {
		t.Errorf("up: got %d bytes, want the %d sent (equal prefix %v)", len(got), len(up), bytes.HasPrefix(up, got))
	}
	if got := <-ra; !bytes.Equal(got, down) {
		t.Errorf("down: got %d bytes, want the %d sent", len(got), len(down))
	}
}

// Errors read as a *net.TCPConn's do: a deadline, a closed connection, a
// peer gone.
func TestConnErrors(t *testing.T) {
	a, b := tcpPair(t)
	if n, err := a.Read(nil); n != 0 || err != nil {
		t.Errorf("Read(nil) = %d, %v; want 0, nil", n, err)
	}
	_ = a.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	_, err := a.Read(make([]byte, 10))
	var oe *net.OpError
	if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &oe) || oe.Op != "read" {
		t.Errorf("read past the deadline: %v (%T), want a read *net.OpError for os.ErrDeadlineExceeded", err, err)
	}
	_ = a.SetReadDeadline(time.Time{})

	// A read waiting in the poller ends when the connection is closed.
	done := make(chan error, 1)
	go func() {
		_, err := b.Read(make([]byte, 10))
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	b.Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("read when closed: %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a read waiting for data did not end when its connection was closed")
	}

	// Writing to a peer that has gone fails (EPIPE or ECONNRESET) with
	// the errno inside a write *net.OpError.
	p := make([]byte, 1<<20)
	for i := 0; ; i++ {
		_, err = a.Write(p)
		if err != nil || i > 100 {
			break
		}
	}
	var errno syscall.Errno
	if !errors.As(err, &oe) || oe.Op != "write" || !errors.As(err, &errno) || (errno != syscall.EPIPE && errno != syscall.ECONNRESET) {
		t.Errorf("write to a closed peer: %v, want a write *net.OpError with EPIPE or ECONNRESET", err)
	}
}

// Writev puts more slices than one writev(2) takes, of every size
// (empty ones too), into a small pipe that a slow reader drains: all of
// it arrives, in order, whether the pipe is non-blocking (ordinary calls
// that wait in the poller: a pipe never gets raw ones) or was made
// blocking.
func TestWritevPipe(t *testing.T) {
	t.Run("nonblocking", func(t *testing.T) { testWritevPipe(t, false) })
	t.Run("blocking", func(t *testing.T) { testWritevPipe(t, true) })
}

func testWritevPipe(t *testing.T, blocking bool) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	rc, err := w.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	if !NonBlocking(rc) {
		t.Fatal("NonBlocking(os.Pipe's writer) = false, want true")
	}
	_ = rc.Control(func(fd uintptr) { _, err = unix.FcntlInt(fd, unix.F_SETPIPE_SZ, 4096) })
	if err != nil {
		t.Fatal(err)
	}
	if blocking {
		_ = w.Fd() // turns the descriptor blocking: Writev must see it
		if NonBlocking(rc) {
			t.Fatal("NonBlocking after Fd() = true")
		}
	}
	var want []byte
	var bufs [][]byte
	for i := range 3000 {
		b := make([]byte, i%97) // 0 to 96 bytes
		_, _ = rand.Read(b)
		bufs = append(bufs, b)
		want = append(want, b...)
	}
	got := make(chan []byte, 1)
	go func() {
		var buf bytes.Buffer
		p := make([]byte, 1000)
		for {
			time.Sleep(time.Millisecond) // slower than the writer
			n, err := r.Read(p)
			buf.Write(p[:n])
			if err != nil {
				break
			}
		}
		got <- buf.Bytes()
	}()
	n, err := Writev(rc, bufs)
	if err != nil || n != len(want) {
		t.Fatalf("Writev = %d, %v; want %d, nil", n, err, len(want))
	}
	w.Close()
	if g := <-got; !bytes.Equal(g, want) {
		t.Fatalf("the pipe gave %d bytes, want the %d written, in order", len(g), len(want))
	}
}

// NonBlocking tells a blocking descriptor (which raw calls must never
// be used on) from a non-blocking one; Ready sees data waiting.
func TestNonBlockingAndReady(t *testing.T) {
	var fds [2]int
	if err := unix.Pipe(fds[:]); err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fds[1]), "blocking") // stays blocking: not pollable
	defer f.Close()
	defer unix.Close(fds[0])
	rc, err := f.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	if NonBlocking(rc) {
		t.Error("NonBlocking(a blocking pipe) = true")
	}

	a, b := tcpPair(t)
	brc, _ := b.SyscallConn()
	if Ready(brc) {
		t.Error("Ready with nothing sent = true")
	}
	if _, err := a.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !Ready(brc) {
		if time.Now().After(deadline) {
			t.Fatal("Ready never saw the byte sent")
		}
		time.Sleep(time.Millisecond)
	}
	p := make([]byte, 4)
	if n, err := b.Read(p); n != 1 || err != nil || p[0] != 'x' {
		t.Errorf("read after Ready = %d, %v (%q); want the byte, whole (Ready must only peek)", n, err, p[:n])
	}
}

// Wrap leaves what is not a *net.TCPConn as it is.
func TestWrapOthers(t *testing.T) {
	c1, c2 := net.Pipe()
	defer c1.Close()
	defer c2.Close()
	if got := Wrap(c1); got != c1 {
		t.Errorf("Wrap(net.Pipe) = %T, want it as it is", got)
	}
}

// Raw calls are made on non-blocking sockets only: never on a pipe (its
// peer can hold the pipe's mutex), nor on a blocking descriptor.
func TestRawSafe(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	rc, _ := w.SyscallConn()
	_ = rc.Control(func(fd uintptr) {
		if !nonBlocking(fd) {
			t.Error("os.Pipe's writer is not non-blocking: the test checks nothing")
		}
		if rawSafe(fd) {
			t.Error("rawSafe(a non-blocking pipe) = true, want false")
		}
	})
	a, _ := tcpPair(t)
	arc, _ := a.SyscallConn()
	_ = arc.Control(func(fd uintptr) {
		if !rawSafe(fd) {
			t.Error("rawSafe(a non-blocking TCP socket) = false, want true")
		}
	})
	f, err := a.File() // a duplicate, made blocking here
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.SetNonblock(int(f.Fd()), false); err != nil {
		t.Fatal(err)
	}
	// O_NONBLOCK belongs to the open file, which the duplicate shares.
	_ = arc.Control(func(fd uintptr) {
		if rawSafe(fd) {
			t.Error("rawSafe(a socket in blocking mode) = true, want false")
		}
	})
	_ = unix.SetNonblock(int(f.Fd()), true)
}

// A write or read on a closed Conn fails as a *net.TCPConn's does: a
// *net.OpError whose Err is net.ErrClosed itself.
func TestConnClosed(t *testing.T) {
	a, _ := tcpPair(t)
	a.Close()
	for op, f := range map[string]func() error{
		"write": func() error { _, err := a.Write([]byte("x")); return err },
		"read":  func() error { _, err := a.Read(make([]byte, 1)); return err },
	} {
		err := f()
		var oe *net.OpError
		if !errors.As(err, &oe) || oe.Op != op || oe.Err != net.ErrClosed {
			t.Errorf("%s on a closed Conn: %v (%#v), want a %s *net.OpError with Err net.ErrClosed", op, err, err, op)
		}
	}
}
