package tunnel_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	gossh "golang.org/x/crypto/ssh"

	"github.com/sandgate/sandgate/internal/gwtest"
	"github.com/sandgate/sandgate/sshd"
	"github.com/sandgate/sandgate/tunnel"
)

func TestMain(m *testing.M) {
	gwtest.Dispatch()
	goleak.VerifyTestMain(m)
}

func rawConnect(t *testing.T, s *gwtest.Stack, req string) (net.Conn, *bufio.Reader, *http.Response) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatal(err)
	}
	return conn, br, resp
}

// The SSH version line sent in the same packet as the CONNECT must reach
// the SSH server, and the server's must come right after the 200.
func TestConnectWithBytesInSamePacket(t *testing.T) {
	s := gwtest.Start(t, gwtest.Options{})
	id := s.CreateSession(t, nil).SessionID
	for _, path := range []string{"/v1/sessions/" + id, "/sessions/" + id} {
		t.Run(path, func(t *testing.T) {
			_, br, resp := rawConnect(t, s, "CONNECT "+path+" HTTP/1.1\r\nHost: x\r\nProxy-Authorization: Bearer "+s.Token+"\r\n\r\nSSH-2.0-test_client\r\n")
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			line, err := br.ReadString('\n')
			if err != nil || !strings.HasPrefix(line, "SSH-2.0-sandgate") {
				t.Fatalf("after 200: %q, %v", line, err)
			}
		})
	}
}

func TestConnectAuthorizationHeaderAlsoWorks(t *testing.T) {
	s := gwtest.Start(t, gwtest.Options{})
	id := s.CreateSession(t, nil).SessionID
	_, _, resp := rawConnect(t, s, "CONNECT /v1/sessions/"+id+" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+s.Token+"\r\n\r\n")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
}

func TestConnectRefusals(t *testing.T) {
	s := gwtest.Start(t, gwtest.Options{Tokens: map[string]string{"test-token": "alice", "bob-token": "bob"}})
	alice := s.CreateSession(t, nil).SessionID
	deleted := s.CreateSession(t, nil).SessionID
	if code := s.Do(t, s.Token, http.MethodDelete, "/v1/sessions/"+deleted, nil, nil); code != http.StatusNoContent {
		t.Fatalf("delete: %d", code)
	}
	tests := []struct {
		name, token, id string
		status          int
	}{
		{"no token", "", alice, http.StatusUnauthorized},
		{"bad token", "garbage", alice, http.StatusUnauthorized},
		{"another tenant", "bob-token", alice, http.StatusNotFound},
		{"deleted", s.Token, deleted, http.StatusGone},
		{"another tenant's deleted", "bob-token", deleted, http.StatusNotFound},
		{"missing", s.Token, "sbx-doesnotexist", http.StatusNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := s.Dial(t, tt.token, tt.id)
			var se *tunnel.StatusError
			if !errors.As(err, &se) || se.StatusCode != tt.status {
				t.Fatalf("dial: %v, want status %d", err, tt.status)
			}
		})
	}
	// Another tenant's session is indistinguishable from a missing one.
	_, e1 := s.Dial(t, "bob-token", alice)
	_, e2 := s.Dial(t, "bob-token", "sbx-doesnotexist")
	if e1.Error() != e2.Error() {
		t.Fatalf("answers differ: %q vs %q", e1, e2)
	}
}

// A client that opens TCP and sends nothing is closed at the header timeout.
func TestSilentClientClosed(t *testing.T) {
	s := gwtest.Start(t, gwtest.Options{ReadHeaderTimeout: 300 * time.Millisecond})
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	start := time.Now()
	_, err = conn.Read(make([]byte, 1))
	if err == nil || time.Since(start) > 5*time.Second {
		t.Fatalf("read: %v after %v, want close at the header timeout", err, time.Since(start))
	}
}

