package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/sandgate/sandgate/internal/gwtest"
	"github.com/sandgate/sandgate/tunnel"
)

// goSSH is an x/crypto/ssh client on session s, through the tunnel.
func goSSH(t *testing.T, g *gatewayProc, s sessionJSON) *gossh.Client {
	t.Helper()
	conn, err := (&tunnel.Dialer{APIURL: g.URL, Token: g.Token, Timeout: 10 * time.Second}).Dial(context.Background(), s.SessionID)
	if err != nil {
		t.Fatalf("tunnel: %v", err)
	}
	cfg := &gossh.ClientConfig{User: "sandbox", Auth: []gossh.AuthMethod{gossh.Password(s.SSH.Password)},
		HostKeyCallback: gossh.InsecureIgnoreHostKey(), Timeout: 10 * time.Second}
	cc, chans, reqs, err := gossh.NewClientConn(conn, s.SessionID, cfg)
	if err != nil {
		conn.Close()
		t.Fatalf("ssh: %v", err)
	}
	c := gossh.NewClient(cc, chans, reqs)
	t.Cleanup(func() { c.Close() })
	return c
}

// directTCPIP opens a direct-tcpip channel to host:port with the host on
// the wire as given (as ssh -L and -D send it).
func directTCPIP(c *gossh.Client, host string, port int) (gossh.Channel, error) {
	ch, reqs, err := c.OpenChannel("direct-tcpip", gossh.Marshal(struct {
		DestAddr   string
		DestPort   uint32
		OriginAddr string
		OriginPort uint32
	}{host, uint32(port), "127.0.0.1", 40000}))
	if err != nil {
		return nil, err
	}
	go gossh.DiscardRequests(reqs)
	return ch, nil
}

func wantProhibited(t *testing.T, what string, err error) {
	t.Helper()
	var oce *gossh.OpenChannelError
	if !errors.As(err, &oce) || oce.Reason != gossh.Prohibited {
		t.Errorf("%s: %v, want the channel refused as prohibited", what, err)
	}
}

// serveMarker starts, in session id, python's http.server on port of its
// loopback, serving fwdroot/marker.txt, and returns the marker the file
// holds (prefix + the session id).
func serveMarker(t *testing.T, g *gatewayProc, id string, port int, prefix string) string {
	t.Helper()
	marker := prefix + id
	c := procClient{g: g, base: "/v1/sessions/" + id + "/processes"}
	c.start(t, map[string]any{"command": fmt.Sprintf(
		"mkdir -p fwdroot && echo %s > fwdroot/marker.txt && cd fwdroot && exec python3 -m http.server %d --bind 127.0.0.1",
		marker, port), "name": "http"})
	return marker
}

