package tunnel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"

	"github.com/coder/websocket"
	gossh "golang.org/x/crypto/ssh"

	"github.com/sandgate/sandgate/gateway"
)

// A terminal (GET /v1/sessions/{id}/terminal) is a shell on a PTY in the
// session, in a WebSocket: binary messages carry the terminal's bytes both
// ways; text messages carry JSON control: from the client
// {"type":"resize","cols":C,"rows":R}, from the gateway, once the shell
// has ended, {"type":"exit","code":N} (or "signal" in place of "code").
//
// The shell is an SSH shell: the gateway runs an SSH client in process,
// over a pipe to its own SSH server (the ConnHandler), with SSH "none"
// authentication on the tunnel the request authorised. So a terminal has
// the SSH shell's admission, limits, audit, exit and kill rules, with no
// second implementation of them.

// TerminalMessage is a terminal's JSON control message.
type TerminalMessage struct {
	Type   string `json:"type"`             // "resize" or "exit"
	Cols   int    `json:"cols,omitempty"`   // resize
	Rows   int    `json:"rows,omitempty"`   // resize
	Code   *int   `json:"code,omitempty"`   // exit: the shell's status
	Signal string `json:"signal,omitempty"` // exit: the signal that ended it
}

// Terminal defaults, before the client's first resize.
const (
	terminalCols = 80
	terminalRows = 24
	terminalTerm = "xterm-256color"
	// maxTerminalMessage bounds a client's message (keystrokes, a paste).
	maxTerminalMessage = 1 << 20
)

// serveTerminal runs a shell for the WebSocket c through the SSH server
// that handle is, on session s, and returns when it has ended.
func (t *Server) serveTerminal(ctx context.Context, c *websocket.Conn, s *gateway.Session, handle func(net.Conn)) {
	c.SetReadLimit(maxTerminalMessage)
	// A socket pair, not net.Pipe: both SSH ends write their version line
	// first, which a pipe with no buffer would deadlock on.
	client, server, err := socketPair()
	if err != nil {
		_ = c.Close(websocket.StatusInternalError, truncate("socketpair: "+err.Error()))
		return
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		handle(server)
	}()
	defer wg.Wait()
	defer client.Close()
	code, reason := t.runShell(ctx, c, client)
	_ = c.Close(code, reason)
}

// runShell opens the SSH session over conn and relays it; it returns the
// WebSocket close status to end with.
func (t *Server) runShell(ctx context.Context, c *websocket.Conn, conn net.Conn) (websocket.StatusCode, string) {
	sc, chans, reqs, err := gossh.NewClientConn(conn, "sandbox", &gossh.ClientConfig{
		User: "sandbox",
		// A pipe to this gateway's own SSH server: there is no one in
		// between whose key could be checked.
		HostKeyCallback: gossh.InsecureIgnoreHostKey(), //nolint:gosec
	})
	if err != nil {
		return websocket.StatusInternalError, truncate("ssh: " + err.Error())
	}
	cl := gossh.NewClient(sc, chans, reqs)
	defer cl.Close()
	sess, err := cl.NewSession()
	if err != nil {
		return websocket.StatusTryAgainLater, truncate("ssh session: " + err.Error())
	}
	defer sess.Close()
	if err := sess.RequestPty(terminalTerm, terminalRows, terminalCols, gossh.TerminalModes{}); err != nil {
		return websocket.StatusInternalError, truncate("pty: " + err.Error())
	}
	stdin, err := sess.StdinPipe()
	if err != nil {
		return websocket.StatusInternalError, "stdin"
	}
	stdout, err := sess.StdoutPipe()
	if err != nil {
		return websocket.StatusInternalError, "stdout"
	}
	if err := sess.Shell(); err != nil {
		return websocket.StatusInternalError, truncate("shell: " + err.Error())
	}
	// Output: PTY bytes to binary messages.
	outDone := make(chan struct{})
	go func() {
		defer close(outDone)
		buf := make([]byte, 32<<10)
		for {
			n, err := stdout.Read(buf)
			if n > 0 {
				if c.Write(ctx, websocket.MessageBinary, buf[:n]) != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	// Input: binary messages to stdin, text messages are control. It
	// ends when the client goes away (which ends the shell, as a dropped
	// SSH connection does) or the shell ends (cl.Close below).
	inDone := make(chan struct{})
	go func() {
		defer close(inDone)
		defer cl.Close()
		for {
			typ, msg, err := c.Read(ctx)
			if err != nil {
				return
			}
			if typ == websocket.MessageBinary {
				if _, err := stdin.Write(msg); err != nil {
					return
				}
				continue
			}
			var m TerminalMessage
			if json.Unmarshal(msg, &m) == nil && m.Type == "resize" && m.Cols > 0 && m.Rows > 0 {
				_ = sess.WindowChange(min(m.Rows, 0xffff), min(m.Cols, 0xffff))
			}
		}
	}()
	err = sess.Wait()
	<-outDone
	exit := TerminalMessage{Type: "exit"}
	var ee *gossh.ExitError
	switch {
	case err == nil:
		zero := 0
		exit.Code = &zero
	case errors.As(err, &ee):
		if ee.Signal() != "" {
			exit.Signal = ee.Signal()
		} else {
			code := ee.ExitStatus()
			exit.Code = &code
		}
	default:
		// The connection ended without a status: the client left, or the
		// session ended.
		cl.Close()
		return websocket.StatusGoingAway, truncate("shell ended: " + fmt.Sprint(err))
	}
	if b, err := json.Marshal(exit); err == nil {
		_ = c.Write(ctx, websocket.MessageText, b)
	}
	cl.Close()
	return websocket.StatusNormalClosure, ""
}

// socketPair returns the two ends of a connected Unix stream socket pair.
func socketPair() (net.Conn, net.Conn, error) {
	// SOCK_CLOEXEC is Linux's; the fork lock and CloseOnExec do the same
	// everywhere (the client side of this package builds for macOS too).
	syscall.ForkLock.RLock()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err == nil {
		syscall.CloseOnExec(fds[0])
		syscall.CloseOnExec(fds[1])
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		return nil, nil, err
	}
	var conns [2]net.Conn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "terminal-ssh")
		conns[i], err = net.FileConn(f)
		f.Close()
		if err != nil {
			if i == 0 {
				syscall.Close(fds[1])
			} else {
				conns[0].Close()
			}
			return nil, nil, err
		}
	}
	return conns[0], conns[1], nil
}

// truncate keeps a close reason within a control frame's 123 bytes.
func truncate(s string) string {
	if len(s) > 120 {
		return s[:120]
	}
	return s
}
