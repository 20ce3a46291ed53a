package thirdparty

import (
	"crypto/ed25519"
	"crypto/rand"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"
)

// Channel data must never overtake an earlier message of the connection,
// however the patched transport hands packets on (the pooled buffers of
// packetpool.go included): here channel requests the server does not take
// yet fill the channel's request queue and hold the mux's loop, and data
// sent after them must not reach the server until it takes them.
func TestChannelDataWaitsForEarlierMessages(t *testing.T) {
	client, server, serverReqs := sessionPair(t)
	// One more than the channel's request queue holds (16): the mux's loop
	// waits with the last, having taken it from the transport's queue, so
	// that queue is empty when the data comes, and only the loop's being
	// busy holds the data back.
	const requests = 17
	for range requests {
		if _, err := client.SendRequest("env", false, gossh.Marshal(struct{ Name, Value string }{"A", "b"})); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := client.Write([]byte("after")); err != nil {
		t.Fatal(err)
	}

	var released atomic.Bool
	got := make(chan error, 1)
	go func() {
		b := make([]byte, 5)
		_, err := io.ReadFull(server, b)
		if err == nil && !released.Load() {
			err = errorString("the data sent after the requests arrived before they were taken")
		} else if err == nil && string(b) != "after" {
			err = errorString("got " + string(b))
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("before the requests were taken: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	released.Store(true)
	for i := range requests {
		select {
		case r := <-serverReqs:
			if r.Type != "env" {
				t.Fatalf("request %d: %q", i, r.Type)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("request %d never came", i)
		}
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the data never came")
	}
}

type errorString string

func (e errorString) Error() string { return string(e) }

// sessionPair returns both ends of a session channel of an SSH connection
// over loopback TCP (x/crypto both sides), and the server end's requests,
// which nothing takes until the test does.
func sessionPair(t *testing.T) (client, server gossh.Channel, serverReqs <-chan *gossh.Request) {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	hostKey, err := gossh.NewSignerFromKey(key)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type accepted struct {
		ch   gossh.Channel
		reqs <-chan *gossh.Request
		err  error
	}
	done := make(chan accepted, 1)
	go func() {
		sn, err := ln.Accept()
		if err != nil {
			done <- accepted{err: err}
			return
		}
		t.Cleanup(func() { sn.Close() })
		cfg := &gossh.ServerConfig{NoClientAuth: true}
		cfg.AddHostKey(hostKey)
		_, chans, reqs, err := gossh.NewServerConn(sn, cfg)
		if err != nil {
			done <- accepted{err: err}
			return
		}
		go gossh.DiscardRequests(reqs)
		nc, ok := <-chans
		if !ok {
			done <- accepted{err: errorString("the connection ended before a channel was opened")}
			return
		}
		ch, chReqs, err := nc.Accept()
		done <- accepted{ch, chReqs, err}
	}()
	c, err := gossh.Dial("tcp", ln.Addr().String(), &gossh.ClientConfig{
		User:            "t",
		HostKeyCallback: gossh.InsecureIgnoreHostKey(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ch, chReqs, err := c.OpenChannel("session", nil)
	if err != nil {
		t.Fatal(err)
	}
	go gossh.DiscardRequests(chReqs)
	a := <-done
	if a.err != nil {
		t.Fatal(a.err)
	}
	return ch, a.ch, a.reqs
}

// A peer that takes channel data in more slowly than the link could carry
// it must not be handed the whole of its window (pace.go): OpenSSH's ssh
// grows a channel's buffer one packet at a time up to all it is sent.
// Here the client reads 32 KiB every half millisecond, over loopback: the
// link needs far less than the 2 MiB window in flight, and the data
// written and not yet read must stay well below it.
func TestChannelPacesASlowReader(t *testing.T) {
	client, server, _ := sessionPair(t)
	const total = 24 << 20
	var written atomic.Int64
	werr := make(chan error, 1)
	go func() {
		buf := make([]byte, 32<<10)
		var err error
		for n := 0; n < total && err == nil; n += len(buf) {
			_, err = server.Write(buf)
			written.Add(int64(len(buf)))
		}
		werr <- err
	}()
	buf := make([]byte, 32<<10)
	var read, worst int64
	for read < total {
		n, err := client.Read(buf)
		if err != nil {
			t.Fatalf("after %d bytes: %v", read, err)
		}
		read += int64(n)
		if read > total/2 { // past the start, before which nothing is paced
			worst = max(worst, written.Load()-read)
		}
		time.Sleep(500 * time.Microsecond)
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	t.Logf("most written and not yet read in the second half: %d KiB", worst>>10)
	// Under 3/4 of the window: the limit here is 128-512 KiB, and the
	// pacing's probe doubles it for a span now and then.
	if worst > 1536<<10 {
		t.Errorf("%d KiB written and not yet read: the slow reader was handed most of its 2 MiB window", worst>>10)
	}
}