// httpGetRetry fetches url until it answers 200 or the deadline passes
// (the server in the sandbox and ssh -L take a moment to listen).
func httpGetRetry(t *testing.T, url string) string {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(30 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		res, err := client.Get(url)
		if err == nil {
			body, rerr := io.ReadAll(res.Body)
			res.Body.Close()
			if rerr == nil && res.StatusCode == http.StatusOK {
				return string(body)
			}
			err = fmt.Errorf("status %d, %v", res.StatusCode, rerr)
		}
		last = err
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("GET %s: %v", url, last)
	return ""
}

func forwardDriverArgs(t *testing.T, driver string) []string {
	if driver == "linux" {
		requireLinuxDriver(t)
	}
	return []string{"--sandbox", driver}
}

func TestForwardLocalPort(t *testing.T) {
	ssh := gwtest.RequireTool(t, "ssh")
	gwtest.RequireTool(t, "python3")
	for _, driver := range []string{"workdir", "linux"} {
		t.Run(driver, func(t *testing.T) {
			g := startGateway(t, forwardDriverArgs(t, driver)...)
			s := g.createSession(t)
			// A port free on the host: workdir shares the host's network,
			// and on linux the host's own port must be free for the
			// check that the sandbox's server is not reachable there.
			port := gwtest.FreePort(t)
			marker := serveMarker(t, g, s.SessionID, port, "sandgate-forward-")

			// OpenSSH ssh -N -L through the gateway.
			local := gwtest.FreePort(t)
			cmd := newCmd(g.clientEnv(), ssh, append(g.sshOpts(t, s), "-N", "-o", "ExitOnForwardFailure=yes",
				"-L", fmt.Sprintf("127.0.0.1:%d:localhost:%d", local, port), s.SessionID)...)
			var sshErr strings.Builder
			cmd.Stderr = &sshErr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
			})
			body := httpGetRetry(t, fmt.Sprintf("http://127.0.0.1:%d/marker.txt", local))
			if strings.TrimSpace(body) != marker {
				t.Fatalf("through ssh -L: %q, want %q (ssh: %s)", body, marker, sshErr.String())
			}
			// Again: each connection is a new direct-tcpip channel.
			for range 3 {
				if b := httpGetRetry(t, fmt.Sprintf("http://127.0.0.1:%d/marker.txt", local)); strings.TrimSpace(b) != marker {
					t.Fatalf("again: %q", b)
				}
			}

			if driver == "linux" {
				// The server lives in the sandbox's network namespace: the
				// host's 127.0.0.1:port is not it.
				hc := &http.Client{Timeout: 3 * time.Second}
				if res, err := hc.Get(fmt.Sprintf("http://127.0.0.1:%d/marker.txt", port)); err == nil {
					b, _ := io.ReadAll(res.Body)
					res.Body.Close()
					if strings.Contains(string(b), marker) {
						t.Fatal("the sandbox's server is reachable on the host's loopback")
					}
				}
			}

			// A Go client: loopback works, other hosts are refused.
			gc := goSSH(t, g, s)
			ch, err := directTCPIP(gc, "127.0.0.1", port)
			if err != nil {
				t.Fatalf("direct-tcpip to 127.0.0.1:%d: %v", port, err)
			}
			fmt.Fprintf(ch, "GET /marker.txt HTTP/1.0\r\nHost: x\r\n\r\n")
			_ = ch.CloseWrite() // half-close: the answer still comes
			resp, _ := io.ReadAll(ch)
			ch.Close()
			if !strings.Contains(string(resp), marker) {
				t.Fatalf("direct-tcpip answer: %q", resp)
			}
			_, err = directTCPIP(gc, "10.0.0.1", 80)
			wantProhibited(t, "10.0.0.1:80", err)
			_, err = directTCPIP(gc, "example.com", 80)
			wantProhibited(t, "example.com:80", err)
			// A closed port on the loopback: the connect fails, not the policy.
			var oce *gossh.OpenChannelError
			if _, err = directTCPIP(gc, "127.0.0.1", freePortNot(t, port)); !errors.As(err, &oce) || oce.Reason != gossh.ConnectionFailed {
				t.Errorf("direct-tcpip to a closed port: %v, want connection failed", err)
			}
			// ssh -R is refused.
			if ln, err := gc.Listen("tcp", "127.0.0.1:0"); err == nil {
				ln.Close()
				t.Error("tcpip-forward (ssh -R) accepted")
			}
		})
	}
}

// freePortNot is a free host port other than not.
func freePortNot(t *testing.T, not int) int {
	for {
		if p := gwtest.FreePort(t); p != not {
			return p
		}
	}
}

func TestForwardDisabled(t *testing.T) {
	for _, driver := range []string{"workdir", "linux"} {
		t.Run(driver, func(t *testing.T) {
			g := startGateway(t, append(forwardDriverArgs(t, driver), "--ssh-allow-local-forward=false")...)
			s := g.createSession(t)
			gc := goSSH(t, g, s)
			for _, host := range []string{"localhost", "127.0.0.1", "10.0.0.1"} {
				_, err := directTCPIP(gc, host, 8123)
				wantProhibited(t, host+":8123 with forwarding off", err)
			}
			// Exec still works on the connection.
			sess, err := gc.NewSession()
			if err != nil {
				t.Fatal(err)
			}
			defer sess.Close()
			if out, err := sess.Output("echo ok"); err != nil || strings.TrimSpace(string(out)) != "ok" {
				t.Fatalf("exec: %q, %v", out, err)
			}
		})
	}
}