// A tunnel that never starts SSH is closed at the handshake deadline.
func TestSSHHandshakeDeadline(t *testing.T) {
	st := gwtest.Start(t, gwtest.Options{SSH: handshake(300 * time.Millisecond)})
	id := st.CreateSession(t, nil).SessionID
	conn, err := st.Dial(t, st.Token, id)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	start := time.Now()
	_, err = io.ReadAll(conn) // server version line, then close
	if err != nil || time.Since(start) > 5*time.Second {
		t.Fatalf("read: %v after %v, want EOF at the handshake deadline", err, time.Since(start))
	}
}

// Deleting a session closes its live SSH connections.
func TestDeleteClosesConnections(t *testing.T) {
	s := gwtest.Start(t, gwtest.Options{})
	id := s.CreateSession(t, nil).SessionID
	c := s.SSH(t, id)
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	if code := s.Do(t, s.Token, http.MethodDelete, "/v1/sessions/"+id, nil, nil); code != http.StatusNoContent {
		t.Fatalf("delete: %d", code)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("SSH connection survived DELETE")
	}
}

func TestDialerAPIURLForms(t *testing.T) {
	s := gwtest.Start(t, gwtest.Options{})
	id := s.CreateSession(t, nil).SessionID
	for _, u := range []string{s.URL, s.URL + "/", s.URL + "/v1", s.URL + "/v1/"} {
		d := &tunnel.Dialer{APIURL: u, Token: s.Token}
		conn, err := d.Dial(context.Background(), id)
		if err != nil {
			t.Fatalf("%s: %v", u, err)
		}
		cc, chans, reqs, err := gossh.NewClientConn(conn, id, &gossh.ClientConfig{User: "sandbox", HostKeyCallback: s.HostKeyCallback()})
		if err != nil {
			t.Fatalf("%s: ssh: %v", u, err)
		}
		gossh.NewClient(cc, chans, reqs).Close()
	}
	if got := tunnel.ConnectPath("/v1", "x"); got != "/v1/sessions/x" {
		t.Fatalf("ConnectPath = %q", got)
	}
	if got := tunnel.ConnectPath("/gw", "x"); got != "/gw/v1/sessions/x" {
		t.Fatalf("ConnectPath = %q", got)
	}
}

func handshake(d time.Duration) sshd.Config { return sshd.Config{HandshakeTimeout: d} }

// A gateway that sends its SSH banner in the same packet as the CONNECT
// answer: the dialer's connection gives the banner first, and Unwrap
// hands out the socket itself (for splice) with the banner beside it.
func TestDialBannerWithAnswerAndUnwrap(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	const banner = "SSH-2.0-sandgate_test\r\n"
	go func() {
		for range 2 {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			br := bufio.NewReader(c)
			if _, err := http.ReadRequest(br); err == nil {
				_, _ = io.WriteString(c, "HTTP/1.1 200 Connection Established\r\n\r\n"+banner+"rest")
			}
			defer c.Close()
		}
	}()
	d := &tunnel.Dialer{APIURL: "http://" + ln.Addr().String(), Token: "t"}

	// Read through the connection: the banner, then what follows.
	conn, err := d.Dial(context.Background(), "sbx-x")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	b := make([]byte, len(banner)+4)
	if _, err := io.ReadFull(conn, b); err != nil || string(b) != banner+"rest" {
		t.Fatalf("read %q, %v; want the banner, then the rest", b, err)
	}

	// Unwrap: the socket and the banner.
	conn2, err := d.Dial(context.Background(), "sbx-x")
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	raw, head := tunnel.Unwrap(conn2)
	if _, ok := raw.(*net.TCPConn); !ok {
		t.Fatalf("Unwrap gave a %T, want the *net.TCPConn", raw)
	}
	_ = raw.SetReadDeadline(time.Now().Add(10 * time.Second))
	rest, _ := io.ReadAll(raw)
	if got := string(head) + string(rest); got != banner+"rest" {
		t.Fatalf("head %q + socket %q; want the banner, then the rest", head, rest)
	}
	if again, head2 := tunnel.Unwrap(raw); again != raw || head2 != nil {
		t.Fatalf("Unwrap of a plain connection: %T, %q; want it unchanged", again, head2)
	}
}

