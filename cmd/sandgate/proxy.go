package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sandgate/sandgate/internal/piperelay"
	"github.com/sandgate/sandgate/tunnel"
)

const defaultAPIURL = "http://127.0.0.1:8080"

// sshNameSuffix makes a session name an OpenSSH host name that the
// ssh-config block matches: ssh dev.sandgate.
const sshNameSuffix = ".sandgate"

// clientFlags are the flags every client subcommand shares.
type clientFlags struct {
	apiURL   string
	token    string
	caFile   string
	insecure bool
}

func (c *clientFlags) register(fs *flag.FlagSet) {
	def := os.Getenv("SANDBOX_API_URL")
	if def == "" {
		def = defaultAPIURL
	}
	fs.StringVar(&c.apiURL, "api-url", def, "gateway URL, may end in /v1 (env SANDBOX_API_URL)")
	fs.StringVar(&c.token, "token", os.Getenv("SANDBOX_API_TOKEN"), "bearer token (env SANDBOX_API_TOKEN)")
	fs.StringVar(&c.caFile, "cacert", os.Getenv("SANDBOX_CA_FILE"), "PEM CA bundle to verify the gateway's certificate (env SANDBOX_CA_FILE)")
	fs.BoolVar(&c.insecure, "insecure", false, "skip TLS certificate verification (testing only)")
}

// tlsConfig returns the TLS settings for https gateways (nil: system roots).
func (c *clientFlags) tlsConfig() (*tls.Config, error) {
	if c.insecure {
		return &tls.Config{InsecureSkipVerify: true}, nil
	}
	if c.caFile == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(c.caFile)
	if err != nil {
		return nil, fmt.Errorf("--cacert: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--cacert: no certificate found in %s", c.caFile)
	}
	return &tls.Config{RootCAs: pool}, nil
}

func (c *clientFlags) dialer() (*tunnel.Dialer, error) {
	tc, err := c.tlsConfig()
	if err != nil {
		return nil, err
	}
	// A burst of ssh logins past the caller's budget of tunnels in SSH
	// authentication waits its turn rather than failing.
	return &tunnel.Dialer{APIURL: c.apiURL, Token: c.token, TLSConfig: tc, RetryStartups: 30 * time.Second}, nil
}

// parseInterspersed parses flags that may come before or after the
// positional arguments and returns the positionals.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// proxyMain is `sandgate proxy SESSION_ID`: it opens a tunnel to the
// session and copies stdin/stdout through it, for use as an OpenSSH ProxyCommand.
func proxyMain(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("proxy", flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	fdpass := fs.Bool("fdpass", false, "hand the tunnelled socket to ssh and exit (needs `ProxyUseFdpass yes`; http:// gateways only)")
	transport := fs.String("transport", envOr("SANDBOX_TRANSPORT", tunnel.TransportConnect),
		"connect (HTTP CONNECT), websocket (GET /v1/sessions/{id}/ssh), or auto (CONNECT, then a WebSocket if something in the way refuses CONNECT) (env SANDBOX_TRANSPORT)")
	pos, code, done := parseCommandFlags(fs, args, `Usage: sandgate proxy [flags] ID|NAME[.sandgate]

An OpenSSH ProxyCommand: opens a tunnel (CONNECT, or a WebSocket with
--transport websocket|auto) to the session, by id or by name (a ".sandgate"
suffix is dropped), and carries ssh's bytes through it. 'sandgate
ssh-config' writes a ~/.ssh/config block that uses it.
`, stdout, stderr)
	if done {
		return code
	}
	if len(pos) != 1 {
		fmt.Fprintln(stderr, "usage: sandgate proxy [--api-url URL] [--token T] [--fdpass] [--transport connect|websocket|auto] ID|NAME[.sandgate]")
		return 2
	}
	// ssh-config's block matches NAME.sandgate beside sbx-*: the gateway
	// takes a session's id or name, without the suffix.
	id := strings.TrimSuffix(pos[0], sshNameSuffix)
	d, err := cf.dialer()
	if err == nil {
		d.Transport, err = tunnel.ParseTransport(*transport)
	}
	if err == nil && *fdpass && d.Transport != tunnel.TransportConnect {
		err = errors.New("--fdpass needs --transport connect: a WebSocket is no socket ssh can use")
	}
	if err != nil {
		fmt.Fprintln(stderr, "sandgate proxy:", err)
		return 2
	}
	if *fdpass {
		// OpenSSH's ProxyUseFdpass: ssh gets the socket itself, so no
		// process stays behind copying every byte of the session.
		out, ok := stdout.(*os.File)
		if !ok {
			fmt.Fprintln(stderr, "sandgate proxy: --fdpass needs stdout to be ssh's socket")
			return 2
		}
		if err := proxyFdpass(context.Background(), d, id, out); err != nil {
			fmt.Fprintln(stderr, "sandgate proxy:", describeDialError(err, id))
			return 1
		}
		return 0
	}
	hungUp, stop := lingerOnHangup(proxyLinger, func() { os.Exit(0) })
	defer stop()
	conn, err := d.Dial(context.Background(), id)
	if err != nil {
		fmt.Fprintln(stderr, "sandgate proxy:", describeDialError(err, id))
		return 1
	}
	defer conn.Close()
	if err := splice(conn, stdin, stdout); err != nil {
		if hangsUpWithin(hungUp, proxyErrGrace) {
			return 0 // ssh has gone: the tunnel's end is nobody's to report
		}
		fmt.Fprintln(stderr, "sandgate proxy:", err)
		return 1
	}
	return 0
}

// proxyLinger bounds how long the proxy outlives ssh. OpenSSH sends its
// ProxyCommand SIGHUP as it exits (ssh_kill_proxy_command), just after
// closing the command's pipes, in which its last packets (the channel's
// close, its disconnect) may still wait. Dying at once dropped them, and
// the gateway's last frame (its answer to the end of the tunnel) then
// met a closed socket, which answered it with a reset: most tunnels
// ended so, the gateway seeing its SSH connection cut instead of ended.
// So the proxy lets its relay finish, as it would without the signal
// (stdin's EOF half-closes the tunnel, or sends a WebSocket's close
// frame, and the relay ends at the gateway's end), for at most
// proxyLinger; and, ssh being gone, it reports no error from then on.
const proxyLinger = 5 * time.Second

// lingerOnHangup catches SIGHUP until stop is called: once one comes,
// hungUp is set, and exit is called after linger unless stop came first.
// A proxy started with SIGHUP ignored (under nohup, or by an ssh run so)
// keeps ignoring it: catching it would end, after linger, the tunnel of
// an ssh that was told to outlive its terminal.
func lingerOnHangup(linger time.Duration, exit func()) (hungUp *atomic.Bool, stop func()) {
	hungUp = new(atomic.Bool)
	if signal.Ignored(syscall.SIGHUP) {
		return hungUp, func() {}
	}
	hup := make(chan os.Signal, 1)
	done := make(chan struct{})
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		select {
		case <-hup:
		case <-done:
			return
		}
		hungUp.Store(true)
		t := time.NewTimer(linger)
		defer t.Stop()
		select {
		case <-t.C:
			exit()
		case <-done:
		}
	}()
	return hungUp, func() {
		signal.Stop(hup)
		close(done)
	}
}

