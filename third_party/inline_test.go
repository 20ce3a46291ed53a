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
