package sshd_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sshd"
)

// eventLog keeps the audit events it is given.
type eventLog struct {
	mu     sync.Mutex
	events []audit.Event
}

func (l *eventLog) Record(_ context.Context, e audit.Event) {
	l.mu.Lock()
	l.events = append(l.events, e)
	l.mu.Unlock()
}

func (l *eventLog) commands() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, e := range l.events {
		if e.Kind == audit.KindCommand {
			n++
		}
	}
	return n
}

// TestExecReportClientNotReading: an exec's (a shell's) audit event
// follows its end, but does not wait on a client that does not read: a
// command whose output fills the client's window and stays unread is
// recorded soon after it exits, not when the client reads or the
// connection closes (which a client could put off, and a crash then never
// comes to). Once.
func TestExecReportClientNotReading(t *testing.T) {
	for _, shell := range []bool{false, true} {
		name := "exec"
		if shell {
			name = "shell"
		}
		t.Run(name, func(t *testing.T) { testReportClientNotReading(t, shell) })
	}
}

func testReportClientNotReading(t *testing.T, shell bool) {
	events := &eventLog{}
	sb := newFakeSandbox()
	window := 2 << 20 // x/crypto's client window
	exited := make(chan struct{})
	sb.run = func(p *fakeProc) sandbox.Exit {
		defer close(exited)
		_, _ = p.Out.Write(bytes.Repeat([]byte{'x'}, window))
		_, _ = p.Out.Write([]byte("!")) // taken by the copier, which then waits for the window
		return sandbox.Exit{Code: 7}
	}
	h := newHarnessGateway(t, sshd.Config{}, gateway.Config{Audit: events}, sb)
	c := h.dial(t)
	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	out, err := sess.StdoutPipe() // not read until the event is in
	if err != nil {
		t.Fatal(err)
	}
	if shell {
		err = sess.Shell()
	} else {
		err = sess.Start("cmd")
	}
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		t.Fatal("the command did not end")
	}
	for deadline := time.Now().Add(30 * time.Second); events.commands() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no audit event while the client does not read, 30 s after the command's end")
		}
	}
	if n, err := io.Copy(io.Discard, out); err != nil || n != int64(window)+1 {
		t.Fatalf("stdout: %d bytes, %v", n, err)
	}
	var ee *gossh.ExitError
	if err := sess.Wait(); !errors.As(err, &ee) || ee.ExitStatus() != 7 {
		t.Fatalf("exit: %v, want status 7", err)
	}
	if n := events.commands(); n != 1 {
		t.Fatalf("%d command events, want 1", n)
	}
	if shell != (len(h.sess.History()) == 0) {
		t.Fatalf("history %+v", h.sess.History())
	}
}