// proxyErrGrace is how long an error from the tunnel waits for ssh to
// hang up before it is reported. When ssh's session has ended, the
// gateway may end the tunnel with a reset (its socket closed with ssh's
// last packets, its disconnect, unread) a moment before ssh exits and
// sends SIGHUP: ssh has had all it needed by then, and the reset is no
// error of the session's. A tunnel lost under a live session makes ssh
// exit with its own error too, so this only drops the proxy's second
// line about it; with SIGHUP ignored, the error is reported after it.
const proxyErrGrace = time.Second

// hangsUpWithin reports whether hungUp is set now or within d.
func hangsUpWithin(hungUp *atomic.Bool, d time.Duration) bool {
	for end := time.Now().Add(d); ; time.Sleep(5 * time.Millisecond) {
		if hungUp.Load() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
	}
}

// upCopyBuf is splice's buffer each way when piperelay does not move the
// bytes (a WebSocket, or TLS): a WebSocket frame each way can be that
// large.
const upCopyBuf = 256 << 10

func describeDialError(err error, id string) string {
	var se *tunnel.StatusError
	if errors.As(err, &se) {
		switch se.StatusCode {
		case http.StatusUnauthorized:
			return "unauthorized (401): the token was missing or rejected; set SANDBOX_API_TOKEN or --token"
		case http.StatusNotFound:
			return fmt.Sprintf("session %q not found (404): it does not exist, has ended, or belongs to another tenant", id)
		}
	}
	return err.Error()
}

// splice copies stdin to conn and conn to stdout. It returns when the
// gateway closes the connection; EOF on stdin half-closes it.
//
// Bytes the dialer read past the CONNECT answer (the gateway's SSH
// banner, usually) go to stdout first; from then on the proxy moves data
// with the socket itself. With ssh's pipes on one side and a TCP socket
// on the other (plain http), piperelay.Relay moves both ways on one
// thread (splice(2) down, one buffer up); so does RelayWebSocket over a
// plain http WebSocket (the frames' payload spliced down, each read of
// ssh's pipe one masked message up, written by the relay); otherwise (https, or no pipes) two copies
// run.
func splice(conn net.Conn, stdin io.Reader, stdout io.Writer) error {
	conn, head := tunnel.Unwrap(conn)
	if len(head) > 0 {
		if _, err := stdout.Write(head); err != nil {
			return err
		}
	}
	if handled, err := piperelay.Relay(conn, stdin, stdout); handled {
		return err
	}
	// A WebSocket over plain http: the gateway's frames are read here and
	// their payload spliced to ssh, as a CONNECT tunnel's bytes are; ssh's
	// go up as masked binary messages the relay writes itself (the only
	// writer of the socket once it has it).
	if ws, ok := conn.(interface{ Socket() (net.Conn, bool) }); ok {
		if handled, err := piperelay.RelayWebSocket(ws.Socket, stdin, stdout); handled {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
	}
	piperelay.GrowPipe(stdout)
	if f, ok := stdin.(*os.File); ok {
		piperelay.GrowPipe(f) // the same pipe from its read end: ssh hands over more per wake-up
	}
	go func() {
		// One big buffer up, as piperelay's: over a WebSocket every write
		// is a frame, so fewer, larger writes are fewer frames to mask,
		// send and unmask. (struct{ io.Reader } hides *os.File's WriteTo,
		// which would copy through its own 32 KiB buffer.)
		_, _ = io.CopyBuffer(conn, struct{ io.Reader }{stdin}, make([]byte, upCopyBuf))
		if cw, ok := conn.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
	}()
	_, err := io.CopyBuffer(struct{ io.Writer }{stdout}, conn, make([]byte, upCopyBuf))
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
