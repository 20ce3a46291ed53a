package sshd_test

// Channel-level tests on the fake-sandbox harness (harness_test.go).

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sshd"
)

func TestChannelExitOrder(t *testing.T) {
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<18) // 4 MiB, twice the window
	tests := []struct {
		name           string
		run            func(p *fakeProc) sandbox.Exit
		stdout, stderr string
		status         int
		signal         string
	}{
		{"status", func(p *fakeProc) sandbox.Exit {
			io.WriteString(p.Out, "out\n")
			io.WriteString(p.Err, "err\n")
			return sandbox.Exit{Code: 42}
		}, "out\n", "err\n", 42, ""},
		{"signal", func(p *fakeProc) sandbox.Exit {
			return sandbox.Exit{Signal: "TERM"}
		}, "", "", -1, "TERM"},
		{"output larger than the window, written just before the exit", func(p *fakeProc) sandbox.Exit {
			p.Out.Write(big)
			return sandbox.Exit{Code: 3}
		}, string(big), "", 3, ""},
		{"output held open past the exit", func(p *fakeProc) sandbox.Exit {
			io.WriteString(p.Out, "before exit\n")
			p.HoldOutput = true
			return sandbox.Exit{}
		}, "before exit\n", "", 0, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sb := newFakeSandbox()
			sb.run = tt.run
			h := newHarness(t, sshd.Config{OutputGrace: 200 * time.Millisecond}, sb)
			w := session(t, h.dial(t), nil, execReq("cmd"))
			if !w.ok {
				t.Fatal("exec refused")
			}
			if w.stdout != tt.stdout || w.stderr != tt.stderr {
				t.Errorf("stdout %d bytes, stderr %q; want %d bytes, %q", len(w.stdout), w.stderr, len(tt.stdout), tt.stderr)
			}
			// One exit request, and before the close: after it, x/crypto
			// would drop it.
			want := []string{"exit-status"}
			if tt.signal != "" {
				want = []string{"exit-signal"}
			}
			if !slices.Equal(w.reqs, want) || w.status != tt.status || w.signal != tt.signal {
				t.Errorf("requests %v status %d signal %q; want %v %d %q", w.reqs, w.status, w.signal, want, tt.status, tt.signal)
			}
		})
	}
}

func TestChannelStdinReachesProcess(t *testing.T) {
	sb := newFakeSandbox()
	sb.run = func(p *fakeProc) sandbox.Exit {
		n, _ := io.Copy(p.Out, p.In)
		return sandbox.Exit{Code: int(n % 256)}
	}
	c := newHarness(t, sshd.Config{}, sb).dial(t)
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	in := bytes.Repeat([]byte("x"), 1<<20+7)
	s.Stdin = bytes.NewReader(in)
	var out bytes.Buffer
	s.Stdout = &out
	var ee *gossh.ExitError
	if err := s.Run("cat"); !errors.As(err, &ee) || ee.ExitStatus() != 7 || out.Len() != len(in) {
		t.Fatalf("run: %v, %d bytes back; want exit 7 and %d bytes", err, out.Len(), len(in))
	}
}

