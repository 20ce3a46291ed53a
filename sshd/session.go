package sshd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os/exec"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	gliderssh "github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/internal/procio"
	"github.com/sandgate/sandgate/sandbox"
)

// Bounds on what a client may send before starting a command.
const (
	maxEnvVars  = 64
	maxEnvBytes = 4096
)

// Exit statuses for a command that did not start, as the client sees them.
// 127 is the shell's "command not found", which a missing shell resembles;
// 255 is what OpenSSH's client reports for its own failures.
const (
	exitNotStarted = 255
	exitNoShell    = 127
)

// errChannelClosed is the cause of a channel context cancelled because the
// client closed the channel.
var errChannelClosed = errors.New("ssh channel closed")

// channel is one SSH session channel: at most one process, its requests,
// and the copying between the two.
type channel struct {
	srv  *Server
	sess *gateway.Session
	ch   gossh.Channel
	conn *boundConn // the channel's connection (nil in some tests)
	// ctx lives as long as the channel: it is cancelled when the client
	// closes the channel or the connection ends. Sandbox.Start gets it.
	ctx context.Context

	env     []string
	connEnv []string // SSH_CLIENT and SSH_CONNECTION, last: the client cannot set them
	pty     *sandbox.PTY
	started bool

	// command is an exec's command (a pause may hand it over: handoff.go).
	command string

	mu          sync.Mutex
	proc        sandbox.Process
	exited      bool
	interactive bool // the process runs on a pty
	// handing says a pause is handing the exec's command to the process
	// API, handedID which process it is now ("" while it is not, or was
	// not, handed over): guarded by mu (handoff.go).
	handing  bool
	handedID string
	// notices are notify's writes in flight: run waits for them before
	// CloseWrite, as x/crypto's channel must not write and close at once.
	notices sync.WaitGroup
	// answering is held while serve handles a request and sends its reply:
	// sendEnd waits for it, so that a command's end never overtakes the
	// reply to the request that ended it (a signal), as in OpenSSH, which
	// answers a request before it notices the child's exit.
	answering sync.Mutex
}

func (s *Server) handleSession(_ *gliderssh.Server, _ *gossh.ServerConn, nc gossh.NewChannel, ctx gliderssh.Context) {
	defer func() {
		if v := recover(); v != nil {
			s.cfg.Log.Error("ssh_channel_panic", "panic", v)
		}
	}()
	sess := sessionOf(ctx)
	if sess == nil || !sess.Live() {
		_ = nc.Reject(gossh.Prohibited, "session is gone")
		return
	}
	bc, _ := ctx.Value(keyConn).(*boundConn)
	if bc != nil {
		if bc.chans.Add(1) > MaxChannelsPerConn {
			bc.chans.Add(-1)
			_ = nc.Reject(gossh.ResourceShortage, fmt.Sprintf("too many open channels on this connection (max %d)", MaxChannelsPerConn))
			return
		}
		defer bc.chans.Add(-1)
	}
	cctx, cancel := context.WithCancelCause(requestCtx(ctx))
	defer cancel(errChannelClosed)
	remote, _ := ctx.Value(gliderssh.ContextKeyRemoteAddr).(net.Addr)
	local, _ := ctx.Value(gliderssh.ContextKeyLocalAddr).(net.Addr)
	c := &channel{srv: s, sess: sess, ctx: cctx, conn: bc, connEnv: connEnv(remote, local)}
	if !s.addChan(c) {
		_ = nc.Reject(gossh.ResourceShortage, "gateway is shutting down")
		return
	}
	defer s.removeChan(c)
	ch, reqs, err := nc.Accept()
	if err != nil {
		return
	}
	c.ch = ch
	c.serve(reqs, cancel)
}

