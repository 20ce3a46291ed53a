package tunnel_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/internal/gwtest"
	"github.com/sandgate/sandgate/rest"
	"github.com/sandgate/sandgate/tunnel"
)

// lingerGateway is the real tunnel server (CONNECT and WebSocket, hijack,
// accounting, the session's registration) over the real manager, with the
// test's handler in the SSH server's place: it writes and reads what the
// test says. Its tunnels' ends linger at most wait.
type lingerGateway struct {
	st  *gwtest.Stack
	srv *tunnel.Server
	url string
	tls *tls.Config // the client's, over https; nil over http
}

func startLingerGateway(t *testing.T, st *gwtest.Stack, wait time.Duration, handle tunnel.ConnHandler) *lingerGateway {
	return startLingerGatewayTLS(t, st, wait, false, handle)
}

// startLingerGatewayTLS is startLingerGateway, over https when overTLS.
func startLingerGatewayTLS(t *testing.T, st *gwtest.Stack, wait time.Duration, overTLS bool, handle tunnel.ConnHandler) *lingerGateway {
	t.Helper()
	srv := tunnel.NewServer(st.Manager, handle, rest.WriteGatewayError, slog.New(slog.DiscardHandler), tunnel.WithLingerWait(wait))
	hs := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		srv.ServeHTTP(w, r.WithContext(gateway.WithPrincipal(r.Context(), gateway.Principal{Tenant: "default", Method: "api_key"})))
	}))
	var cfg *tls.Config
	if overTLS {
		hs.StartTLS()
		pool := x509.NewCertPool()
		pool.AddCert(hs.Certificate())
		cfg = &tls.Config{RootCAs: pool}
	} else {
		hs.Start()
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		hs.Close()
	})
	return &lingerGateway{st: st, srv: srv, url: hs.URL, tls: cfg}
}

func (g *lingerGateway) dial(t *testing.T, transport, id string) net.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := (&tunnel.Dialer{APIURL: g.url, Token: "unused", Transport: transport, TLSConfig: g.tls}).Dial(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// tcpQueues returns the send and receive queues of the loopback TCP socket
// from port local to port remote (/proc/net/tcp), its socket's inode (0:
// no descriptor holds it, as for a socket in TIME_WAIT), and whether there
// is one.
func tcpQueues(t *testing.T, local, remote int) (tx, rx, inode int64, ok bool) {
	t.Helper()
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 10 {
			continue
		}
		lp, _ := strconv.ParseInt(f[1][strings.IndexByte(f[1], ':')+1:], 16, 32)
		rp, _ := strconv.ParseInt(f[2][strings.IndexByte(f[2], ':')+1:], 16, 32)
		if int(lp) != local || int(rp) != remote {
			continue
		}
		q := strings.SplitN(f[4], ":", 2)
		tx, _ = strconv.ParseInt(q[0], 16, 64)
		rx, _ = strconv.ParseInt(q[1], 16, 64)
		inode, _ = strconv.ParseInt(f[9], 10, 64)
		return tx, rx, inode, true
	}
	return 0, 0, 0, false
}

// ports returns the client's port and the gateway's of the one tunnel
// open to g (a WebSocket's conn does not name its socket's addresses).
func (g *lingerGateway) ports(t *testing.T) (local, remote int) {
	t.Helper()
	u, err := url.Parse(g.url)
	if err != nil {
		t.Fatal(err)
	}
	remote, _ = strconv.Atoi(u.Port())
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 10 || f[3] != "01" { // ESTABLISHED
			continue
		}
		lp, _ := strconv.ParseInt(f[1][strings.IndexByte(f[1], ':')+1:], 16, 32)
		rp, _ := strconv.ParseInt(f[2][strings.IndexByte(f[2], ':')+1:], 16, 32)
		if int(rp) == remote {
			return int(lp), remote
		}
	}
	t.Fatalf("no connection to the gateway's port %d", remote)
	return 0, 0
}

