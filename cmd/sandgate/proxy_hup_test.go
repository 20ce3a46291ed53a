package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"os/signal"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// The end of a tunnel as OpenSSH makes it: ssh writes its last packets
// to the proxy's stdin, closes its pipes and at once sends the proxy
// SIGHUP (ssh_kill_proxy_command). The proxy still relays those packets,
// ends the tunnel with a half-close, takes the gateway's last bytes, and
// exits 0 with nothing on stderr: the gateway reads an EOF, not a reset.
// (Killed by the signal, the proxy dropped ssh's last packets, and its
// socket answered the gateway's last bytes with a reset.)
func TestProxyHangupEndsTheTunnel(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	hupSent, connected := make(chan struct{}), make(chan struct{})
	type result struct {
		got     string
		err     error
		writeTo error
	}
	gw := make(chan result, 1)
	go func() {
		up := sync.OnceFunc(func() { close(connected) })
		defer up() // a failure is reported below, at gw
		c, err := ln.Accept()
		if err != nil {
			gw <- result{err: err}
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(60 * time.Second))
		br := bufio.NewReader(c)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				gw <- result{err: err}
				return
			}
			if line == "\r\n" {
				break
			}
		}
		if _, err := io.WriteString(c, "HTTP/1.1 200 Connection Established\r\n\r\n"); err != nil {
			gw <- result{err: err}
			return
		}
		up()
		// ssh's last packets, up to the proxy's half-close.
		b, err := io.ReadAll(br)
		// The gateway's last bytes go out once ssh has hung up.
		<-hupSent
		_, werr := io.WriteString(c, "gateway's last words")
		gw <- result{got: string(b), err: err, writeTo: werr}
	}()

	out, werr, stderr := hangUpProxy(t, "http://"+ln.Addr().String(), "connect", connected, hupSent)
	r := <-gw
	if r.err != nil || r.got != "channel close, disconnect" {
		t.Errorf("the gateway read %q, %v; want ssh's last packets, then EOF", r.got, r.err)
	}
	if werr != nil || stderr != "" {
		t.Errorf("the proxy ended with %v, stderr %q; want exit 0 and nothing", werr, stderr)
	}
	if r.writeTo != nil || out != "gateway's last words" {
		t.Errorf("ssh's pipe got %q (the gateway's write: %v), want the gateway's last bytes", out, r.writeTo)
	}
}

// hangUpProxy runs sandgate proxy --transport transport to apiURL between
// pipes and, once the gateway says the tunnel is up (connected), ends it
// as ssh's exit does: its last packets on stdin, stdin closed, SIGHUP
// (then hupSent is closed). It returns what reached stdout, the proxy's
// end and its stderr.
func hangUpProxy(t *testing.T, apiURL, transport string, connected, hupSent chan struct{}) (string, error, string) {
	t.Helper()
	cmd := exec.Command(sandgateBin, "proxy", "--api-url", apiURL, "--transport", transport, "sbx-hup")
	cmd.Env = cleanEnv()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	timer := time.AfterFunc(60*time.Second, func() { _ = cmd.Process.Kill() })
	defer timer.Stop()
	select {
	case <-connected:
	case <-time.After(60 * time.Second):
		t.Fatal("no tunnel in 60 s")
	}
	if _, err := io.WriteString(stdin, "channel close, disconnect"); err != nil {
		t.Fatal(err)
	}
	stdin.Close()
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	close(hupSent)
	out, _ := io.ReadAll(stdout)
	werr := cmd.Wait()
	return string(out), werr, stderr.String()
}

// The same end through a WebSocket: ssh's last packets arrive as a
// message, then the proxy's close frame; the gateway's last message
// still reaches ssh's pipe and its close answer ends the relay.
func TestProxyHangupEndsTheWebSocket(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the splicing relay is Linux only")
	}
	hupSent, connected := make(chan struct{}), make(chan struct{})
	type result struct {
		got string
		err error
	}
	gw := make(chan result, 1)
	up := sync.OnceFunc(func() { close(connected) })
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer up() // a failure is reported below, at gw
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			gw <- result{err: err}
			return
		}
		defer c.CloseNow()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		up()
		_, p, err := c.Read(ctx)
		if err != nil {
			gw <- result{err: fmt.Errorf("read ssh's last packets: %w", err)}
			return
		}
		<-hupSent
		if err := c.Write(ctx, websocket.MessageBinary, []byte("gateway's last words")); err != nil {
			gw <- result{got: string(p), err: fmt.Errorf("write: %w", err)}
			return
		}
		_, _, err = c.Read(ctx) // the proxy's close, answered by the library
		var ce websocket.CloseError
		if !errors.As(err, &ce) || ce.Code != websocket.StatusNormalClosure {
			gw <- result{got: string(p), err: fmt.Errorf("the read after ssh's packets: %v, want the proxy's close 1000", err)}
			return
		}
		gw <- result{got: string(p)}
	}))
	t.Cleanup(srv.Close)
	out, werr, stderr := hangUpProxy(t, srv.URL, "websocket", connected, hupSent)
	r := <-gw
	if r.err != nil || r.got != "channel close, disconnect" {
		t.Errorf("the gateway got %q, %v; want ssh's last packets, then the proxy's close frame", r.got, r.err)
	}
	if werr != nil || stderr != "" {
		t.Errorf("the proxy ended with %v, stderr %q; want exit 0 and nothing", werr, stderr)
	}
	if out != "gateway's last words" {
		t.Errorf("ssh's pipe got %q, want the gateway's last message", out)
	}
}

// A proxy started with SIGHUP ignored (nohup ssh ...: ssh and its
// ProxyCommand inherit the ignored signal) must keep ignoring it: the
// terminal's hangup reaches the proxy too, and catching it ended the
// tunnel of the ssh that nohup kept alive, linger later.
func TestProxyHangupIgnoredStaysIgnored(t *testing.T) {
	signal.Ignore(syscall.SIGHUP)
	t.Cleanup(func() { signal.Reset(syscall.SIGHUP) })
	hungUp, stop := lingerOnHangup(time.Hour, func() { t.Error("exit called") })
	defer stop()
	if !signal.Ignored(syscall.SIGHUP) {
		t.Fatal("lingerOnHangup un-ignored SIGHUP: a nohup'd ssh loses its tunnel when the terminal closes")
	}
	if hungUp.Load() {
		t.Fatal("hungUp set without a hangup")
	}
}

// An error from the tunnel is not reported when ssh hangs up within the
// grace after it (the gateway's reset at the end of an ended session),
// and is reported when it does not.
func TestProxyErrorWaitsForHangup(t *testing.T) {
	var hungUp atomic.Bool
	go func() {
		time.Sleep(50 * time.Millisecond)
		hungUp.Store(true)
	}()
	if !hangsUpWithin(&hungUp, 5*time.Second) {
		t.Error("a hang-up 50 ms after the error was not seen")
	}
	var never atomic.Bool
	if hangsUpWithin(&never, 20*time.Millisecond) {
		t.Error("no hang-up, yet the error would not be reported")
	}
}