// answer handles req and sends its reply, holding answering; for a
// request that starts a command it returns what runs it.
func (c *channel) answer(req *gossh.Request) (launch func()) {
	c.answering.Lock()
	defer c.answering.Unlock()
	ok := false
	switch req.Type {
	case "env":
		ok = c.setEnv(req.Payload)
	case "pty-req":
		ok = c.setPTY(req.Payload)
	case "window-change":
		ok = c.resize(req.Payload)
	case "exec", "shell", "subsystem":
		launch, ok = c.start(req.Type, req.Payload)
	case "signal":
		ok = c.signal(req.Payload)
	case "eow@openssh.com":
		c.endOfWrite()
	default:
		// auth-agent-req, x11-req and anything else: refused.
	}
	if req.WantReply {
		_ = req.Reply(ok, nil)
	}
	return launch
}

// serve answers the channel's requests until the client closes it, then
// cancels the channel's context.
func (c *channel) serve(reqs <-chan *gossh.Request, cancel context.CancelCauseFunc) {
	var runDone chan struct{}
	for req := range reqs {
		launch := c.answer(req)
		if launch != nil {
			runDone = make(chan struct{})
			go func() {
				defer close(runDone)
				defer c.recoverPanic("run", func() {
					c.abort()
					_ = c.ch.Close()
				})
				launch()
			}()
		}
	}
	// The client closed the channel: a command still running is killed.
	cancel(errChannelClosed)
	c.abort()
	if runDone != nil {
		<-runDone
	}
	_ = c.ch.Close()
}

func (c *channel) setEnv(payload []byte) bool {
	var kv struct{ Name, Value string }
	if c.started || gossh.Unmarshal(payload, &kv) != nil {
		return false
	}
	if len(c.env) >= maxEnvVars || len(kv.Name)+len(kv.Value) > maxEnvBytes || !c.srv.envAllowed(kv.Name) {
		return false
	}
	c.env = append(c.env, kv.Name+"="+kv.Value)
	return true
}

func (c *channel) setPTY(payload []byte) bool {
	var p struct {
		Term                         string
		Columns, Rows, Width, Height uint32
		Modes                        string
	}
	if c.started || c.pty != nil || gossh.Unmarshal(payload, &p) != nil || len(p.Term) > 256 {
		return false
	}
	c.pty = &sandbox.PTY{Term: p.Term, Window: window(p.Columns, p.Rows)}
	return true
}

func window(cols, rows uint32) sandbox.Window {
	return sandbox.Window{Cols: uint16(min(cols, 0xffff)), Rows: uint16(min(rows, 0xffff))}
}

func (c *channel) resize(payload []byte) bool {
	var w struct{ Columns, Rows, Width, Height uint32 }
	if c.pty == nil || gossh.Unmarshal(payload, &w) != nil {
		return false
	}
	c.pty.Window = window(w.Columns, w.Rows)
	c.mu.Lock()
	p := c.proc
	c.mu.Unlock()
	if p != nil {
		return p.Resize(c.pty.Window) == nil
	}
	return true
}

func (c *channel) signal(payload []byte) bool {
	var s struct{ Signal string }
	if gossh.Unmarshal(payload, &s) != nil {
		return false
	}
	sig, ok := sandbox.ParseSignal(s.Signal)
	if !ok {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc == nil || c.exited {
		return false
	}
	return c.proc.Signal(sig) == nil
}

// endOfWrite handles eow@openssh.com: the client can no longer write what
// it is sent (its output was closed: `ssh host cmd | head`). As OpenSSH's
// server does, the command's output is closed, so its next write fails
// (SIGPIPE) instead of running on into nowhere. A command on a pty keeps
// its terminal.
func (c *channel) endOfWrite() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc == nil || c.exited || c.interactive {
		return
	}
	_ = c.proc.Stdout().Close()
}