// tcpState returns the state (/proc/net/tcp's hex: 01 established, 04
// and 05 FIN_WAIT1 and 2...) of the loopback TCP socket from port local
// to port remote, or "".
func tcpState(t *testing.T, local, remote int) string {
	t.Helper()
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 10 {
			continue
		}
		lp, _ := strconv.ParseInt(f[1][strings.IndexByte(f[1], ':')+1:], 16, 32)
		rp, _ := strconv.ParseInt(f[2][strings.IndexByte(f[2], ':')+1:], 16, 32)
		if int(lp) == local && int(rp) == remote {
			return f[3]
		}
	}
	return ""
}

// waitUntil polls cond (a state the test waits for, not a timing) for up
// to a minute.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(time.Minute); !cond(); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("still waiting for %s after a minute", what)
		}
	}
}

// The gateway ends a tunnel whose client has sent bytes the gateway
// never read, with a large write of the gateway's under way or just
// done: the client gets every byte the gateway wrote, then the end of
// the stream (a FIN, or a WebSocket's close frame), not a reset. Closed
// with the client's bytes unread, the socket answered with a reset,
// which dropped the gateway's bytes still queued (an exec's last output,
// its exit status) and made the client see ECONNRESET. Every way the
// gateway ends a tunnel: its handler (the SSH connection) returns, the
// session is deleted (or paused, or expires: the same close), the
// server shuts down. Over TLS too: a close_notify, then the FIN.
func TestTunnelEndIsGraceful(t *testing.T) {
	st := gwtest.Start(t, gwtest.Options{})
	const size = 4 << 20
	payload := make([]byte, size)
	for i := range payload {
		payload[i] = byte(i*7 + i>>13)
	}
	for _, transport := range []string{tunnel.TransportConnect, tunnel.TransportWebSocket, "tls+" + tunnel.TransportConnect, "tls+" + tunnel.TransportWebSocket} {
		for _, end := range []string{"handler returns", "session deleted", "server shut down"} {
			t.Run(transport+"/"+end, func(t *testing.T) {
				transport, overTLS := strings.CutPrefix(transport, "tls+")
				id := st.CreateSession(t, nil).SessionID
				type result struct {
					n   int
					err error
				}
				wrote := make(chan result, 1)
				g := startLingerGatewayTLS(t, st, time.Minute, overTLS, func(ctx context.Context, conn net.Conn, s *gateway.Session) {
					// The session's last output, in one write; the
					// client's bytes are never read.
					n, err := conn.Write(payload)
					wrote <- result{n, err}
				})
				c := g.dial(t, transport, id)
				// The client's bytes, which the gateway never reads.
				if _, err := c.Write(bytes.Repeat([]byte{'u'}, 32<<10)); err != nil {
					t.Fatal(err)
				}
				got := make(chan []byte, 1)
				var readErr error
				read := func() {
					b, err := io.ReadAll(bufio.NewReaderSize(c, 64<<10))
					readErr = err
					got <- b
				}
				switch end {
				case "handler returns":
					// The client reads as the gateway writes: the write
					// returns with its last bytes still queued.
					go read()
				default:
					// The gateway's write is under way (the client
					// reads nothing yet) when the session ends.
					local, remote := g.ports(t)
					waitUntil(t, "the gateway's write to reach the client", func() bool {
						_, rx, _, _ := tcpQueues(t, local, remote)
						return rx > 0
					})
					if end == "session deleted" {
						if code := st.Do(t, st.Token, http.MethodDelete, "/v1/sessions/"+id, nil, nil); code != http.StatusNoContent {
							t.Fatalf("delete: %d", code)
						}
					} else {
						ctx, cancel := context.WithCancel(context.Background())
						cancel() // no wait: the tunnels still open are closed at once
						shut := make(chan struct{})
						go func() {
							g.srv.Shutdown(ctx)
							close(shut)
						}()
						defer func() { <-shut }()
					}
					go read()
				}
				b := <-got
				r := <-wrote
				if r.err != nil || r.n != size {
					t.Fatalf("the gateway's write: %d bytes, %v; want all %d", r.n, r.err, size)
				}
				if len(b) != size || !bytes.Equal(b, payload) {
					t.Errorf("the client read %d bytes (equal: %v), want the %d the gateway wrote", len(b), bytes.Equal(b, payload), size)
				}
				if readErr != nil {
					t.Errorf("the client's read ended with %v, want the end of the stream (a FIN, or a close frame), not a reset", readErr)
				}
				c.Close()
			})
		}
	}
}

