package main

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/gwtest"
)

// TestSSHExecEnd: the end of an SSH exec on the linux driver, as OpenSSH's
// client sees it through a ControlMaster connection (bench row e2's way),
// against the built binary. The gateway sends exit-status, EOF and close
// in one write and reports the command afterwards; the init reaps with
// SIGCHLD at its default disposition. Checked: the exit status and both
// streams, complete when a command writes a lot and exits at once; a
// signal; a background child holding stdout (the exec still ends, after
// OutputGrace); many execs at once on the one connection, each with its
// own status and output; the history listing the command as soon as the
// client has its status; orphans still reaped; and the init no longer
// catching SIGCHLD.
func TestSSHExecEnd(t *testing.T) {
	requireLinuxDriver(t)
	ssh := gwtest.RequireTool(t, "ssh")
	g := startGateway(t, "--sandbox", "linux")
	s := g.createSession(t)
	cm := filepath.Join(t.TempDir(), "cm")
	opts := g.sshOpts(t, s)
	master := newCmd(g.clientEnv(), ssh, append(opts, "-o", "ControlMaster=yes", "-o", "ControlPath="+cm, "-N", s.SessionID)...)
	if err := master.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = newCmd(g.clientEnv(), ssh, "-o", "ControlPath="+cm, "-O", "exit", "x").Run()
		_ = master.Process.Kill()
		_ = master.Wait()
	})
	deadline := time.Now().Add(30 * time.Second)
	for newCmd(g.clientEnv(), ssh, "-o", "ControlPath="+cm, "-O", "check", "x").Run() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("the ControlMaster connection did not come up: %s", g.stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	run := func(t *testing.T, command string) (string, string, int) {
		t.Helper()
		return runClient(t, g.clientEnv(), nil, ssh, "-o", "ControlPath="+cm, "-o", "ControlMaster=no", "x", command)
	}

	t.Run("status and streams", func(t *testing.T) {
		out, errOut, code := run(t, "printf out; printf err >&2; exit 7")
		if out != "out" || errOut != "err" || code != 7 {
			t.Fatalf("got %q %q %d, want out, err, 7", out, errOut, code)
		}
	})
	t.Run("history has it once the client has the status", func(t *testing.T) {
		if _, _, code := run(t, "exit 9 # history-mark"); code != 9 {
			t.Fatalf("status %d, want 9", code)
		}
		var h struct {
			Commands []struct {
				Command  string
				Source   string
				ExitCode *int
			}
		}
		if code := g.api(t, http.MethodGet, "/v1/sessions/"+s.SessionID+"/commands", nil, &h); code != http.StatusOK {
			t.Fatalf("history: %d", code)
		}
		n := len(h.Commands)
		if n == 0 || h.Commands[n-1].Command != "exit 9 # history-mark" || h.Commands[n-1].Source != "ssh" ||
			h.Commands[n-1].ExitCode == nil || *h.Commands[n-1].ExitCode != 9 {
			t.Fatalf("the history's last command is not the exec just answered: %+v", h.Commands)
		}
	})
	t.Run("output written just before the exit", func(t *testing.T) {
		const size = 3 << 20
		out, errOut, code := run(t, fmt.Sprintf("head -c %d /dev/zero | tr '\\0' x; printf tail >&2; exit 3", size))
		if len(out) != size || strings.Trim(out, "x") != "" || errOut != "tail" || code != 3 {
			t.Fatalf("got %d bytes of stdout, stderr %q, status %d; want %d bytes, tail, 3", len(out), errOut, code, size)
		}
	})
	t.Run("signal", func(t *testing.T) {
		// OpenSSH's client exits 255 on exit-signal (it has no status).
		_, _, code := run(t, "echo before; kill -KILL $$")
		if code != 255 {
			t.Fatalf("status %d, want 255 (exit-signal)", code)
		}
	})
	t.Run("background child holding stdout", func(t *testing.T) {
		out, _, code := run(t, "sleep 30 & echo x")
		if out != "x\n" || code != 0 {
			t.Fatalf("got %q %d, want x, 0", out, code)
		}
		_, _, _ = run(t, "pkill -x sleep || true")
	})
	t.Run("many at once on one connection", func(t *testing.T) {
		var wg sync.WaitGroup
		errs := make(chan string, 24)
		for i := range 24 {
			wg.Go(func() {
				out, errOut, code := run(t, fmt.Sprintf("head -c %d /dev/zero | tr '\\0' y; echo %d >&2; exit %d", 1000*i, i, i))
				if len(out) != 1000*i || errOut != strconv.Itoa(i)+"\n" || code != i {
					errs <- fmt.Sprintf("exec %d: %d bytes, stderr %q, status %d", i, len(out), errOut, code)
				}
			})
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Error(e)
		}
	})
	t.Run("orphans are reaped", func(t *testing.T) {
		out, _, code := run(t, "(sleep 0.2 &); sleep 1; cat /proc/[0-9]*/stat 2>/dev/null | awk '$3 == \"Z\"'")
		if code != 0 || out != "" {
			t.Fatalf("zombies left in the sandbox (status %d): %q", code, out)
		}
	})
	t.Run("the init does not catch SIGCHLD", func(t *testing.T) {
		out, errOut, code := run(t, "grep ^SigCgt: /proc/1/status")
		f := strings.Fields(out)
		if code != 0 || len(f) != 2 {
			t.Fatalf("reading the init's signals: %q %q %d", out, errOut, code)
		}
		mask, err := strconv.ParseUint(f[1], 16, 64)
		if err != nil {
			t.Fatal(err)
		}
		if mask&(1<<(17-1)) != 0 { // SIGCHLD is 17
			t.Fatalf("the init catches SIGCHLD (SigCgt %s): every exit interrupts one of its threads", f[1])
		}
	})
}
