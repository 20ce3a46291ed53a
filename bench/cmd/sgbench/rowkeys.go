package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/crypto/ssh"
)

// --- row 12: keystroke echo, SSH shell vs browser terminal (sandgate only) ----
//
// One byte typed, echoed back, on a shell with a PTY in one session: (a) an
// SSH shell (Go x/crypto/ssh through a CONNECT tunnel, pty-req + shell, as
// OpenSSH's `ssh -t` asks), (b) the browser terminal's WebSocket, GET
// /v1/sessions/{id}/terminal (Go coder/websocket, bearer token), which the
// gateway turns into an SSH shell over a socket pair to its own SSH server.
// Both are bash with readline on xterm: the echo is readline's. Each
// keystroke is a printable byte, timed from the write to the first read
// holding it; an untimed DEL then erases it (waiting for its backspace),
// so the line stays short. The two alternate keystroke by keystroke.

const keysRef = "sandgate only: the reference column is an SSH shell (PTY) on the same session, not sshd"

// keystrokeTarget is the extra time the terminal may add to a keystroke's
// echo over the SSH shell's (issue 38): terminal p50 - SSH p50.
const keystrokeTarget = 5 * time.Millisecond

// termIO is one side's shell: write sends keystrokes, out delivers what
// the terminal prints, chunk by chunk.
type termIO struct {
	write func([]byte) error
	out   <-chan []byte
	close func()
}

// await reads t's output until it holds want, or fails after limit.
func (t *termIO) await(want []byte, limit time.Duration) error {
	var seen []byte
	timer := time.NewTimer(limit)
	defer timer.Stop()
	for {
		select {
		case b, ok := <-t.out:
			if !ok {
				return fmt.Errorf("the terminal ended before printing %q (last output %q)", want, tail(seen))
			}
			seen = append(seen, b...)
			if bytes.Contains(seen, want) {
				return nil
			}
		case <-timer.C:
			return fmt.Errorf("no %q from the terminal within %v (last output %q)", want, limit, tail(seen))
		}
	}
}

func tail(b []byte) []byte {
	if len(b) > 200 {
		return b[len(b)-200:]
	}
	return b
}

// keystroke types one printable byte and returns the time until its echo,
// then erases it (untimed).
func (t *termIO) keystroke(k byte) (float64, error) {
	t0 := time.Now()
	if err := t.write([]byte{k}); err != nil {
		return 0, err
	}
	if err := t.await([]byte{k}, 10*time.Second); err != nil {
		return 0, err
	}
	d := time.Since(t0).Seconds()
	if err := t.write([]byte{0x7f}); err != nil {
		return 0, err
	}
	return d, t.await([]byte{'\b'}, 10*time.Second)
}

// ready waits for the shell to run a command, so that its start-up output
// is behind us.
func (t *termIO) ready() error {
	if err := t.write([]byte("echo ready-$((20+22))\r")); err != nil {
		return err
	}
	if err := t.await([]byte("ready-42"), 30*time.Second); err != nil {
		return err
	}
	// The prompt after it.
	time.Sleep(200 * time.Millisecond)
	for {
		select {
		case <-t.out:
		default:
			return nil
		}
	}
}