// A client that goes on sending once the gateway has ended its tunnel
// does not hold the gateway's socket, nor a goroutine (goleak, in
// TestMain), past the end's bounds: the time bound (a client that sends
// slowly and never closes), and the byte bound (a client that sends as
// fast as it can, with the time bound out of reach). Up to the bound the
// gateway reads and drops what comes (a reset at once would lose the
// client the end of what the gateway sent): a client sending as fast as
// it can gets at least half the byte bound through after the end.
func TestTunnelEndBounded(t *testing.T) {
	st := gwtest.Start(t, gwtest.Options{})
	for _, transport := range []string{tunnel.TransportConnect, tunnel.TransportWebSocket} {
		for _, bound := range []string{"time", "bytes"} {
			t.Run(transport+"/"+bound, func(t *testing.T) {
				id := st.CreateSession(t, nil).SessionID
				wait := 200 * time.Millisecond
				if bound == "bytes" {
					wait = 10 * time.Minute
				}
				handled := make(chan struct{})
				// ended: the gateway has ended the tunnel (its reads fail
				// from the end on, at once).
				var ended atomic.Bool
				var total, afterEnd atomic.Int64
				g := startLingerGateway(t, st, wait, func(ctx context.Context, conn net.Conn, s *gateway.Session) {
					defer close(handled)
					// The session reads what the client sends until its end.
					_, _ = io.Copy(io.Discard, conn)
					ended.Store(true)
				})
				c := g.dial(t, transport, id)
				sent := make(chan error, 1)
				go func() {
					chunk := bytes.Repeat([]byte{'s'}, 32<<10)
					if bound == "time" {
						chunk = chunk[:1024]
					}
					for {
						n, err := c.Write(chunk)
						total.Add(int64(n))
						if ended.Load() {
							afterEnd.Add(int64(n))
						}
						if err != nil {
							sent <- err
							return
						}
						if bound == "time" {
							time.Sleep(10 * time.Millisecond)
						}
					}
				}()
				local, remote := g.ports(t)
				waitUntil(t, "the client's bytes to flow", func() bool { return total.Load() > 0 })
				if code := st.Do(t, st.Token, http.MethodDelete, "/v1/sessions/"+id, nil, nil); code != http.StatusNoContent {
					t.Fatalf("delete: %d", code)
				}
				select {
				case err := <-sent:
					t.Logf("the client's writes failed after %d bytes past the end: %v", afterEnd.Load(), err)
				case <-time.After(2 * time.Minute):
					t.Fatal("the client still sends 2 minutes after the end: the gateway holds its tunnel")
				}
				<-handled
				// The gateway's socket (from the server's port to the
				// client's) has no descriptor any more.
				waitUntil(t, "the gateway's socket to be closed", func() bool {
					_, _, inode, ok := tcpQueues(t, remote, local)
					return !ok || inode == 0
				})
				if bound == "bytes" && afterEnd.Load() < tunnel.LingerMaxBytes/2 {
					t.Errorf("the client got %d bytes through after the end, want at least %d: the gateway closed before reading them (a reset)",
						afterEnd.Load(), tunnel.LingerMaxBytes/2)
				}
				c.Close()
			})
		}
	}
}