// start starts the process for an exec, shell or subsystem request and
// returns the function that runs it to the end, to be called after the reply.
// A request that is well formed is accepted even when the process cannot
// start: the function then reports why on the channel, as a shell would,
// because a refused request tells the client nothing.
func (c *channel) start(kind string, payload []byte) (func(), bool) {
	if c.started {
		return nil, false
	}
	cmd := sandbox.Cmd{Env: slices.Concat(c.env, c.connEnv), PTY: c.pty}
	switch kind {
	case "exec":
		var p struct{ Command string }
		if gossh.Unmarshal(payload, &p) != nil {
			return nil, false
		}
		if p.Command == "" {
			// Like OpenSSH, an empty command means a shell.
			kind = "shell"
		}
		cmd.Command = p.Command
	case "subsystem":
		var p struct{ Name string }
		if gossh.Unmarshal(payload, &p) != nil || p.Name != "sftp" {
			return nil, false
		}
		cmd.Subsystem = p.Name
		cmd.PTY = nil
	}
	c.started = true
	// The context ends with the channel; the drivers use it for the start
	// only, and the process ends through abort.
	proc, err := c.sess.Start(c.ctx, cmd, gateway.SSHStart)
	if err != nil {
		c.srv.cfg.Log.WarnContext(c.ctx, "exec_start_failed", "session", c.sess.ID, "kind", kind, "err", err)
		return func() { c.reportStartFailure(kind, cmd.Command, cmd.PTY != nil, err) }, true
	}
	c.mu.Lock()
	c.proc = proc
	c.interactive = cmd.PTY != nil
	c.command = cmd.Command
	c.mu.Unlock()
	c.sess.Touch(time.Now())
	c.srv.cfg.Log.InfoContext(c.ctx, "exec_started", "session", c.sess.ID, "kind", kind, "pty", cmd.PTY != nil)
	return func() { c.run(kind, proc) }, true
}

// startFailureStatus is the exit status reported for a start error: 127
// when the shell (or the sftp server) does not exist, 255 otherwise.
func startFailureStatus(err error) uint32 {
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, exec.ErrNotFound) {
		return exitNoShell
	}
	return exitNotStarted
}

// connEnv is what OpenSSH tells every command about its connection:
// SSH_CLIENT ("client-ip client-port server-port") and SSH_CONNECTION
// ("client-ip client-port server-ip server-port"), here for the tunnel's
// TCP connection to the gateway. Shells and tools test them to know they
// run under SSH (Debian's bash reads ~/.bashrc for `ssh host command`
// only then). The client end is the gateway's TCP peer: behind a load
// balancer, or through a cluster's front node, that is the balancer or
// the node, as it would be for OpenSSH. An end that is not an IP address
// (or is missing) is UNKNOWN port 65535, as in OpenSSH.
func connEnv(remote, local net.Addr) []string {
	rip, rport := addrParts(remote)
	lip, lport := addrParts(local)
	return []string{
		fmt.Sprintf("SSH_CLIENT=%s %d %d", rip, rport, lport),
		fmt.Sprintf("SSH_CONNECTION=%s %d %s %d", rip, rport, lip, lport),
	}
}

func addrParts(a net.Addr) (string, int) {
	if t, ok := a.(*net.TCPAddr); ok && t != nil && t.IP != nil {
		return t.IP.String(), t.Port
	}
	return "UNKNOWN", 65535
}

// reportStartFailure tells the client why its command did not start: one
// line on stderr (on the terminal for a pty), then the exit status, EOF
// and close, the order run keeps.
func (c *channel) reportStartFailure(kind, command string, pty bool, err error) {
	c.mu.Lock()
	c.exited = true
	c.mu.Unlock()
	msg := "sandgate: cannot start command: " + err.Error()
	if pty {
		_, _ = io.WriteString(c.ch, msg+"\r\n")
	} else {
		_, _ = io.WriteString(c.ch.Stderr(), msg+"\n")
	}
	status := startFailureStatus(err)
	c.srv.cfg.Log.InfoContext(c.ctx, "exec_finished", "session", c.sess.ID, "kind", kind, "exit_code", status, "started", false)
	if kind != "subsystem" {
		code := int(status)
		c.auditCommand(auditSource(kind), command, &code, "", "not_started", 0)
	}
	_, _ = c.ch.SendRequest("exit-status", false, gossh.Marshal(struct{ Status uint32 }{status}))
	_ = c.ch.CloseWrite()
	_ = c.ch.Close()
}

