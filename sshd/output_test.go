package sshd_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/sandgate/sandgate/internal/gwtest"
	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/linuxns"
	"github.com/sandgate/sandgate/sshd"
)

// TestExecSlowClientGetsEveryByte: a command that writes a burst just
// before it exits has all of it delivered to a client that reads slowly
// (a loaded machine, a slow link), over a real SSH connection to a real
// sandbox. The gateway used to forward output for OutputGrace after the
// exit and then close the pipe, dropping what it still held (up to the
// pipe's 1 MiB); OpenSSH's sshd reads a command's pipe to its end. On a
// terminal (a shell's, or an exec's with a pty) what is left at the exit
// is the terminal's few KiB: those cases check that Drain ends there too.
func TestExecSlowClientGetsEveryByte(t *testing.T) {
	for _, tc := range []struct {
		driver string
		pty    bool
	}{{"workdir", false}, {"linux", false}, {"workdir", true}, {"linux", true}} {
		driver := tc.driver
		name := driver
		if tc.pty {
			name += "/pty"
		}
		t.Run(name, func(t *testing.T) {
			if driver == "linux" {
				requireLinuxDriver(t)
			}
			// A short grace, so that the client's pace, not the machine's
			// load, is what outlasts it.
			s := gwtest.Start(t, gwtest.Options{Driver: driver, SSH: sshd.Config{OutputGrace: 100 * time.Millisecond}})
			c := s.SSH(t, s.CreateSession(t, nil).SessionID)
			sess, err := c.NewSession()
			if err != nil {
				t.Fatal(err)
			}
			defer sess.Close()
			if tc.pty {
				modes := gossh.TerminalModes{gossh.ECHO: 0}
				if err := sess.RequestPty("xterm", 40, 80, modes); err != nil {
					t.Fatal(err)
				}
			}
			out, err := sess.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			const size = 8 << 20
			if err := sess.Start("yes 0123456789abcdef | head -c 8388608"); err != nil {
				t.Fatal(err)
			}
			var got bytes.Buffer
			buf := make([]byte, 32<<10)
			for {
				n, err := out.Read(buf)
				got.Write(buf[:n])
				if err != nil {
					if !errors.Is(err, io.EOF) {
						t.Fatalf("read: %v", err)
					}
					break
				}
				time.Sleep(10 * time.Millisecond) // the slow client
			}
			if err := sess.Wait(); err != nil {
				t.Fatalf("exit: %v", err)
			}
			data := got.Bytes()
			if tc.pty { // the terminal sends a newline as CR LF
				data = bytes.ReplaceAll(data, []byte("\r\n"), []byte("\n"))
			}
			want := bytes.Repeat([]byte("0123456789abcdef\n"), size/17+1)[:size]
			if !bytes.Equal(data, want) {
				t.Fatalf("got %d bytes (identical: %v), want all %d", len(data), bytes.Equal(data, want[:min(len(data), size)]), size)
			}
		})
	}
}

// requireLinuxDriver skips where the linux driver cannot run, and fails
// in CI, where it must.
func requireLinuxDriver(t *testing.T) {
	t.Helper()
	err := errors.New("the linux driver needs root")
	if os.Geteuid() == 0 {
		dir := t.TempDir()
		_, err = linuxns.New(sandbox.Config{DataDir: dir})
	}
	if err == nil {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI must run the linux driver: %v", err)
	}
	t.Skipf("%v", err)
}