// A client that stops reading (and never closes) while the gateway
// writes does not hold the gateway's write, socket or goroutines past the
// end's time bound: the write under way when the session ends fails at
// the bound, and the socket is closed.
func TestTunnelEndClientStopsReading(t *testing.T) {
	st := gwtest.Start(t, gwtest.Options{})
	for _, transport := range []string{tunnel.TransportConnect, tunnel.TransportWebSocket} {
		t.Run(transport, func(t *testing.T) {
			id := st.CreateSession(t, nil).SessionID
			var written atomic.Int64
			wrote := make(chan error, 1)
			g := startLingerGateway(t, st, 200*time.Millisecond, func(ctx context.Context, conn net.Conn, s *gateway.Session) {
				chunk := bytes.Repeat([]byte{'o'}, 64<<10)
				for {
					n, err := conn.Write(chunk)
					written.Add(int64(n))
					if err != nil {
						wrote <- err
						return
					}
				}
			})
			c := g.dial(t, transport, id)
			local, remote := g.ports(t)
			// The client reads nothing: the gateway's writes fill the
			// socket buffers and block.
			waitUntil(t, "the gateway's writes to fill the client's buffer", func() bool {
				tx, _, _, _ := tcpQueues(t, remote, local) // the gateway's
				_, rx, _, _ := tcpQueues(t, local, remote) // the client's
				return rx > 0 && tx > 0 && written.Load() > 0
			})
			if code := st.Do(t, st.Token, http.MethodDelete, "/v1/sessions/"+id, nil, nil); code != http.StatusNoContent {
				t.Fatalf("delete: %d", code)
			}
			select {
			case err := <-wrote:
				t.Logf("the gateway's write failed after %d bytes: %v", written.Load(), err)
			case <-time.After(2 * time.Minute):
				t.Fatal("the gateway's write to a client that reads nothing is still blocked 2 minutes after the end")
			}
			waitUntil(t, "the gateway's socket to be closed", func() bool {
				_, _, inode, ok := tcpQueues(t, remote, local)
				return !ok || inode == 0
			})
			c.Close()
		})
	}
}

// The session's side of a tunnel (the SSH connection: its reads) ends
// when the gateway ends the tunnel, not when the linger after it does: a
// pause waits for the SIGHUP of the shells whose connection it ended. A
// WebSocket's close handshake waits for the client's answer, which a
// client that reads nothing never sends: the session's read ends while
// the handshake is still on (the gateway's socket has sent no FIN yet).
// (Left to the library, the read ended with its own 5 s bound on the
// handshake, and the socket's linger began then.)
func TestTunnelEndEndsTheSessionAtOnce(t *testing.T) {
	st := gwtest.Start(t, gwtest.Options{})
	for _, transport := range []string{tunnel.TransportConnect, tunnel.TransportWebSocket} {
		t.Run(transport, func(t *testing.T) {
			id := st.CreateSession(t, nil).SessionID
			readEnded := make(chan error, 1)
			g := startLingerGateway(t, st, 10*time.Minute, func(ctx context.Context, conn net.Conn, s *gateway.Session) {
				_, err := conn.Read(make([]byte, 1))
				readEnded <- err
			})
			c := g.dial(t, transport, id)
			local, remote := g.ports(t)
			if code := st.Do(t, st.Token, http.MethodDelete, "/v1/sessions/"+id, nil, nil); code != http.StatusNoContent {
				t.Fatalf("delete: %d", code)
			}
			select {
			case err := <-readEnded:
				t.Logf("the session's read ended: %v", err)
			case <-time.After(2 * time.Minute):
				t.Fatal("the session's read is still under way 2 minutes after the end")
			}
			// The tunnel lingers on: the client has neither answered nor
			// closed.
			if _, _, inode, ok := tcpQueues(t, remote, local); !ok || inode == 0 {
				t.Errorf("the gateway's socket is closed already (ok %v, inode %d): the linger cannot have been on", ok, inode)
			}
			if st := tcpState(t, remote, local); transport == tunnel.TransportWebSocket && st != "01" {
				t.Errorf("the gateway's socket is in state %s, want 01 (established: the close handshake still on) once the session's read ended", st)
			}
			c.Close() // the linger ends with the client's end
		})
	}
}

