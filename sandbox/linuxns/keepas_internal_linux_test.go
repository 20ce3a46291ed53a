//go:build linux

package linuxns

import (
	"context"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/procio"
	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/linuxns/ctl"
)

// fakeInit is the init's end of a command's control connection, played
// by the test: an init runs in the sandbox, and may answer anything.
type fakeInit struct {
	t    *testing.T
	conn *net.UnixConn
	p    *initProcess
	wait chan waitResult
}

type waitResult struct {
	exit sandbox.Exit
	err  error
}

// newFakeInit is a running command (no Cmd.Keep) whose Wait is under
// way, its init the test's.
func newFakeInit(t *testing.T, canKeepLater bool) *fakeInit {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conns := make([]*net.UnixConn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "ctl")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c.(*net.UnixConn)
	}
	var ends [3][2]*os.File
	for i := range ends {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		ends[i] = [2]*os.File{r, w}
	}
	p := &initProcess{conn: conns[0], stdin: ends[0][1], stdout: ends[1][0], stderr: ends[2][0], pid: 42,
		keepReply: make(chan ctl.Reply, 1), waitDone: make(chan struct{}), canKeepLater: canKeepLater}
	fi := &fakeInit{t: t, conn: conns[1], p: p, wait: make(chan waitResult, 1)}
	t.Cleanup(func() {
		conns[1].Close()
		p.closeStdio()
		for _, e := range ends {
			e[0].Close()
			e[1].Close()
		}
		select {
		case <-p.waitDone:
		case <-time.After(10 * time.Second):
			t.Error("Wait never returned")
		}
	})
	go func() { e, err := p.Wait(); fi.wait <- waitResult{e, err} }()
	for !p.waiting.Load() {
		time.Sleep(time.Millisecond)
	}
	return fi
}

// read reads the gateway's next request, closing what it carried.
func (fi *fakeInit) read() ctl.Request {
	fi.t.Helper()
	var m ctl.Request
	_ = fi.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	fds, err := ctl.ReadFrame(fi.conn, &m)
	procio.CloseFDs(fds)
	if err != nil {
		fi.t.Fatalf("the gateway's next request: %v", err)
	}
	return m
}

func (fi *fakeInit) reply(r ctl.Reply) {
	fi.t.Helper()
	if err := ctl.WriteFrame(fi.conn, r); err != nil {
		fi.t.Fatal(err)
	}
}

// waited is Wait's answer (bounded: a Wait that never returns is the
// failure).
func (fi *fakeInit) waited() waitResult {
	fi.t.Helper()
	select {
	case w := <-fi.wait:
		return w
	case <-time.After(10 * time.Second):
		fi.t.Fatal("Wait did not return the command's exit")
		return waitResult{}
	}
}

// TestKeepAsInitAnswersMore: an init that answers a "keep" with more
// than one reply does not block the gateway's reader: the command's exit
// still reaches Wait (the merged code's Wait blocked for good on the
// third reply, a goroutine that no session end could free).
func TestKeepAsInitAnswersMore(t *testing.T) {
	fi := newFakeInit(t, true)
	kerr := make(chan error, 1)
	go func() { kerr <- fi.p.KeepAs(context.Background(), "process/p1") }()
	if m := fi.read(); m.Op != "keep" || m.Keep != "process/p1" {
		t.Fatalf("request %+v, want keep", m)
	}
	for range 4 {
		fi.reply(ctl.Reply{Op: "error", Error: "no", Errno: int(unix.EMFILE)})
	}
	if err := <-kerr; err == nil {
		t.Fatal("KeepAs succeeded on a refusal")
	}
	fi.reply(ctl.Reply{Op: "exit", Exit: &sandbox.Exit{Code: 7}})
	if w := fi.waited(); w.err != nil || w.exit.Code != 7 {
		t.Errorf("Wait: %+v %v, want exit 7", w.exit, w.err)
	}
}

// TestKeepAsLateKept: a "kept" that comes once KeepAs gave up (it killed
// the command, not to leave it kept with no record of it) is answered
// "ack" at the command's exit, so that the init forgets it and frees its
// keep slot (ctl.MaxKept); Wait returns the exit, not ErrHandedOff.
func TestKeepAsLateKept(t *testing.T) {
	fi := newFakeInit(t, true)
	fi.p.keepWait = 50 * time.Millisecond
	kerr := make(chan error, 1)
	go func() { kerr <- fi.p.KeepAs(context.Background(), "process/p1") }()
	if m := fi.read(); m.Op != "keep" {
		t.Fatalf("request %+v, want keep", m)
	}
	if m := fi.read(); m.Op != "kill" { // KeepAs gave up
		t.Fatalf("request %+v, want kill", m)
	}
	if err := <-kerr; err == nil {
		t.Fatal("KeepAs succeeded with no answer")
	}
	fi.reply(ctl.Reply{Op: "kept"})
	fi.reply(ctl.Reply{Op: "exit", Exit: &sandbox.Exit{Signal: "HUP"}})
	if w := fi.waited(); w.err != nil || w.exit.Signal != "HUP" {
		t.Errorf("Wait: %+v %v, want the exit by SIGHUP", w.exit, w.err)
	}
	if m := fi.read(); m.Op != "ack" {
		t.Errorf("request %+v, want ack: the init keeps the command for good", m)
	}
}

// TestKeepAsOldInit: an init that predates "keep" (no KeepLater in its
// sandbox's state) is not asked: KeepAs refuses at once
// (errors.ErrUnsupported), rather than wait keepAsWait for an answer
// that never comes and then kill the command; nothing is sent.
func TestKeepAsOldInit(t *testing.T) {
	fi := newFakeInit(t, false)
	if err := fi.p.KeepAs(context.Background(), "process/p1"); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("KeepAs on an old init: %v, want ErrUnsupported", err)
	}
	fi.reply(ctl.Reply{Op: "exit", Exit: &sandbox.Exit{Code: 0}})
	if w := fi.waited(); w.err != nil || w.exit.Code != 0 {
		t.Errorf("Wait: %+v %v", w.exit, w.err)
	}
	_ = fi.conn.SetReadDeadline(time.Now().Add(time.Second))
	var m ctl.Request
	if _, err := ctl.ReadFrame(fi.conn, &m); err == nil {
		t.Errorf("the old init was sent %+v", m)
	}
}

// TestKeepAsKept: the init's "kept" hands the command over: KeepAs
// succeeds, Wait answers ErrHandedOff, the gateway's ends are closed.
func TestKeepAsKept(t *testing.T) {
	fi := newFakeInit(t, true)
	kerr := make(chan error, 1)
	go func() { kerr <- fi.p.KeepAs(context.Background(), "process/p1") }()
	var m ctl.Request
	_ = fi.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	fds, err := ctl.ReadFrame(fi.conn, &m)
	procio.CloseFDs(fds)
	if err != nil || m.Op != "keep" || len(fds) != 2 {
		t.Fatalf("request %+v with %d descriptors (%v), want keep with stdout's and stderr's", m, len(fds), err)
	}
	fi.reply(ctl.Reply{Op: "kept"})
	if err := <-kerr; err != nil {
		t.Fatalf("KeepAs: %v", err)
	}
	if w := fi.waited(); !errors.Is(w.err, sandbox.ErrHandedOff) {
		t.Errorf("Wait: %+v %v, want ErrHandedOff", w.exit, w.err)
	}
}
