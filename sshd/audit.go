package sshd

import (
	"context"
	"errors"
	"io"
	"sync/atomic"
	"time"

	gliderssh "github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/gateway"
)

// withRequest keeps the CONNECT request's identity in the connection's
// context, for requestCtx.
func withRequest(ctx gliderssh.Context, r audit.Request) {
	ctx.SetValue(keyRequest, r)
}

// requestCtx is ctx carrying the connection's CONNECT request (see
// audit.WithRequest), so that log lines and audit events name it.
func requestCtx(ctx context.Context) context.Context {
	if r, ok := ctx.Value(keyRequest).(audit.Request); ok {
		return audit.WithRequest(ctx, r)
	}
	return ctx
}

func (s *Server) auditor() audit.Auditor { return audit.Or(s.cfg.Audit) }

// auditAuth records a finished authentication attempt; the "none" probe
// clients send first to learn the methods is no attempt.
func (s *Server) auditAuth(ctx gliderssh.Context, method string, err error) {
	if errors.Is(err, gossh.ErrNoAuth) {
		return
	}
	sess := sessionOf(ctx)
	if sess == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "denied"
	}
	// Auth names the SSH method here: the tunnel's own (api_key, jwt)
	// is in the tunnel's events.
	sess.Audit(requestCtx(ctx), audit.Event{Kind: audit.KindSSHAuth, Auth: method, Result: result})
}

// sftpTap is the SFTP tap of one channel (audit.SFTPTap): a panic in it
// turns it off and never reaches the copies.
type sftpTap struct {
	tap *audit.SFTPTap
	off atomic.Bool
}

func (c *channel) newSFTPTap() *sftpTap {
	ctx := c.ctx
	return &sftpTap{tap: audit.NewSFTPTap(func(e audit.Event) { c.sess.Audit(ctx, e) })}
}

func (t *sftpTap) feed(f func([]byte), p []byte) {
	if t.off.Load() {
		return
	}
	defer func() {
		if recover() != nil {
			t.off.Store(true)
		}
	}()
	f(p)
}

func (t *sftpTap) close() { t.feed(func([]byte) { t.tap.Close() }, nil) }

// clientView returns what shows the tap the client's requests, on their
// way to the server.
func (t *sftpTap) clientView() func([]byte) {
	return func(p []byte) { t.feed(t.tap.Client, p) }
}

// server returns w, showing the tap the server's replies.
func (t *sftpTap) server(w io.Writer) io.Writer {
	return tapWriter{w, func(p []byte) { t.feed(t.tap.Server, p) }}
}

// tapWriter shows each write to tap, then passes it to w. The tap sees a
// request before the server can answer it, and an answer before the
// client can send what follows from it (a WRITE on a new handle).
type tapWriter struct {
	w   io.Writer
	tap func([]byte)
}

func (t tapWriter) Write(p []byte) (int, error) {
	t.tap(p)
	return t.w.Write(p)
}

// auditShell records an interactive shell (or a command that did not
// start) as a command: an exec that started is the history's to record.
func (c *channel) auditCommand(kind, command string, exit *int, signal, result string, durationMs int64) {
	c.sess.Audit(c.ctx, audit.Event{Kind: audit.KindCommand, Source: kind, Command: command,
		ExitCode: exit, Signal: signal, Result: result, DurationMs: durationMs})
}

// auditSource is the audit's source of an SSH command kind.
func auditSource(kind string) string {
	if kind == "shell" {
		return "shell"
	}
	return "ssh"
}

// forwardAudit records one direct-tcpip (ssh -L) channel: refused, or
// ended with the bytes it moved each way.
type forwardAudit struct {
	ctx   context.Context
	sess  *gateway.Session
	host  string
	port  int
	start time.Time
}

func (s *Server) newForwardAudit(ctx gliderssh.Context, sess *gateway.Session, host string, port uint32) *forwardAudit {
	return &forwardAudit{ctx: requestCtx(ctx), sess: sess, host: host, port: int(port), start: time.Now()}
}

// refused records a channel that was not opened: result names why.
func (f *forwardAudit) refused(result, reason string) {
	f.sess.Audit(f.ctx, audit.Event{Kind: audit.KindForward, Host: f.host, Port: f.port, Result: result, Reason: reason})
}

// ended records a channel that was open, once both directions are done.
func (f *forwardAudit) ended(in, out int64) {
	f.sess.Audit(f.ctx, audit.Event{Kind: audit.KindForward, Host: f.host, Port: f.port, Result: "ok",
		BytesIn: in, BytesOut: out, DurationMs: time.Since(f.start).Milliseconds()})
}