// The context Start gets lives as long as the channel: not cancelled
// while the command runs or its output is delivered, cancelled when the
// client closes the channel or the connection ends.
func TestChannelStartContext(t *testing.T) {
	t.Run("alive until the exit is delivered", func(t *testing.T) {
		sb := newFakeSandbox()
		ctxErr := make(chan error, 1)
		sb.run = func(p *fakeProc) sandbox.Exit {
			io.WriteString(p.Out, "done\n")
			ctxErr <- p.Ctx.Err()
			return sandbox.Exit{}
		}
		w := session(t, newHarness(t, sshd.Config{}, sb).dial(t), nil, execReq("x"))
		if err := <-ctxErr; err != nil || w.stdout != "done\n" || w.status != 0 {
			t.Fatalf("context %v at exit; got %q status %d", err, w.stdout, w.status)
		}
		p := sb.next(t)
		select {
		case <-p.Ctx.Done(): // the channel is closed now
		case <-time.After(10 * time.Second):
			t.Fatal("context not cancelled after the channel closed")
		}
	})
	t.Run("cancelled when the client closes the channel", func(t *testing.T) {
		sb := newFakeSandbox()
		sb.run = untilKilled
		c := newHarness(t, sshd.Config{}, sb).dial(t)
		ch, _, err := c.OpenChannel("session", nil)
		if err != nil {
			t.Fatal(err)
		}
		r := execReq("sleep")
		if ok, err := ch.SendRequest(r.typ, true, r.payload); !ok || err != nil {
			t.Fatalf("exec: %v %v", ok, err)
		}
		p := sb.next(t)
		if p.Ctx.Err() != nil {
			t.Fatal("context cancelled while the command runs")
		}
		ch.Close()
		waitClosed(t, p.Ctx.Done(), "context")
		waitClosed(t, p.Killed, "kill")
	})
	t.Run("cancelled when the connection ends", func(t *testing.T) {
		sb := newFakeSandbox()
		sb.run = untilKilled
		c := newHarness(t, sshd.Config{}, sb).dial(t)
		s, err := c.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Start("sleep"); err != nil {
			t.Fatal(err)
		}
		p := sb.next(t)
		c.Close()
		waitClosed(t, p.Ctx.Done(), "context")
		waitClosed(t, p.Killed, "kill")
	})
}

func waitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not done after 10s", what)
	}
}

func TestChannelStartFailure(t *testing.T) {
	noShell := fmt.Errorf("start: %w", &fs.PathError{Op: "fork/exec", Path: "/bin/nosh", Err: syscall.ENOENT})
	tests := []struct {
		name           string
		err            error
		pre            []*request
		start          *request
		stdout, stderr string
		status         int
	}{
		{"missing shell", noShell, nil, execReq("true"),
			"", "sandgate: cannot start command: " + noShell.Error() + "\n", 127},
		{"not found in PATH", fmt.Errorf("start: %w", exec.ErrNotFound), nil, execReq("true"),
			"", "sandgate: cannot start command: start: executable file not found in $PATH\n", 127},
		{"sandbox closed", sandbox.ErrClosed, nil, execReq("true"),
			"", "sandgate: cannot start command: sandbox is closed\n", 255},
		{"other error", errors.New("start in sandbox: control socket: connection refused"), nil, shellReq(),
			"", "sandgate: cannot start command: start in sandbox: control socket: connection refused\n", 255},
		{"pty shell: on the terminal", errors.New("no terminals left"), []*request{ptyReq("xterm", 80, 24)}, shellReq(),
			"sandgate: cannot start command: no terminals left\r\n", "", 255},
		{"sftp subsystem", errors.New("no sftp server"), nil, subsystemReq("sftp"),
			"", "sandgate: cannot start command: no sftp server\n", 255},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sb := newFakeSandbox()
			sb.startErr = tt.err
			h := newHarness(t, sshd.Config{}, sb)
			w := session(t, h.dial(t), tt.pre, tt.start)
			if !w.ok {
				t.Fatalf("%s refused; a start failure is accepted, then reported", tt.start.typ)
			}
			if w.stdout != tt.stdout || w.stderr != tt.stderr || w.status != tt.status || !slices.Equal(w.reqs, []string{"exit-status"}) {
				t.Errorf("got stdout %q stderr %q status %d requests %v\nwant stdout %q stderr %q status %d",
					w.stdout, w.stderr, w.status, w.reqs, tt.stdout, tt.stderr, tt.status)
			}
			if !strings.Contains(h.log.String(), "exec_start_failed") {
				t.Errorf("start failure not logged:\n%s", h.log.String())
			}
		})
	}
	t.Run("what the client library reports", func(t *testing.T) {
		sb := newFakeSandbox()
		sb.startErr = noShell
		s, err := newHarness(t, sshd.Config{}, sb).dial(t).NewSession()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		var errOut bytes.Buffer
		s.Stderr = &errOut
		var ee *gossh.ExitError
		if err := s.Run("true"); !errors.As(err, &ee) || ee.ExitStatus() != 127 || !strings.HasPrefix(errOut.String(), "sandgate: cannot start command: ") {
			t.Fatalf("run: %v, stderr %q; want exit 127 and the reason", err, errOut.String())
		}
	})
}

