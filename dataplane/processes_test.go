package dataplane

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/linuxns"
	"github.com/sandgate/sandgate/sandbox/workdir"
)

// newManagedSession starts a session on driver ("workdir", or "linux" where it
// can run: it skips elsewhere, and fails in CI).
func newManagedSession(t *testing.T, driver string) (*gateway.Manager, *gateway.Session) {
	t.Helper()
	dir := t.TempDir()
	var d gateway.Driver
	var err error
	switch driver {
	case "workdir":
		d, err = workdir.New(workdir.Config{Root: filepath.Join(dir, "sessions")})
	case "linux":
		if os.Geteuid() != 0 {
			if os.Getenv("CI") == "true" {
				t.Fatal("the linux driver needs root in CI")
			}
			t.Skip("the linux driver needs root")
		}
		d, err = linuxns.New(sandbox.Config{DataDir: dir})
	}
	if err != nil {
		t.Fatal(err)
	}
	mgr := gateway.NewManager(gateway.Config{}, d, slog.New(slog.DiscardHandler))
	t.Cleanup(func() { mgr.Shutdown(context.Background(), false) })
	s, _, err := mgr.Create(context.Background(), gateway.Principal{Tenant: "t"}, gateway.CreateParams{})
	if err != nil {
		t.Fatal(err)
	}
	return mgr, s
}

func drainProcess(t *testing.T, p *Process) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := p.Output().NewReader(0)
	var b strings.Builder
	for {
		c, err := r.Next(ctx, true)
		if errors.Is(err, io.EOF) {
			return b.String()
		}
		if err != nil {
			t.Fatal(err)
		}
		b.Write(c.Data)
	}
}

func TestProcessesOnDrivers(t *testing.T) {
	for _, driver := range []string{"workdir", "linux"} {
		t.Run(driver, func(t *testing.T) {
			mgr, s := newManagedSession(t, driver)
			state := t.TempDir()
			ps := &Processes{}
			cfg := ProcessConfig{StateDir: state, MaxFinished: 2}
			ctx := context.Background()

			// cwd: relative to the workspace; a missing one fails the process.
			for _, tc := range []struct {
				cwd, out string
				code     int
			}{{"missing", "", 1}, {"sub dir", "/sub dir\n", 0}} {
				if err := os.MkdirAll(filepath.Join(s.Sandbox().Workdir(), "sub dir"), 0o777); err != nil {
					t.Fatal(err)
				}
				info, err := ps.Start(ctx, s, cfg, StartRequest{Command: "pwd", Cwd: tc.cwd})
				if err != nil {
					t.Fatal(err)
				}
				p, _ := ps.Get(s.ID, info.ProcessID)
				out := drainProcess(t, p)
				<-p.Done()
				if got := p.Info(); got.ExitCode == nil || *got.ExitCode != tc.code || !strings.HasSuffix(out, tc.out) || (tc.code != 0 && out == "") {
					t.Errorf("cwd %q: exit %v, output %q", tc.cwd, got.ExitCode, out)
				}
			}
			info, err := ps.Start(ctx, s, cfg, StartRequest{Argv: []string{"sh", "-c", "echo \"$1 $FOO\"; exit 5", "x", "it's"}, Env: []string{"FOO=bar"}})
			if err != nil {
				t.Fatal(err)
			}
			// A command this short may have ended by the time Start answers.
			if info.PID <= 0 || (info.Status != StatusRunning && info.Status != StatusExited) {
				t.Errorf("started %+v", info)
			}
			p, ok := ps.Get(s.ID, info.ProcessID)
			if !ok {
				t.Fatal("not found")
			}
			// The sandbox's pid names it too; other numbers and forms do not.
			if byPID, ok := ps.Get(s.ID, strconv.Itoa(info.PID)); !ok || byPID != p {
				t.Errorf("by pid %d: %v %v", info.PID, byPID, ok)
			}
			for _, id := range []string{"0", "-1", "+" + strconv.Itoa(info.PID), "0" + strconv.Itoa(info.PID), "p999"} {
				if _, ok := ps.Get(s.ID, id); ok {
					t.Errorf("Get(%q) found a process", id)
				}
			}
			if out := drainProcess(t, p); out != "it's bar\n" {
				t.Errorf("output %q", out)
			}
			<-p.Done()
			if got := p.Info(); got.Status != StatusExited || *got.ExitCode != 5 {
				t.Errorf("ended %+v", got)
			}
			if err := p.Signal(syscall.SIGTERM); !errors.Is(err, ErrProcessExited) {
				t.Errorf("signal after the end: %v", err)
			}
			// The history lists it as a REST command.
			h := s.History()
			if len(h) == 0 || h[len(h)-1].Source != "rest" {
				t.Errorf("history %+v", h)
			}

			// Finished ones beyond MaxFinished are dropped with their output.
			var ids []string
			for range 3 {
				info, err := ps.Start(ctx, s, cfg, StartRequest{Command: "true"})
				if err != nil {
					t.Fatal(err)
				}
				p, _ := ps.Get(s.ID, info.ProcessID)
				<-p.Done()
				ids = append(ids, info.ProcessID)
			}
			time.Sleep(50 * time.Millisecond)
			if l := ps.List(s.ID); len(l) != 2 || l[0].ProcessID != ids[1] || l[1].ProcessID != ids[2] {
				t.Errorf("list after 4 finished, 2 kept: %+v", l)
			}
			if _, err := os.Stat(filepath.Join(state, s.ID, ids[0])); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("a dropped process's output is still there: %v", err)
			}

			// Stdin, and the end of the session.
			info, err = ps.Start(ctx, s, cfg, StartRequest{Argv: []string{"cat"}})
			if err != nil {
				t.Fatal(err)
			}
			p, _ = ps.Get(s.ID, info.ProcessID)
			if _, err := p.WriteStdin(ctx, []byte("ping\n"), false); err != nil {
				t.Fatal(err)
			}
			r := p.Output().NewReader(0)
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if c, err := r.Next(rctx, true); err != nil || string(c.Data) != "ping\n" {
				t.Fatalf("echo: %q %v", c.Data, err)
			}
			if err := mgr.Delete(ctx, gateway.Principal{Tenant: "t"}, s.ID); err != nil {
				t.Fatal(err)
			}
			if _, err := r.Next(rctx, true); !errors.Is(err, ErrOutputGone) {
				t.Errorf("follower after the session ended: %v", err)
			}
			<-p.Done()
			if _, err := os.Stat(filepath.Join(state, s.ID)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the session's output is still there: %v", err)
			}
			if l := ps.List(s.ID); len(l) != 0 {
				t.Errorf("processes of an ended session: %+v", l)
			}
			if _, err := ps.Start(ctx, s, cfg, StartRequest{Command: "true"}); !errors.Is(err, ErrSessionEnded) {
				t.Errorf("start in an ended session: %v", err)
			}
		})
	}
}