// One principal's tunnels stalled after the SSH banner use up its own
// budget only: its next CONNECT answers 429, and another principal's
// login still succeeds, though the gateway-wide bound would be full had
// the first principal taken it all.
func TestStartupBudgetPerPrincipal(t *testing.T) {
	s := gwtest.Start(t, gwtest.Options{
		Tokens: map[string]string{"test-token": "alice", "bob-token": "bob"},
		SSH:    sshd.Config{MaxStartups: sshd.Startups{Start: 5, Rate: 100, Full: 5}, MaxStartupsPerPrincipal: 4},
	})
	alice := s.CreateSession(t, nil).SessionID
	var bob gwtest.Session
	if code := s.Do(t, "bob-token", http.MethodPost, "/v1/sessions", map[string]any{}, &bob); code != http.StatusCreated {
		t.Fatalf("bob's create: %d", code)
	}
	for i := range 4 {
		conn, err := s.Dial(t, s.Token, alice)
		if err != nil {
			t.Fatalf("alice's tunnel %d: %v", i, err)
		}
		t.Cleanup(func() { conn.Close() })
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		if line, err := bufio.NewReader(conn).ReadString('\n'); err != nil || !strings.HasPrefix(line, "SSH-2.0-") {
			t.Fatalf("alice's tunnel %d: banner %q, %v", i, line, err)
		}
		// ... and nothing more: the tunnel stalls in authentication.
	}
	_, err := s.Dial(t, s.Token, alice)
	var se *tunnel.StatusError
	if !errors.As(err, &se) || se.StatusCode != http.StatusTooManyRequests || se.Code != "too_many_ssh_startups" {
		t.Fatalf("alice's fifth tunnel: %v, want 429 too_many_ssh_startups", err)
	}
	conn, err := s.Dial(t, "bob-token", bob.SessionID)
	if err != nil {
		t.Fatalf("bob's tunnel: %v", err)
	}
	cfg := &gossh.ClientConfig{User: "sandbox", HostKeyCallback: s.HostKeyCallback(), Timeout: 10 * time.Second}
	cc, chans, reqs, err := gossh.NewClientConn(conn, bob.SessionID, cfg)
	if err != nil {
		conn.Close()
		t.Fatalf("bob's login while alice stalls hers: %v", err)
	}
	c := gossh.NewClient(cc, chans, reqs)
	defer c.Close()
	if out, err := runOne(c, "echo ok"); err != nil || out != "ok\n" {
		t.Fatalf("bob's command: %q %v", out, err)
	}
	if !waitLog(s, "ssh_max_startups_per_principal") {
		t.Errorf("no warning logged:\n%s", s.Log.String())
	}
}

func runOne(c *gossh.Client, cmd string) (string, error) {
	sess, err := c.NewSession()
	if err != nil {
		return "", err
	}
	defer sess.Close()
	out, err := sess.Output(cmd)
	return string(out), err
}

func waitLog(s *gwtest.Stack, what string) bool {
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if strings.Contains(s.Log.String(), what) {
			return true
		}
	}
	return false
}

// A Dialer with RetryStartups waits its turn past the budget: once the
// stalled tunnels reach their handshake deadline, its CONNECT gets in.
func TestDialerRetriesStartups(t *testing.T) {
	s := gwtest.Start(t, gwtest.Options{SSH: sshd.Config{HandshakeTimeout: time.Second, MaxStartupsPerPrincipal: 2}})
	id := s.CreateSession(t, nil).SessionID
	for range 2 {
		conn, err := s.Dial(t, s.Token, id)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
	}
	d := &tunnel.Dialer{APIURL: s.URL, Token: s.Token, Timeout: 10 * time.Second, RetryStartups: 30 * time.Second}
	conn, err := d.Dial(context.Background(), id)
	if err != nil {
		t.Fatalf("dial with retries: %v", err)
	}
	conn.Close()
}
