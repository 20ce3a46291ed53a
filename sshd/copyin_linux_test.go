package sshd

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"
)

// channelPair returns the two ends of one session channel of a real SSH
// connection over loopback TCP (x/crypto both sides, AES-GCM): what the
// client writes to the first, the server reads from the second.
func channelPair(t *testing.T) (client, server gossh.Channel) {
	t.Helper()
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
	t.Cleanup(func() { ln.Close() })
	srvCh := make(chan gossh.Channel, 1)
	srvErr := make(chan error, 1)
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			srvErr <- err
			return
		}
		cfg := &gossh.ServerConfig{NoClientAuth: true}
		cfg.AddHostKey(signer)
		conn, chans, reqs, err := gossh.NewServerConn(nc, cfg)
		if err != nil {
			srvErr <- err
			return
		}
		t.Cleanup(func() { conn.Close() })
		go gossh.DiscardRequests(reqs)
		nch := <-chans
		ch, chReqs, err := nch.Accept()
		if err != nil {
			srvErr <- err
			return
		}
		go gossh.DiscardRequests(chReqs)
		srvCh <- ch
	}()
	cc, err := gossh.Dial("tcp", ln.Addr().String(), &gossh.ClientConfig{
		User:            "t",
		HostKeyCallback: gossh.InsecureIgnoreHostKey(),
		Config:          gossh.Config{Ciphers: []string{"aes128-gcm@openssh.com"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	ch, reqs, err := cc.OpenChannel("session", nil)
	if err != nil {
		t.Fatal(err)
	}
	go gossh.DiscardRequests(reqs)
	select {
	case s := <-srvCh:
		return ch, s
	case err := <-srvErr:
		t.Fatal(err)
	case <-time.After(10 * time.Second):
		t.Fatal("no channel")
	}
	return nil, nil
}

// lending counts the calls of a channel's ReadBuffers.
type lending struct {
	gossh.Channel
	calls atomic.Int64
}

func (l *lending) ReadBuffers(max int, write func([][]byte) (int, error)) (int, error) {
	l.calls.Add(1)
	return l.Channel.(bufferReader).ReadBuffers(max, write)
}

// TestCopyInLendsPackets sends more than a window's worth of data (so the
// window adjustments must flow) in uneven writes through a real SSH
// channel into an OS pipe far smaller than a batch (so writev writes
// short and waits for room), and checks that every byte arrives once, in
// order, that the tap saw each before the pipe did, and that the packets
// were lent (ReadBuffers), not copied.
func TestCopyInLendsPackets(t *testing.T) {
	client, server := channelPair(t)
	data := make([]byte, 9<<20+12345)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := unix.FcntlInt(w.Fd(), unix.F_SETPIPE_SZ, 4096); err != nil {
		t.Logf("pipe size: %v", err)
	}
	go func() {
		for off, step := 0, 1; off < len(data); step = step*7%70001 + 1 {
			n := min(step, len(data)-off)
			if _, err := client.Write(data[off : off+n]); err != nil {
				return
			}
			off += n
		}
		_ = client.CloseWrite()
	}()
	var got bytes.Buffer
	readDone := make(chan error, 1)
	go func() {
		_, err := io.Copy(&got, r)
		readDone <- err
	}()
	var seen bytes.Buffer
	var seenMu sync.Mutex
	see := func(p []byte) {
		seenMu.Lock()
		seen.Write(p)
		seenMu.Unlock()
	}
	var touches atomic.Int64
	var pool bufPool
	src := &lending{Channel: server}
	n, err := copyIn(w, src, see, func() { touches.Add(1) }, &pool)
	w.Close()
	if err != nil || n != int64(len(data)) {
		t.Fatalf("copyIn: %d of %d bytes, %v", n, len(data), err)
	}
	if err := <-readDone; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), data) {
		t.Fatalf("the pipe got %d bytes, not the %d sent, unchanged", got.Len(), len(data))
	}
	if !bytes.Equal(seen.Bytes(), data) {
		t.Fatalf("the tap saw %d bytes, not the %d sent, in order", seen.Len(), len(data))
	}
	if src.calls.Load() == 0 || touches.Load() == 0 {
		t.Fatalf("ReadBuffers called %d times, touch %d: the packets were not lent", src.calls.Load(), touches.Load())
	}
}

// TestCopyInCopiesWithoutADescriptor: a destination that is not a
// descriptor of its own (here a writer over a pipe) gets the data through
// copyStream, whole.
func TestCopyInCopiesWithoutADescriptor(t *testing.T) {
	client, server := channelPair(t)
	data := make([]byte, 3<<20)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	go func() {
		_, _ = client.Write(data)
		_ = client.CloseWrite()
	}()
	src := &lending{Channel: server}
	var out bytes.Buffer
	var pool bufPool
	n, err := copyIn(struct{ io.Writer }{&out}, src, nil, func() {}, &pool)
	if err != nil || n != int64(len(data)) || !bytes.Equal(out.Bytes(), data) {
		t.Fatalf("copyIn: %d of %d bytes, %v, equal %v", n, len(data), err, bytes.Equal(out.Bytes(), data))
	}
	if c := src.calls.Load(); c != 0 {
		t.Fatalf("ReadBuffers called %d times for a writer that is no descriptor", c)
	}
}

// TestCopyInManyTinyPackets: thousands of 1-byte packets queued before
// the command reads (a line-at-a-time sender and a slow reader) are more
// slices than one writev(2) takes; they must all arrive, in order.
func TestCopyInManyTinyPackets(t *testing.T) {
	client, server := channelPair(t)
	const packets = 5000
	data := make([]byte, packets)
	for i := range data {
		data[i] = byte(i*7 + i/256)
	}
	for i := range data {
		if _, err := client.Write(data[i : i+1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := client.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // let them queue in the server's channel
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var got bytes.Buffer
	readDone := make(chan error, 1)
	go func() {
		_, err := io.Copy(&got, r)
		readDone <- err
	}()
	var pool bufPool
	src := &lending{Channel: server}
	n, err := copyIn(w, src, nil, func() {}, &pool)
	w.Close()
	if err != nil || n != packets {
		t.Fatalf("copyIn: %d of %d bytes, %v", n, packets, err)
	}
	if err := <-readDone; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), data) || src.calls.Load() == 0 {
		t.Fatalf("the pipe got %d bytes (equal: %v), ReadBuffers called %d times", got.Len(), bytes.Equal(got.Bytes(), data), src.calls.Load())
	}
}

// TestCopyInWriteError: when the pipe's reader is gone, copyIn returns the
// write's error (EPIPE) instead of losing it.
func TestCopyInWriteError(t *testing.T) {
	client, server := channelPair(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	defer w.Close()
	go func() { _, _ = client.Write(make([]byte, 256<<10)) }()
	var pool bufPool
	_, err = copyIn(w, server, nil, func() {}, &pool)
	if !errors.Is(err, unix.EPIPE) {
		t.Fatalf("copyIn into a pipe with no reader: %v, want EPIPE", err)
	}
}