// wsClientFrame is a client's WebSocket frame (masked, with a zero key)
// of opcode op whose header says n payload bytes, with payload (all or
// the first part of them).
func wsClientFrame(op byte, n int, payload []byte) []byte {
	b := []byte{0x80 | op}
	switch {
	case n < 126:
		b = append(b, 0x80|byte(n))
	case n < 1<<16:
		b = append(b, 0x80|126, byte(n>>8), byte(n))
	default:
		b = append(b, 0x80|127)
		b = binary.BigEndian.AppendUint64(b, uint64(n))
	}
	b = append(b, 0, 0, 0, 0) // the mask key: zero, the payload as it is
	return append(b, payload...)
}

// A WebSocket tunnel that ends while the client is in the middle of a
// frame (an upload under way) still has its close handshake: once the
// client has sent the rest of its message and answered the gateway's
// close frame, the gateway ends the connection (its FIN), without
// waiting for the client's own end or the linger's bound. (Woken in the
// middle of the frame's payload, the library's read returned part of it
// without counting it; the handshake then skipped that many bytes too
// many, into the client's close frame, and waited for bytes that never
// came: the FIN came only at the bound, 1 s.)
func TestTunnelEndMidFrameKeepsTheCloseHandshake(t *testing.T) {
	st := gwtest.Start(t, gwtest.Options{})
	id := st.CreateSession(t, nil).SessionID
	readEnded := make(chan error, 1)
	var read atomic.Int64
	g := startLingerGateway(t, st, 10*time.Minute, func(ctx context.Context, conn net.Conn, s *gateway.Session) {
		buf := make([]byte, 64<<10)
		for {
			n, err := conn.Read(buf)
			read.Add(int64(n))
			if err != nil {
				readEnded <- err
				return
			}
		}
	})
	u, err := url.Parse(g.url)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /v1/sessions/"+id+"/ssh HTTP/1.1\r\nHost: gateway\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %s", resp.Status)
	}
	// One binary message of 1 MiB, of which the first 10 KiB only.
	const size, first = 1 << 20, 10 << 10
	if _, err := c.Write(wsClientFrame(2, size, make([]byte, first))); err != nil {
		t.Fatal(err)
	}
	// The session's read under way takes them (the library's read waits
	// for the rest of the frame, up to the size asked).
	local, remote := g.ports(t)
	waitUntil(t, "the gateway to read the first part", func() bool {
		_, rx, _, ok := tcpQueues(t, remote, local)
		return ok && rx == 0
	})
	if code := st.Do(t, st.Token, http.MethodDelete, "/v1/sessions/"+id, nil, nil); code != http.StatusNoContent {
		t.Fatalf("delete: %d", code)
	}
	// The gateway's close frame (unmasked, status 1000).
	head := make([]byte, 4)
	if _, err := io.ReadFull(br, head); err != nil {
		t.Fatal(err)
	}
	if head[0] != 0x88 || head[1] != 2 {
		t.Fatalf("the gateway sent %x, want its close frame", head)
	}
	// The rest of the message, then the answer to the close frame.
	if _, err := c.Write(make([]byte, size-first)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(wsClientFrame(8, 2, []byte{0x03, 0xe8})); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second)) // the bound is 10 min
	if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
		t.Fatalf("after the client's answer to the close frame the gateway sent %d bytes more, then %v; want its FIN at once", len(rest), err)
	}
	select {
	case err := <-readEnded:
		t.Logf("the session's read ended after %d bytes: %v", read.Load(), err)
	case <-time.After(2 * time.Minute):
		t.Fatal("the session's read is still under way 2 minutes after the end")
	}
}