func TestChannelEnvBounds(t *testing.T) {
	sb := newFakeSandbox()
	sb.run = untilKilled
	c := newHarness(t, sshd.Config{EnvAllow: []string{"MY_*", "EXACT"}}, sb).dial(t)
	ch, _, err := c.OpenChannel("session", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	send := func(r *request) bool {
		t.Helper()
		ok, err := ch.SendRequest(r.typ, true, r.payload)
		if err != nil {
			t.Fatalf("%s: %v", r.typ, err)
		}
		return ok
	}
	var want []string
	for _, tt := range []struct {
		name, value string
		ok          bool
	}{
		{"TERM", "xterm", true},
		{"LANG", "C.UTF-8", true},
		{"LC_ALL", "C", true},
		{"MY_VAR", "x", true},
		{"EXACT", "y", true},
		{"EXACTLY", "z", false},
		{"PATH", "/evil", false},
		{"LD_PRELOAD", "/evil.so", false},
		{"MY_BIG", strings.Repeat("v", 4096-len("MY_BIG")), true},
		{"MY_BIGGER", strings.Repeat("v", 4096-len("MY_BIGGER")+1), false},
	} {
		if got := send(envReq(tt.name, tt.value)); got != tt.ok {
			t.Errorf("env %s (%d bytes): ok=%v, want %v", tt.name, len(tt.value), got, tt.ok)
		}
		if tt.ok {
			want = append(want, tt.name+"="+tt.value)
		}
	}
	for i := len(want); i < 64; i++ {
		name := fmt.Sprintf("MY_%d", i)
		if !send(envReq(name, "v")) {
			t.Fatalf("env var %d refused; 64 are allowed", i+1)
		}
		want = append(want, name+"=v")
	}
	if send(envReq("MY_65TH", "v")) {
		t.Error("a 65th env var was accepted")
	}
	if !send(execReq("env")) {
		t.Fatal("exec refused")
	}
	// Then what OpenSSH tells every command about its connection; this
	// harness's net.Pipe has no IP addresses, which OpenSSH spells so.
	want = append(want, "SSH_CLIENT=UNKNOWN 65535 65535", "SSH_CONNECTION=UNKNOWN 65535 UNKNOWN 65535")
	p := sb.next(t)
	if !slices.Equal(p.Cmd.Env, want) {
		t.Errorf("process env = %q\nwant %q", p.Cmd.Env, want)
	}
	if send(envReq("LANG", "C")) {
		t.Error("env accepted after the command started")
	}
}

func TestChannelSignals(t *testing.T) {
	sb := newFakeSandbox()
	sb.run = func(p *fakeProc) sandbox.Exit {
		select {
		case sig := <-p.Signals:
			return sandbox.Exit{Signal: sandbox.SignalName(sig)}
		case <-p.Killed:
			return sandbox.Exit{Signal: "KILL"}
		}
	}
	c := newHarness(t, sshd.Config{}, sb).dial(t)
	ch, reqs, err := c.OpenChannel("session", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	send := func(r *request) bool {
		t.Helper()
		ok, err := ch.SendRequest(r.typ, true, r.payload)
		if err != nil {
			t.Fatalf("%s: %v", r.typ, err)
		}
		return ok
	}
	if send(signalReq("INT")) {
		t.Error("signal accepted before any command")
	}
	if !send(execReq("sleep")) {
		t.Fatal("exec refused")
	}
	if send(signalReq("NOSUCH")) {
		t.Error("unknown signal name accepted")
	}
	if send(signalReq("SIGINT")) {
		t.Error(`signal "SIGINT" accepted: RFC 4254 names have no SIG prefix`)
	}
	if !send(signalReq("USR1")) {
		t.Fatal("signal USR1 refused")
	}
	r := <-reqs
	var s struct {
		Signal     string
		CoreDumped bool
		Msg, Lang  string
	}
	if r == nil || r.Type != "exit-signal" || gossh.Unmarshal(r.Payload, &s) != nil || s.Signal != "USR1" {
		t.Fatalf("after USR1: %+v %+v, want exit-signal USR1", r, s)
	}
}

func TestChannelCaps(t *testing.T) {
	t.Run("channels per connection", func(t *testing.T) {
		sb := newFakeSandbox()
		c := newHarness(t, sshd.Config{}, sb).dial(t)
		var open []gossh.Channel
		defer func() {
			for _, ch := range open {
				ch.Close()
			}
		}()
		for i := range sshd.MaxChannelsPerConn {
			ch, _, err := c.OpenChannel("session", nil)
			if err != nil {
				t.Fatalf("channel %d: %v", i, err)
			}
			open = append(open, ch)
		}
		_, _, err := c.OpenChannel("session", nil)
		var oce *gossh.OpenChannelError
		if !errors.As(err, &oce) || oce.Reason != gossh.ResourceShortage {
			t.Fatalf("channel past the cap: %v, want resource shortage", err)
		}
		open[0].Close()
		open = open[1:]
		deadline := time.Now().Add(10 * time.Second)
		for {
			ch, _, err := c.OpenChannel("session", nil)
			if err == nil {
				open = append(open, ch)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no channel after one closed: %v", err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
	t.Run("one command per channel, pty rules", func(t *testing.T) {
		sb := newFakeSandbox()
		sb.run = untilKilled
		c := newHarness(t, sshd.Config{}, sb).dial(t)
		ch, _, err := c.OpenChannel("session", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		for _, tt := range []struct {
			r  *request
			ok bool
		}{
			{windowReq(100, 50), false}, // no pty yet
			{ptyReq(strings.Repeat("x", 257), 80, 24), false},
			{ptyReq("xterm", 120, 40), true},
			{ptyReq("xterm", 80, 24), false}, // one pty
			{subsystemReq("nosuch"), false},
			{&request{"x11-req", nil}, false},
			{&request{"auth-agent-req@openssh.com", nil}, false},
			{shellReq(), true},
			{execReq("again"), false},
			{subsystemReq("sftp"), false},
			{ptyReq("xterm", 80, 24), false},
			{windowReq(100, 50), true},
			{windowReq(0x1ffff, 7), true},
		} {
			if ok, err := ch.SendRequest(tt.r.typ, true, tt.r.payload); err != nil || ok != tt.ok {
				t.Errorf("%s: ok=%v err=%v, want ok=%v", tt.r.typ, ok, err, tt.ok)
			}
		}
		p := sb.next(t)
		if p.Cmd.PTY == nil || p.Cmd.PTY.Term != "xterm" || p.Cmd.PTY.Window != (sandbox.Window{Cols: 120, Rows: 40}) || p.Cmd.Command != "" {
			t.Fatalf("cmd = %+v pty %+v, want a shell on an xterm of 120x40", p.Cmd, p.Cmd.PTY)
		}
		for _, want := range []sandbox.Window{{Cols: 100, Rows: 50}, {Cols: 0xffff, Rows: 7}} {
			if got := <-p.Resizes; got != want {
				t.Errorf("resize %+v, want %+v", got, want)
			}
		}
	})
	t.Run("sftp runs without a pty", func(t *testing.T) {
		sb := newFakeSandbox()
		w := session(t, newHarness(t, sshd.Config{}, sb).dial(t), []*request{ptyReq("xterm", 80, 24)}, subsystemReq("sftp"))
		p := sb.next(t)
		if !w.ok || p.Cmd.Subsystem != "sftp" || p.Cmd.PTY != nil || w.status != 0 {
			t.Fatalf("ok=%v cmd %+v status %d, want sftp without a pty", w.ok, p.Cmd, w.status)
		}
	})
}

// A panic in a copy goroutine is the channel's problem only: the command
// is killed, the channel ends, the connection and the server go on.
func TestChannelCopyPanic(t *testing.T) {
	sb := newFakeSandbox()
	sb.run = untilKilled
	sb.panicOnStdout = true
	h := newHarness(t, sshd.Config{}, sb)
	c := h.dial(t)
	w := session(t, c, nil, execReq("x"))
	if w.signal != "KILL" {
		t.Fatalf("after a copy panic: %+v, want the command killed", w)
	}
	if !strings.Contains(h.log.String(), "ssh_channel_panic") {
		t.Errorf("panic not logged:\n%s", h.log.String())
	}
	sb.panicOnStdout = false // read by the next Start, which the request below orders after this
	sb.run = func(p *fakeProc) sandbox.Exit {
		io.WriteString(p.Out, "still here\n")
		return sandbox.Exit{}
	}
	if w := session(t, c, nil, execReq("x")); w.stdout != "still here\n" || w.status != 0 {
		t.Fatalf("next command on the connection: %+v", w)
	}
}

// Bulk data on several channels of one connection at once, both ways and
// on stderr, arrives whole and in order: the SSH layer reads channel data
// into pooled packet buffers and reuses each once read
// (third_party/golang.org/x/crypto/ssh/packetpool.go), so a buffer handed
// back too early would show here as foreign or changed bytes.
func TestChannelBulkDataConcurrent(t *testing.T) {
	// With an OS pipe as stdin (the real drivers'), the channel's packets go
	// into it in place (copyIn's writev); with an io.Pipe they are copied.
	for _, osStdin := range []bool{true, false} {
		t.Run(fmt.Sprintf("osStdin=%v", osStdin), func(t *testing.T) { testChannelBulkData(t, osStdin) })
	}
}

func testChannelBulkData(t *testing.T, osStdin bool) {
	sb := newFakeSandbox()
	sb.osStdin = osStdin
	sb.run = func(p *fakeProc) sandbox.Exit {
		// Echo stdin to stdout and stderr, then the sum of what came in.
		h := sha256.New()
		if _, err := io.Copy(io.MultiWriter(h, p.Out, p.Err), p.In); err != nil {
			return sandbox.Exit{Code: 1}
		}
		_, _ = p.Out.Write(h.Sum(nil))
		return sandbox.Exit{}
	}
	c := newHarness(t, sshd.Config{}, sb).dial(t)
	const channels = 6
	errs := make(chan error, channels)
	for i := range channels {
		go func() {
			errs <- func() error {
				s, err := c.NewSession()
				if err != nil {
					return err
				}
				defer s.Close()
				in := make([]byte, 3<<20+i*4099)
				_, _ = rand.Read(in)
				// Uneven writes, so packets of every size arrive.
				s.Stdin = &unevenReader{b: in, step: 1 + i*7919}
				var out, errOut bytes.Buffer
				s.Stdout, s.Stderr = &out, &errOut
				if err := s.Run("echo"); err != nil {
					return err
				}
				sum := sha256.Sum256(in)
				want := append(append([]byte(nil), in...), sum[:]...)
				if !bytes.Equal(out.Bytes(), want) || !bytes.Equal(errOut.Bytes(), in) {
					return fmt.Errorf("channel %d: %d bytes on stdout, %d on stderr; want %d and %d, unchanged",
						i, out.Len(), errOut.Len(), len(want), len(in))
				}
				return nil
			}()
		}()
	}
	for range channels {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// unevenReader hands out b in reads of growing, uneven sizes.
type unevenReader struct {
	b    []byte
	step int
}

func (r *unevenReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	r.step = (r.step*31 + 17) % (96 << 10)
	n := min(len(p), len(r.b), 1+r.step)
	copy(p, r.b[:n])
	r.b = r.b[n:]
	return n, nil
}
