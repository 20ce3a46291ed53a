package dataplane_test

import (
	"context"
	"fmt"
	"go.uber.org/goleak"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/dataplane"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/internal/gwtest"
	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/linuxns"
	"github.com/sandgate/sandgate/sandbox/workdir"
)

func TestMain(m *testing.M) {
	// The test binary stands in for sandgate (sandbox-init, sftp-server).
	gwtest.Dispatch()
	goleak.VerifyTestMain(m)
}

// drivers are the sandbox drivers the tests run on.
var drivers = []string{"workdir", "linux"}

// requireLinux skips where the linux driver cannot run, and fails in CI.
func requireLinux(t *testing.T) {
	t.Helper()
	_, err := os.Stat("/proc/self/ns/user")
	if os.Geteuid() == 0 && err == nil {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("the linux driver needs root and user namespaces in CI")
	}
	t.Skip("the linux driver needs root and user namespaces")
}

// newSession starts a manager on driver and returns one of its sessions.
func newSession(t *testing.T, driver string) *gateway.Session {
	t.Helper()
	dir, err := os.MkdirTemp("", "sandgate-dp-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	var d sandbox.Driver
	if driver == "linux" {
		requireLinux(t)
		d, err = linuxns.New(sandbox.Config{DataDir: dir})
	} else {
		d, err = workdir.New(workdir.Config{Root: filepath.Join(dir, "sessions")})
	}
	if err != nil {
		t.Fatal(err)
	}
	m := gateway.NewManager(gateway.Config{}, d, slog.New(slog.NewTextHandler(io.Discard, nil)))
	t.Cleanup(func() { m.Shutdown(context.Background(), false) })
	s, _, err := m.Create(context.Background(), gateway.Principal{Tenant: "t", Method: "api_key"}, gateway.CreateParams{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func req(cmd string) dataplane.Request {
	return dataplane.Request{Command: cmd, Timeout: 20 * time.Second, MaxOutputBytes: 1 << 20}
}

func run(t *testing.T, s *gateway.Session, r dataplane.Request) dataplane.Result {
	t.Helper()
	res, err := dataplane.Run(context.Background(), s, r)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func code(r dataplane.Result) int {
	if r.ExitCode == nil {
		return -1
	}
	return *r.ExitCode
}

func TestCommandsRun(t *testing.T) {
	for _, driver := range drivers {
		t.Run(driver, func(t *testing.T) {
			s := newSession(t, driver)
			t.Run("exit and streams", func(t *testing.T) {
				res := run(t, s, req("echo out; echo err >&2; exit 3"))
				if code(res) != 3 || res.Stdout.Text != "out\n" || res.Stderr.Text != "err\n" || res.TimedOut {
					t.Errorf("got %+v", res)
				}
				if res.Cwd == "" {
					t.Error("no cwd")
				}
			})
			t.Run("argv unexpanded", func(t *testing.T) {
				r := req("")
				r.Argv = []string{"printf", "%s|", "a b", `it's "q"`, "$HOME", "`x`"}
				res := run(t, s, r)
				if want := `a b|it's "q"|$HOME|` + "`x`|"; res.Stdout.Text != want {
					t.Errorf("stdout %q, want %q", res.Stdout.Text, want)
				}
			})
			t.Run("stdin env cwd", func(t *testing.T) {
				run(t, s, req("mkdir -p sub/dir"))
				r := req("cat; printf ' %s' \"$LC_X\"; printf ' %s' \"$PWD\"")
				r.Stdin, r.Env, r.Cwd = []byte("input"), map[string]string{"LC_X": "v"}, "sub/dir"
				res := run(t, s, r)
				if !strings.HasPrefix(res.Stdout.Text, "input v /") || !strings.HasSuffix(res.Stdout.Text, "/sub/dir") {
					t.Errorf("stdout %q", res.Stdout.Text)
				}
				if !strings.HasSuffix(res.Cwd, "/sub/dir") {
					t.Errorf("cwd %q", res.Cwd)
				}
			})
			t.Run("streamed past the cap, pooled", func(t *testing.T) {
				// Streamed output is sent, not kept; kept output comes from
				// the pool and goes back to it.
				pool := &dataplane.BufferPool{}
				for range 3 {
					r := req("printf hello; printf world >&2")
					r.MaxOutputBytes, r.Buffers = 4, pool
					var mu sync.Mutex
					got := map[string]string{}
					r.Stream = func(stream string, data []byte) {
						mu.Lock()
						defer mu.Unlock()
						got[stream] += string(data)
					}
					res := run(t, s, r)
					if !res.Stdout.Truncated || !res.Stderr.Truncated || len(res.Stdout.Bytes()) != 0 || got["stdout"] != "hell" || got["stderr"] != "worl" {
						t.Errorf("got %+v, streamed %q", res, got)
					}
					res.Release()
					r.Stream = nil
					res = run(t, s, r)
					if res.Stdout.Text != "helo" || !res.Stdout.Truncated {
						t.Errorf("kept %q", res.Stdout.Text)
					}
					res.Release()
				}
			})
			t.Run("binary output", func(t *testing.T) {
				res := run(t, s, req(`printf '\377\000a'`))
				if !res.Stdout.IsBase64 || string(res.Stdout.Bytes()) != string([]byte{0xff, 0, 'a'}) {
					t.Errorf("got %+v", res.Stdout)
				}
			})
			t.Run("head and tail", func(t *testing.T) {
				r := req("printf 'HEAD'; head -c 100000 /dev/zero | tr '\\0' x; printf 'TAIL'")
				r.MaxOutputBytes = 10
				res := run(t, s, r)
				if !res.Stdout.Truncated || res.Stdout.Text != "HEADxxxTAIL"[:5]+"xTAIL" {
					t.Errorf("got %+v", res.Stdout)
				}
			})
			t.Run("timeout kills the tree", func(t *testing.T) {
				mark := fmt.Sprintf("sgmark%d", time.Now().UnixNano())
				r := req(fmt.Sprintf("sleep 1001 & setsid sleep 1002 & (sleep 1003 &); echo started; exec -a %s sleep 1004", mark))
				r.Timeout = time.Second
				res := run(t, s, r)
				if !res.TimedOut || code(res) != 124 || res.Stdout.Text != "started\n" {
					t.Fatalf("got %+v", res)
				}
				waitNone(t, s, "sleep 100[1-4]")
			})
			t.Run("history", func(t *testing.T) {
				var timedOut []string
				for _, r := range s.History() {
					if r.Source != "rest" {
						t.Errorf("source %q", r.Source)
					}
					if r.TimedOut && r.ExitCode != nil && *r.ExitCode == 124 {
						timedOut = append(timedOut, r.Command)
					}
				}
				if len(timedOut) != 1 || !strings.HasPrefix(timedOut[0], "sleep 1001 &") {
					t.Errorf("timed out commands in the history: %q", timedOut)
				}
			})
		})
	}
}

// waitNone waits until no process of the sandbox (or, under workdir, of
// the host) matches pattern, failing after the kill grace and some.
func waitNone(t *testing.T, s *gateway.Session, pattern string) {
	t.Helper()
	deadline := time.Now().Add(sandbox.KillGrace + 5*time.Second)
	for {
		res := run(t, s, req("pgrep -af '"+pattern+"' | grep -v pgrep || true"))
		if strings.TrimSpace(res.Stdout.Text) == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still running: %s", res.Stdout.Text)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func TestShells(t *testing.T) {
	for _, driver := range drivers {
		t.Run(driver, func(t *testing.T) {
			s := newSession(t, driver)
			var shells dataplane.Shells
			sh := func(name, cmd string, timeout time.Duration) dataplane.Result {
				t.Helper()
				r := req(cmd)
				r.Timeout = timeout
				res, err := shells.Run(context.Background(), s.ID, s, name, r)
				if err != nil {
					t.Fatal(err)
				}
				return res
			}
			res := sh("a", "mkdir -p d1 && cd d1 && export FOO=bar; f() { echo fn$1; }; alias hi='echo hello'", 10*time.Second)
			if code(res) != 0 || !strings.HasSuffix(res.Cwd, "/d1") {
				t.Fatalf("got %+v", res)
			}
			res = sh("a", "echo $FOO; f 1; hi; pwd; echo e >&2; false", 10*time.Second)
			if code(res) != 1 || !strings.HasPrefix(res.Stdout.Text, "bar\nfn1\nhello\n") || res.Stderr.Text != "e\n" {
				t.Fatalf("got %+v", res)
			}
			res = sh("b", "echo ${FOO:-unset}", 10*time.Second)
			if res.Stdout.Text != "unset\n" {
				t.Errorf("shell b sees %q", res.Stdout.Text)
			}
			res = sh("a", "cd ..; sleep 1005", time.Second)
			if !res.TimedOut || code(res) != 124 || !strings.HasSuffix(res.Cwd, "/d1") {
				t.Fatalf("got %+v", res)
			}
			waitNone(t, s, "sleep 1005")
			res = sh("a", "echo $FOO; f 2; hi; basename \"$PWD\"", 10*time.Second)
			if res.Stdout.Text != "bar\nfn2\nhello\nd1\n" {
				t.Errorf("after a timeout: %+v", res)
			}
			// Concurrent callers: queued, results not mixed.
			var wg sync.WaitGroup
			for i := range 5 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					res := sh("a", fmt.Sprintf("echo begin%d; sleep 0.1; echo end%d", i, i), 20*time.Second)
					if want := fmt.Sprintf("begin%d\nend%d\n", i, i); res.Stdout.Text != want {
						t.Errorf("caller %d got %q", i, res.Stdout.Text)
					}
				}()
			}
			wg.Wait()
			// A command the shell cannot parse fails alone: the next runs.
			res = sh("a", `echo "unterminated`, 10*time.Second)
			if code(res) == 0 {
				t.Errorf("an unterminated quote: %+v", res)
			}
			if res = sh("a", "echo next", 10*time.Second); code(res) != 0 || res.Stdout.Text != "next\n" || res.Stderr.Text != "" {
				t.Errorf("after an unterminated quote: %+v", res)
			}
			// The user's settings and functions do not reach the wrapper.
			res = sh("a", "set -o noclobber; mv() { echo user-mv; }; printf() { echo user-printf; }; cd() { echo user-cd; }; echo set", 10*time.Second)
			if res = sh("a", "echo after", 10*time.Second); code(res) != 0 || res.Stdout.Text != "after\n" || res.Stderr.Text != "" || !strings.HasSuffix(res.Cwd, "/d1") {
				t.Errorf("with noclobber and user mv/printf/cd: %+v", res)
			}
			sh("a", "set +o noclobber; unset -f mv printf cd", 10*time.Second)
			res = sh("a", "exit 7", 10*time.Second)
			if code(res) != 7 {
				t.Errorf("exit: %+v", res)
			}
			res = sh("a", "basename \"$PWD\"; echo $FOO", 10*time.Second)
			if res.Stdout.Text != "d1\nbar\n" {
				t.Errorf("after exit: %+v", res)
			}
			if err := shells.Delete(s.ID, "a"); err != nil {
				t.Fatal(err)
			}
			if err := shells.Delete(s.ID, "a"); err == nil {
				t.Error("deleted twice")
			}
		})
	}
}