// run copies between the channel and proc until proc exits and its output
// is drained, then sends the exit status, EOF and close, in that order.
func (c *channel) run(kind string, proc sandbox.Process) {
	// A command running is work in progress, however quiet (a build, an
	// idle shell): the idle timeout waits for it (the TTL still ends it).
	defer c.sess.Hold()()
	// A pause by checkpoint hands an exec's command to the process API
	// rather than end it (handoff.go).
	var ho *handoff
	if kind == "exec" {
		ho = c.offerHandoff(proc)
		if ho != nil {
			defer ho.remove()
		}
	}
	// A pause ends the connection: say why first, on the channel's stderr
	// (a command handed over says it itself: endHandedOff).
	if remove, ok := c.sess.AddPauseNotice(func() {
		if ho.waitWritten(c) {
			return
		}
		_, _ = io.WriteString(c.ch.Stderr(), "\r\nsandgate: "+gateway.ConnClosedPaused+"\r\n")
	}); ok {
		defer remove()
	}
	began := time.Now()
	a := &activity{sess: c.sess}
	var stdout io.Writer = c.ch
	var tap *sftpTap
	var seeIn func([]byte)   // shown the client's bytes before the command
	if kind == "subsystem" { // SFTP: the tap reports its file operations
		tap = c.newSFTPTap()
		seeIn, stdout = tap.clientView(), tap.server(stdout)
	}
	// drained is closed when every output copier is done: the last one
	// closes it (no goroutine waits for them, so an exit whose output is
	// already through goes straight on to its status).
	drained := make(chan struct{})
	stdoutR, stderr := procio.NewOutput(proc.Stdout()), procio.NewOutput(proc.Stderr())
	var outLeft atomic.Int32
	outLeft.Store(1)
	if stderr != nil {
		outLeft.Store(2)
	}
	copyOut := func(name string, dst io.Writer, src io.Reader) {
		go func() {
			defer func() {
				if outLeft.Add(-1) == 0 {
					close(drained)
				}
			}()
			defer c.recoverPanic(name, c.abort)
			_, _ = copyStream(a.writer(dst), src, &c.srv.bufs)
		}()
	}
	copyOut("stdout", stdout, stdoutR)
	if stderr != nil {
		copyOut("stderr", c.ch.Stderr(), stderr)
	}
	// The stdin copier is not waited for: the client may never send EOF.
	go func() {
		defer c.recoverPanic("stdin", c.abort)
		defer func() { _ = proc.Stdin().Close() }()
		_, _ = copyIn(proc.Stdin(), c.ch, seeIn, a.touch, &c.srv.bufs)
	}()

	// The command's audit event and metrics (a shell's event) follow the
	// end, off the client's wait (an exec's history entry does not: a
	// client that asks for the history once it has the exit status finds
	// the command there), but never wait on the client for more than
	// maxReportDelay: one that does not read would otherwise put them
	// off until the connection closes (and a crash in between would lose
	// them).
	report := gateway.ReportLater(proc)
	exit, err := proc.Wait()
	if errors.Is(err, sandbox.ErrHandedOff) && ho != nil {
		c.endHandedOff(ho, drained, stdoutR, stderr, began)
		return
	}
	var reported sync.Once
	reportNow := func() {
		reported.Do(func() {
			report()
			if kind == "shell" { // an exec is recorded by the session's history
				var code *int
				if err == nil && exit.Signal == "" {
					code = &exit.Code
				}
				c.auditCommand("shell", "", code, exit.Signal, "", time.Since(began).Milliseconds())
			}
		})
	}
	late := time.AfterFunc(maxReportDelay, reportNow)
	c.mu.Lock()
	c.exited = true
	c.mu.Unlock()

	// Everything the command wrote is forwarded, however slowly the
	// client reads; output a background process holds open is forwarded
	// for OutputGrace more. When the copiers are through already (they
	// read to EOF as the command exited), the streams are closed after
	// the end, off the client's wait.
	select {
	case <-drained:
		defer closeOutputs(stdoutR, stderr)
	default:
		procio.Drain(drained, c.srv.cfg.OutputGrace, stdoutR, stderr)
	}

	if tap != nil {
		tap.close()
	}
	took := time.Since(began).Milliseconds()
	c.notices.Wait() // exited is set: no new notice starts
	c.sendEnd(exit, err)
	late.Stop()
	reportNow()
	// The log line follows the end, off the client's wait.
	attrs := []any{"session", c.sess.ID, "kind", kind, "duration_ms", took}
	switch {
	case err != nil:
		c.srv.cfg.Log.ErrorContext(c.ctx, "exec_finished", append(attrs, "exit_code", 255, "err", err)...)
	case exit.Signal == "":
		c.srv.cfg.Log.InfoContext(c.ctx, "exec_finished", append(attrs, "exit_code", exit.Code)...)
	default:
		c.srv.cfg.Log.InfoContext(c.ctx, "exec_finished", append(attrs, "signal", exit.Signal)...)
	}
}

