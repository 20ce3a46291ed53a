package sshd_test

// Local port forwarding (direct-tcpip) on the fake-sandbox harness: the
// fake's DialLoopback connects to a listener of the test's on the host's
// loopback and records what it was asked for.

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/sandgate/sandgate/sshd"
)

// dialRecord is one DialLoopback call.
type dialRecord struct {
	network string
	port    int
}

// loopbackTarget is a TCP listener standing for a server in the sandbox,
// and a fake DialLoopback that reaches it whatever the port.
type loopbackTarget struct {
	ln    net.Listener
	mu    sync.Mutex
	dials []dialRecord
	conns chan net.Conn // accepted connections
}

func newLoopbackTarget(t *testing.T) *loopbackTarget {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lt := &loopbackTarget{ln: ln, conns: make(chan net.Conn, 16)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			lt.conns <- c
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		for {
			select {
			case c := <-lt.conns:
				c.Close()
			default:
				return
			}
		}
	})
	return lt
}

func (lt *loopbackTarget) dial(ctx context.Context, network string, port int) (net.Conn, error) {
	lt.mu.Lock()
	lt.dials = append(lt.dials, dialRecord{network, port})
	lt.mu.Unlock()
	var d net.Dialer
	return d.DialContext(ctx, "tcp", lt.ln.Addr().String())
}

func (lt *loopbackTarget) recorded() []dialRecord {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	return append([]dialRecord(nil), lt.dials...)
}

func (lt *loopbackTarget) accepted(t *testing.T) net.Conn {
	t.Helper()
	select {
	case c := <-lt.conns:
		t.Cleanup(func() { c.Close() })
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("no connection reached the sandbox")
		return nil
	}
}

// openDirect opens a direct-tcpip channel to host:port, as ssh -L does:
// the host goes on the wire exactly as given.
func openDirect(c *gossh.Client, host string, port uint32) (gossh.Channel, error) {
	payload := gossh.Marshal(struct {
		DestAddr   string
		DestPort   uint32
		OriginAddr string
		OriginPort uint32
	}{host, port, "127.0.0.1", 50000})
	ch, reqs, err := c.OpenChannel("direct-tcpip", payload)
	if err != nil {
		return nil, err
	}
	go gossh.DiscardRequests(reqs)
	return ch, nil
}

// wantRejected checks err is the channel's refusal for reason.
func wantRejected(t *testing.T, err error, reason gossh.RejectionReason, msg string) {
	t.Helper()
	var oce *gossh.OpenChannelError
	if !errors.As(err, &oce) {
		t.Fatalf("open: %v, want a rejection", err)
	}
	if oce.Reason != reason || !strings.Contains(oce.Message, msg) {
		t.Fatalf("rejected with %v %q, want %v with %q", oce.Reason, oce.Message, reason, msg)
	}
}

func TestForwardLoopbackAllowed(t *testing.T) {
	for _, tt := range []struct {
		host    string
		network string
	}{
		{"localhost", "tcp4"},
		{"127.0.0.1", "tcp4"},
		{"::1", "tcp6"},
	} {
		t.Run(tt.host, func(t *testing.T) {
			sb := newFakeSandbox()
			lt := newLoopbackTarget(t)
			sb.dial = lt.dial
			h := newHarness(t, sshd.Config{LocalForward: true}, sb)
			c := h.dial(t)
			before := h.sess.LastActivity()
			time.Sleep(5 * time.Millisecond)
			ch, err := openDirect(c, tt.host, 8123)
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			defer ch.Close()
			srv := lt.accepted(t)
			if got := lt.recorded(); len(got) != 1 || got[0] != (dialRecord{tt.network, 8123}) {
				t.Fatalf("dialled %v, want %s port 8123", got, tt.network)
			}
			// Client to sandbox, then the client's EOF arrives as a half-close.
			if _, err := io.WriteString(ch, "GET / HTTP/1.0\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			if err := ch.CloseWrite(); err != nil {
				t.Fatal(err)
			}
			srv.SetDeadline(time.Now().Add(10 * time.Second))
			req, err := io.ReadAll(srv)
			if err != nil || string(req) != "GET / HTTP/1.0\r\n\r\n" {
				t.Fatalf("the sandbox read %q, %v", req, err)
			}
			// The sandbox still answers on its half, then closes.
			if _, err := io.WriteString(srv, "HTTP/1.0 200 OK\r\n\r\nhello"); err != nil {
				t.Fatal(err)
			}
			srv.Close()
			resp, err := io.ReadAll(ch)
			if err != nil || string(resp) != "HTTP/1.0 200 OK\r\n\r\nhello" {
				t.Fatalf("the client read %q, %v", resp, err)
			}
			if !h.sess.LastActivity().After(before) {
				t.Error("forwarding did not count as session activity")
			}
		})
	}
}

// Forwarded connections are counted apart from session channels, as
// OpenSSH's MaxSessions counts only sessions: with every session channel
// open, a forward still opens.
func TestForwardNotCountedAsSession(t *testing.T) {
	sb := newFakeSandbox()
	lt := newLoopbackTarget(t)
	sb.dial = lt.dial
	c := newHarness(t, sshd.Config{LocalForward: true}, sb).dial(t)
	for i := range sshd.MaxChannelsPerConn {
		ch, _, err := c.OpenChannel("session", nil)
		if err != nil {
			t.Fatalf("session channel %d: %v", i, err)
		}
		defer ch.Close()
	}
	ch, err := openDirect(c, "127.0.0.1", 8123)
	if err != nil {
		t.Fatalf("a forward with every session channel open: %v", err)
	}
	defer ch.Close()
	lt.accepted(t).Close()
}