// sshShell opens a PTY shell over an SSH connection to s.
func (b *bench) sshShell(s *session) (*termIO, error) {
	c, err := b.sg.sshClient(s)
	if err != nil {
		return nil, err
	}
	sess, err := c.NewSession()
	if err != nil {
		c.Close()
		return nil, err
	}
	stdin, err := sess.StdinPipe()
	var stdout io.Reader
	if err == nil {
		stdout, err = sess.StdoutPipe()
	}
	if err == nil {
		err = sess.RequestPty("xterm-256color", 24, 80, ssh.TerminalModes{})
	}
	if err == nil {
		err = sess.Shell()
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	out := make(chan []byte, 64)
	go func() {
		defer close(out)
		buf := make([]byte, 32<<10)
		for {
			n, err := stdout.Read(buf)
			if n > 0 {
				out <- bytes.Clone(buf[:n])
			}
			if err != nil {
				return
			}
		}
	}()
	return &termIO{
		write: func(p []byte) error { _, err := stdin.Write(p); return err },
		out:   out,
		close: func() { sess.Close(); c.Close() },
	}, nil
}

// webTerminal opens the terminal WebSocket of s, as the console does (but
// with the bearer token, not a ticket).
func (b *bench) webTerminal(ctx context.Context, s *session) (*termIO, error) {
	hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(hctx, b.sg.url+"/v1/sessions/"+s.ID+"/terminal",
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + b.sg.token}}})
	if err != nil {
		if resp != nil && resp.StatusCode == http.StatusNotFound {
			return nil, errNoTerminal
		}
		return nil, err
	}
	c.SetReadLimit(1 << 20)
	out := make(chan []byte, 64)
	go func() {
		defer close(out)
		for {
			typ, msg, err := c.Read(ctx)
			if err != nil {
				return
			}
			if typ == websocket.MessageBinary {
				out <- msg
			}
		}
	}()
	return &termIO{
		write: func(p []byte) error { return c.Write(ctx, websocket.MessageBinary, p) },
		out:   out,
		close: func() { _ = c.Close(websocket.StatusNormalClosure, "") },
	}, nil
}

var errNoTerminal = errors.New("the gateway has no GET /v1/sessions/{id}/terminal")

func (b *bench) rowKeystroke() error {
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	term, err := b.webTerminal(ctx, b.sess)
	if errors.Is(err, errNoTerminal) {
		b.report.add(&Row{ID: "12", Name: "keystroke echo", Skipped: b.cfg.sandgateBin + ": " + err.Error()})
		return nil
	}
	if err != nil {
		return fmt.Errorf("terminal: %w", err)
	}
	defer term.close()
	sh, err := b.sshShell(b.sess)
	if err != nil {
		return fmt.Errorf("ssh shell: %w", err)
	}
	defer sh.close()
	for _, t := range []*termIO{term, sh} {
		if err := t.ready(); err != nil {
			return err
		}
	}
	n := b.cfg.keysN
	var ws, ss []float64
	keys := []byte("abcdefghijklmnopqrstuvwxyz")
	for i := 0; i < n+10; i++ { // 10 warm-ups each
		k := keys[i%len(keys)]
		first, second := term, sh
		if i%2 == 1 {
			first, second = sh, term
		}
		a, err := first.keystroke(k)
		if err != nil {
			return err
		}
		z, err := second.keystroke(k)
		if err != nil {
			return err
		}
		if i%2 == 1 {
			a, z = z, a
		}
		if i >= 10 {
			ws, ss = append(ws, a), append(ss, z)
		}
	}
	wst, sst := NewStats(ws), NewStats(ss)
	name := fmt.Sprintf("keystroke echo, one byte typed and echoed by bash's readline on a PTY, same session, %d each, alternating: browser terminal WebSocket vs SSH shell", n)
	via := "`GET /v1/sessions/{id}/terminal` WebSocket (Go coder/websocket, bearer token), one binary message a keystroke"
	sshVia := "SSH shell, pty-req + shell on one open connection (Go x/crypto/ssh, CONNECT tunnel)"
	verdict := func(w, s float64) string {
		d := time.Duration((w - s) * float64(time.Second))
		ok := "met"
		if d > keystrokeTarget {
			ok = "missed"
		}
		return fmt.Sprintf("terminal adds %.2f ms (target ≤ %v: %s)", d.Seconds()*1e3, keystrokeTarget, ok)
	}
	r := b.report
	r.add(&Row{ID: "12", Name: name, Stat: "p50", Unit: "s", SG: wst, Ref: sst, SGName: via, RefKind: "SSH", RefName: sshVia,
		Note: fmt.Sprintf("%s; p50: %s; both are in-process Go clients; each keystroke is erased (DEL, untimed) before the next", keysRef, verdict(wst.Median, sst.Median))})
	r.add(&Row{ID: "12", Name: name, Stat: "p99", Unit: "s", SG: wst, Ref: sst, SGName: via, RefKind: "SSH", RefName: sshVia,
		Note: fmt.Sprintf("%s; p99: %s", keysRef, verdict(wst.P99, sst.P99))})
	return nil
}