// A process on a terminal (StartRequest.PTY, the E2B facade's): its output
// is the terminal's, input is typed on it, Resize resizes it; a process
// without one cannot be resized.
func TestProcessOnPTY(t *testing.T) {
	for _, driver := range []string{"workdir", "linux"} {
		t.Run(driver, func(t *testing.T) {
			_, s := newManagedSession(t, driver)
			ps := &Processes{}
			ctx := context.Background()
			info, err := ps.Start(ctx, s, ProcessConfig{StateDir: t.TempDir()}, StartRequest{
				Argv: []string{"/bin/sh", "-c", "read line; stty size; tty; echo got $line"},
				PTY:  &sandbox.PTY{Term: "xterm", Window: sandbox.Window{Cols: 80, Rows: 24}},
			})
			if err != nil {
				t.Fatal(err)
			}
			p, _ := ps.Get(s.ID, info.ProcessID)
			if !p.PTY() {
				t.Fatal("PTY() false")
			}
			if err := p.Resize(sandbox.Window{Cols: 132, Rows: 50}); err != nil {
				t.Fatal(err)
			}
			if _, err := p.WriteStdin(ctx, []byte("hello\n"), false); err != nil {
				t.Fatal(err)
			}
			out := drainProcess(t, p)
			<-p.Done()
			if !strings.Contains(out, "50 132") || !strings.Contains(out, "/dev/pts/") || !strings.Contains(out, "got hello") {
				t.Errorf("terminal output %q", out)
			}
			if err := p.Resize(sandbox.Window{Cols: 1, Rows: 1}); !errors.Is(err, ErrProcessExited) {
				t.Errorf("resize after exit: %v", err)
			}

			info, err = ps.Start(ctx, s, ProcessConfig{}, StartRequest{Command: "true"})
			if err != nil {
				t.Fatal(err)
			}
			p, _ = ps.Get(s.ID, info.ProcessID)
			var ge *gateway.Error
			if err := p.Resize(sandbox.Window{Cols: 1, Rows: 1}); !errors.As(err, &ge) || ge.Kind != gateway.KindInvalid {
				t.Errorf("resize without a terminal: %v", err)
			}
			<-p.Done()
		})
	}
}