// maxReportDelay bounds how long after its exit an exec's audit event and
// metrics wait for its end to be sent (see run).
const maxReportDelay = time.Second

// closeOutputs closes a command's output streams (stderr is nil with a
// PTY).
func closeOutputs(outs ...*procio.Output) {
	for _, o := range outs {
		if o != nil {
			_ = o.Close()
		}
	}
}

// sendEnd sends the exit status (or signal), EOF and close. They leave in
// one write, as OpenSSH's one buffered write sends them: the tunnel is
// held (boundConn.hold) only around these three packets, none of which
// waits for the peer but in a key exchange (the hold then ends after
// maxHold).
func (c *channel) sendEnd(exit sandbox.Exit, err error) {
	c.answering.Lock() // a reply being sent goes first
	c.answering.Unlock()
	defer c.conn.hold()()
	switch {
	case err != nil:
		_, _ = c.ch.SendRequest("exit-status", false, gossh.Marshal(struct{ Status uint32 }{255}))
	case exit.Signal == "":
		_, _ = c.ch.SendRequest("exit-status", false, gossh.Marshal(struct{ Status uint32 }{uint32(exit.Code)}))
	default:
		_, _ = c.ch.SendRequest("exit-signal", false, gossh.Marshal(struct {
			Signal     string
			CoreDumped bool
			Message    string
			Lang       string
		}{exit.Signal, exit.CoreDumped, "", ""}))
	}
	_ = c.ch.CloseWrite()
	_ = c.ch.Close()
}

// recoverPanic, deferred in each helper goroutine of the channel, stops a
// panic there from taking the gateway down: it logs the panic, then calls
// end (when non-nil), which makes sure the channel still ends: a copier
// kills the command, whose end run reports as usual.
func (c *channel) recoverPanic(what string, end func()) {
	v := recover()
	if v == nil {
		return
	}
	c.srv.cfg.Log.ErrorContext(c.ctx, "ssh_channel_panic", "session", c.sess.ID, "in", what, "panic", v, "stack", string(debug.Stack()))
	if end != nil {
		end()
	}
}

// abort kills the channel's process if it is still running.
func (c *channel) abort() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc != nil && !c.exited {
		c.proc.Kill()
	}
}

// notify writes msg to an interactive user's terminal.
func (c *channel) notify(msg string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.interactive && !c.exited {
		c.notices.Add(1)
		go func() {
			defer c.notices.Done()
			defer c.recoverPanic("notify", nil)
			_, _ = io.WriteString(c.ch.Stderr(), msg)
		}()
	}
}

// activity marks the session active whenever data moves.
type activity struct {
	sess *gateway.Session
}

func (a *activity) writer(w io.Writer) io.Writer { return activityWriter{a, w} }

// touch marks the session active now.
func (a *activity) touch() { a.sess.Touch(time.Now()) }

type activityWriter struct {
	a *activity
	w io.Writer
}

func (w activityWriter) Write(p []byte) (int, error) {
	w.a.touch()
	return w.w.Write(p)
}