// "localhost" is tried on ::1 too when 127.0.0.1 refuses.
func TestForwardLocalhostTriesBothLoopbacks(t *testing.T) {
	sb := newFakeSandbox()
	lt := newLoopbackTarget(t)
	sb.dial = func(ctx context.Context, network string, port int) (net.Conn, error) {
		if network == "tcp4" {
			lt.mu.Lock()
			lt.dials = append(lt.dials, dialRecord{network, port})
			lt.mu.Unlock()
			return nil, errors.New("connect: connection refused")
		}
		return lt.dial(ctx, network, port)
	}
	c := newHarness(t, sshd.Config{LocalForward: true}, sb).dial(t)
	ch, err := openDirect(c, "localhost", 8123)
	if err != nil {
		t.Fatalf("localhost served on ::1 only: %v", err)
	}
	defer ch.Close()
	lt.accepted(t).Close()
	if got := lt.recorded(); len(got) != 2 || got[0] != (dialRecord{"tcp4", 8123}) || got[1] != (dialRecord{"tcp6", 8123}) {
		t.Errorf("dialled %v, want tcp4 then tcp6", got)
	}
}

func TestForwardRefusedDestinations(t *testing.T) {
	sb := newFakeSandbox()
	lt := newLoopbackTarget(t)
	sb.dial = lt.dial
	h := newHarness(t, sshd.Config{LocalForward: true}, sb)
	c := h.dial(t)
	for _, host := range []string{"10.0.0.1", "example.com", "0.0.0.0", "127.0.0.2", "192.168.1.1", "::", "[::1]x", "", "LOCALHOST.", "localhost.example.com"} {
		_, err := openDirect(c, host, 80)
		wantRejected(t, err, gossh.Prohibited, "loopback")
	}
	if got := lt.recorded(); len(got) != 0 {
		t.Fatalf("dialled %v for refused destinations", got)
	}
	// The connection is still usable after the refusals.
	if _, err := openDirect(c, "127.0.0.1", 80); err != nil {
		t.Fatalf("open after refusals: %v", err)
	}
}

func TestForwardDisabled(t *testing.T) {
	sb := newFakeSandbox()
	lt := newLoopbackTarget(t)
	sb.dial = lt.dial
	h := newHarness(t, sshd.Config{}, sb) // LocalForward off: the zero value
	c := h.dial(t)
	for _, host := range []string{"localhost", "127.0.0.1", "10.0.0.1"} {
		_, err := openDirect(c, host, 8123)
		wantRejected(t, err, gossh.Prohibited, "disabled")
	}
	if got := lt.recorded(); len(got) != 0 {
		t.Fatalf("dialled %v with forwarding disabled", got)
	}
}

func TestForwardConnectFails(t *testing.T) {
	sb := newFakeSandbox() // no dial: every connect is refused
	h := newHarness(t, sshd.Config{LocalForward: true}, sb)
	_, err := openDirect(h.dial(t), "localhost", 8123)
	wantRejected(t, err, gossh.ConnectionFailed, "connection refused")
	_, err = openDirect(h.dial(t), "localhost", 0)
	wantRejected(t, err, gossh.ConnectionFailed, "out of range")
	_, err = openDirect(h.dial(t), "localhost", 70000)
	wantRejected(t, err, gossh.ConnectionFailed, "out of range")
}

func TestRemoteAgentX11ForwardRefused(t *testing.T) {
	sb := newFakeSandbox()
	h := newHarness(t, sshd.Config{LocalForward: true}, sb)
	c := h.dial(t)
	// ssh -R: a tcpip-forward global request.
	if ln, err := c.Listen("tcp", "127.0.0.1:0"); err == nil {
		ln.Close()
		t.Fatal("tcpip-forward accepted")
	}
	ok, _, err := c.SendRequest("streamlocal-forward@openssh.com", true, gossh.Marshal(struct{ Path string }{"/tmp/x"}))
	if err != nil || ok {
		t.Fatalf("streamlocal-forward: ok=%v err=%v, want refused", ok, err)
	}
	// Channel types the server never serves.
	for _, typ := range []string{"forwarded-tcpip", "auth-agent@openssh.com", "x11", "direct-streamlocal@openssh.com"} {
		if ch, _, err := c.OpenChannel(typ, nil); err == nil {
			ch.Close()
			t.Fatalf("%s channel accepted", typ)
		}
	}
}

func TestForwardClosedWithConnection(t *testing.T) {
	sb := newFakeSandbox()
	lt := newLoopbackTarget(t)
	sb.dial = lt.dial
	h := newHarness(t, sshd.Config{LocalForward: true}, sb)
	c := h.dial(t)
	if _, err := openDirect(c, "localhost", 8123); err != nil {
		t.Fatal(err)
	}
	srv := lt.accepted(t)
	c.Close() // the connection ends (as when the session closes): the sandbox side is closed
	srv.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadAll(srv); err != nil {
		t.Fatalf("sandbox side not closed: %v", err)
	}
}
