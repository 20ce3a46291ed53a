package sshd_test

// The channel-level harness: an in-memory net.Pipe handed to
// Server.ServeConn, and a fake sandbox whose processes are Go functions.
// No tunnel, no listener, no real process: the tests see exactly what the
// SSH server does with requests, output, exits and failures.

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/internal/gwtest"
	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sshd"
)

// harness is an SSH server serving one session whose sandbox is fake.
type harness struct {
	srv  *sshd.Server
	sb   *fakeSandbox
	sess *gateway.Session
	log  *gwtest.Buffer
}

// newHarness starts an SSH server with cfg (host key and log filled in)
// for a session on sb. Everything stops when the test ends.
func newHarness(t *testing.T, cfg sshd.Config, sb *fakeSandbox) *harness {
	t.Helper()
	return newHarnessGateway(t, cfg, gateway.Config{}, sb)
}

// newHarnessGateway is newHarness with the gateway's configuration gcfg
// (its auditor, its metrics).
func newHarnessGateway(t *testing.T, cfg sshd.Config, gcfg gateway.Config, sb *fakeSandbox) *harness {
	t.Helper()
	h := &harness{sb: sb, log: &gwtest.Buffer{}}
	log := slog.New(slog.NewTextHandler(h.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if len(cfg.HostSigners) == 0 {
		_, key, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		signer, err := gossh.NewSignerFromKey(key)
		if err != nil {
			t.Fatal(err)
		}
		cfg.HostSigners = []gossh.Signer{signer}
	}
	cfg.Log = log
	var err error
	if h.srv, err = sshd.New(cfg); err != nil {
		t.Fatal(err)
	}
	mgr := gateway.NewManager(gcfg, fakeDriver{sb}, log)
	if h.sess, _, err = mgr.Create(context.Background(), gateway.Principal{Tenant: "t"}, gateway.CreateParams{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		h.srv.Shutdown(ctx) // waits for the channels still open
		mgr.Shutdown(ctx, false)
		if ctx.Err() != nil {
			t.Error("the server did not shut down in 10s")
		}
	})
	return h
}

// dial connects an SSH client to the server over a net.Pipe. The client
// closes, and the server has finished with the connection, when the test
// ends.
func (h *harness) dial(t *testing.T) *gossh.Client {
	t.Helper()
	c, err := h.dialWith(t, &gossh.ClientConfig{User: "sandbox", HostKeyCallback: gossh.InsecureIgnoreHostKey(), Timeout: 10 * time.Second})
	if err != nil {
		t.Fatalf("ssh handshake: %v", err)
	}
	return c
}

// dialWith is dial with the client configuration cfg; it returns the
// handshake's error.
func (h *harness) dialWith(t *testing.T, cfg *gossh.ClientConfig) (*gossh.Client, error) {
	t.Helper()
	srvEnd, cliEnd := net.Pipe()
	served := make(chan struct{})
	go func() {
		defer close(served)
		h.srv.ServeConn(srvEnd, h.sess)
	}()
	conn := newAsyncWriteConn(cliEnd)
	cc, chans, reqs, err := gossh.NewClientConn(conn, "pipe", cfg)
	if err != nil {
		conn.Close()
		<-served
		return nil, err
	}
	c := gossh.NewClient(cc, chans, reqs)
	t.Cleanup(func() {
		c.Close()
		<-served
	})
	return c, nil
}

// asyncWriteConn queues writes and sends them from a goroutine. Both SSH
// sides write their version line before reading; on an unbuffered
// net.Pipe that would deadlock, so the client's side does not block.
type asyncWriteConn struct {
	net.Conn
	mu     sync.Mutex
	queue  [][]byte
	err    error
	wake   chan struct{}
	closed chan struct{}
	done   chan struct{}
	once   sync.Once
}

func newAsyncWriteConn(c net.Conn) *asyncWriteConn {
	a := &asyncWriteConn{Conn: c, wake: make(chan struct{}, 1), closed: make(chan struct{}), done: make(chan struct{})}
	go a.loop()
	return a
}

func (a *asyncWriteConn) Write(p []byte) (int, error) {
	a.mu.Lock()
	if a.err != nil {
		a.mu.Unlock()
		return 0, a.err
	}
	a.queue = append(a.queue, append([]byte(nil), p...))
	a.mu.Unlock()
	select {
	case a.wake <- struct{}{}:
	default:
	}
	return len(p), nil
}

func (a *asyncWriteConn) loop() {
	defer close(a.done)
	for {
		select {
		case <-a.wake:
		case <-a.closed:
			return
		}
		for {
			a.mu.Lock()
			q := a.queue
			a.queue = nil
			a.mu.Unlock()
			if len(q) == 0 {
				break
			}
			for _, b := range q {
				if _, err := a.Conn.Write(b); err != nil {
					a.mu.Lock()
					a.err = err
					a.mu.Unlock()
					return
				}
			}
		}
	}
}

func (a *asyncWriteConn) Close() error {
	err := a.Conn.Close()
	a.once.Do(func() { close(a.closed) })
	<-a.done
	return err
}

// fakeDriver hands out its one sandbox.
type fakeDriver struct{ sb *fakeSandbox }

func (d fakeDriver) Create(context.Context, sandbox.Spec) (sandbox.Sandbox, error) { return d.sb, nil }

// fakeSandbox starts fakeProcs. Set its fields before the first dial.
type fakeSandbox struct {
	// run is the program of every process (default: exit 0 at once).
	run func(p *fakeProc) sandbox.Exit
	// startErr, when set, is Start's error.
	startErr error
	// panicOnStdout makes reading a process's stdout panic.
	panicOnStdout bool
	// osStdin gives every process a stdin that is an OS pipe, as the real
	// drivers' are, instead of an io.Pipe.
	osStdin bool

	started chan *fakeProc // every process started, in order

	// dial, when set, is DialLoopback (default: refused).
	dial func(ctx context.Context, network string, port int) (net.Conn, error)
}

// DialLoopback implements sandbox.LoopbackDialer with f.dial.
func (f *fakeSandbox) DialLoopback(ctx context.Context, network string, port int) (net.Conn, error) {
	if f.dial == nil {
		return nil, errors.New("connection refused")
	}
	return f.dial(ctx, network, port)
}

func newFakeSandbox() *fakeSandbox { return &fakeSandbox{started: make(chan *fakeProc, 128)} }

func (f *fakeSandbox) Workdir() string                   { return "/nonexistent" }
func (f *fakeSandbox) Destroy(ctx context.Context) error { return nil }

func (f *fakeSandbox) Start(ctx context.Context, cmd sandbox.Cmd) (sandbox.Process, error) {
	if f.startErr != nil {
		return nil, f.startErr
	}
	if cmd.PTY != nil { // as it was at the start: the server keeps the window current
		pty := *cmd.PTY
		cmd.PTY = &pty
	}
	p := &fakeProc{
		Cmd: cmd, Ctx: ctx,
		Signals: make(chan syscall.Signal, 16), Resizes: make(chan sandbox.Window, 16),
		Killed: make(chan struct{}), exit: make(chan sandbox.Exit, 1), panicOnStdout: f.panicOnStdout,
	}
	if f.osStdin {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		p.stdinR, p.stdinW = r, w
	} else {
		p.stdinR, p.stdinW = io.Pipe()
	}
	p.stdoutR, p.stdoutW = io.Pipe()
	p.In, p.Out = p.stdinR, p.stdoutW
	if cmd.PTY == nil {
		p.stderrR, p.stderrW = io.Pipe()
		p.Err = p.stderrW
	}
	run := f.run
	if run == nil {
		run = func(*fakeProc) sandbox.Exit { return sandbox.Exit{} }
	}
	go func() {
		e := run(p)
		if !p.HoldOutput {
			p.stdoutW.Close()
			if p.stderrW != nil {
				p.stderrW.Close()
			}
		}
		p.stdinR.Close()
		p.exit <- e
	}()
	f.started <- p
	return p, nil
}

// next returns the next process started, or fails the test.
func (f *fakeSandbox) next(t *testing.T) *fakeProc {
	t.Helper()
	select {
	case p := <-f.started:
		return p
	case <-time.After(10 * time.Second):
		t.Fatal("no process started")
		return nil
	}
}

// fakeProc is a process whose program is a Go function: it reads In,
// writes Out and Err (nil with a PTY), sees Signals, Resizes and Killed,
// and returns its exit.
type fakeProc struct {
	Cmd      sandbox.Cmd
	Ctx      context.Context // the context Start got
	In       io.Reader
	Out, Err io.Writer
	Signals  chan syscall.Signal
	Resizes  chan sandbox.Window
	Killed   chan struct{}
	// HoldOutput, set by the program, keeps its output open after it
	// returns, as a background child holding stdout would.
	HoldOutput bool

	stdinR           io.ReadCloser  // an *io.PipeReader or an *os.File
	stdinW           io.WriteCloser // its other end
	stdoutR, stderrR *io.PipeReader
	stdoutW, stderrW *io.PipeWriter
	exit             chan sandbox.Exit
	kill             sync.Once
	panicOnStdout    bool
}

func (p *fakeProc) Stdin() io.WriteCloser { return p.stdinW }

func (p *fakeProc) Stdout() io.ReadCloser {
	if p.panicOnStdout {
		return panicReader{p.stdoutR}
	}
	return p.stdoutR
}

func (p *fakeProc) Stderr() io.ReadCloser {
	if p.stderrR == nil {
		return nil
	}
	return p.stderrR
}

func (p *fakeProc) Resize(w sandbox.Window) error {
	if p.Cmd.PTY == nil {
		return errors.New("no pty")
	}
	p.Resizes <- w
	return nil
}

func (p *fakeProc) Signal(sig syscall.Signal) error {
	select {
	case p.Signals <- sig:
		return nil
	default:
		return errors.New("signal queue full")
	}
}

func (p *fakeProc) Wait() (sandbox.Exit, error) { return <-p.exit, nil }

func (p *fakeProc) Kill() {
	p.kill.Do(func() {
		close(p.Killed)
		if r, ok := p.stdinR.(*io.PipeReader); ok {
			r.CloseWithError(errors.New("killed"))
		} else {
			p.stdinR.Close()
		}
	})
}

type panicReader struct{ io.ReadCloser }

func (panicReader) Read([]byte) (int, error) { panic("fake stdout read panics") }

// untilKilled is a program that runs until it is killed.
func untilKilled(p *fakeProc) sandbox.Exit {
	<-p.Killed
	return sandbox.Exit{Signal: "KILL"}
}

// wire is what a client saw on one session channel.
type wire struct {
	ok             bool     // the reply to the start request
	stdout, stderr string   // everything up to EOF
	reqs           []string // the server's channel requests, in order
	status         int      // exit-status, -1 when none came
	signal         string   // exit-signal's name
}

// session opens a session channel, sends pre (each must be accepted),
// then the start request, and reads everything until the server closes
// the channel.
func session(t *testing.T, c *gossh.Client, pre []*request, start *request) wire {
	t.Helper()
	ch, reqs, err := c.OpenChannel("session", nil)
	if err != nil {
		t.Fatalf("open channel: %v", err)
	}
	defer ch.Close()
	for _, r := range pre {
		if ok, err := ch.SendRequest(r.typ, true, r.payload); err != nil || !ok {
			t.Fatalf("%s: ok=%v err=%v", r.typ, ok, err)
		}
	}
	w := wire{status: -1}
	w.ok, err = ch.SendRequest(start.typ, true, start.payload)
	if err != nil {
		t.Fatalf("%s: %v", start.typ, err)
	}
	if !w.ok {
		return w
	}
	var out, errOut []byte
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); out, _ = io.ReadAll(ch) }()
	go func() { defer wg.Done(); errOut, _ = io.ReadAll(ch.Stderr()) }()
	timeout := time.After(20 * time.Second)
loop:
	for {
		select {
		case r, ok := <-reqs:
			if !ok {
				break loop // the server closed the channel
			}
			w.reqs = append(w.reqs, r.Type)
			switch r.Type {
			case "exit-status":
				var s struct{ Status uint32 }
				if err := gossh.Unmarshal(r.Payload, &s); err != nil {
					t.Fatal(err)
				}
				w.status = int(s.Status)
			case "exit-signal":
				var s struct {
					Signal     string
					CoreDumped bool
					Msg, Lang  string
				}
				if err := gossh.Unmarshal(r.Payload, &s); err != nil {
					t.Fatal(err)
				}
				w.signal = s.Signal
			}
			if r.WantReply {
				_ = r.Reply(false, nil)
			}
		case <-timeout:
			t.Fatalf("the server did not close the channel; requests so far %v", w.reqs)
		}
	}
	wg.Wait()
	w.stdout, w.stderr = string(out), string(errOut)
	return w
}

// request is a channel request to send.
type request struct {
	typ     string
	payload []byte
}

func execReq(cmd string) *request {
	return &request{"exec", gossh.Marshal(struct{ Command string }{cmd})}
}

func shellReq() *request { return &request{"shell", nil} }

func subsystemReq(name string) *request {
	return &request{"subsystem", gossh.Marshal(struct{ Name string }{name})}
}

func envReq(name, value string) *request {
	return &request{"env", gossh.Marshal(struct{ Name, Value string }{name, value})}
}

func ptyReq(term string, cols, rows uint32) *request {
	return &request{"pty-req", gossh.Marshal(struct {
		Term                         string
		Columns, Rows, Width, Height uint32
		Modes                        string
	}{term, cols, rows, 0, 0, ""})}
}

func windowReq(cols, rows uint32) *request {
	return &request{"window-change", gossh.Marshal(struct{ Columns, Rows, Width, Height uint32 }{cols, rows, 0, 0})}
}

func signalReq(name string) *request {
	return &request{"signal", gossh.Marshal(struct{ Signal string }{name})}
}
