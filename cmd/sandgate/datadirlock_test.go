package main

import (
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A second serve on a data dir in use fails at once and names the pid
// that holds it (it used to wait 5 s for the store, then say "timeout").
func TestSecondServeNamesTheHolder(t *testing.T) {
	g := startGateway(t)
	cmd := exec.Command(sandgateBin, "serve", "--listen", "127.0.0.1:0", "--data-dir", g.DataDir, "--sandbox", "workdir", "--api-key", "x")
	cmd.Env = cleanEnv()
	done := make(chan struct{})
	var out []byte
	var err error
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("the second serve is still running: %s", out)
	}
	want := fmt.Sprintf("pid %d", g.cmd.Process.Pid)
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "in use") || !strings.Contains(string(out), want) {
		t.Fatalf("second serve: %v, want exit 1 naming %q: %s", err, want, out)
	}
	// The first one is unharmed.
	g.createSession(t)
}

// Without isolation (the workdir driver) the start-up says so in one
// loud line, and every session answer says "isolation": "none" and lists
// the limits nothing enforces.
func TestWorkdirSaysNoIsolation(t *testing.T) {
	g := startGateway(t)
	if n := strings.Count(g.stderr.String(), "NO ISOLATION"); n != 1 {
		t.Errorf("%d NO ISOLATION lines in the start-up log:\n%s", n, g.stderr.String())
	}
	var s struct {
		Isolation  string   `json:"isolation"`
		Unenforced []string `json:"unenforced"`
	}
	if code := g.api(t, "POST", "/v1/sessions", map[string]any{}, &s); code != 201 || s.Isolation != "none" ||
		strings.Join(s.Unenforced, ",") != "memoryMiB,cpus,pids,diskMiB" {
		t.Fatalf("create: %d %+v", code, s)
	}
	if out := g.mustCLI(t, "session", "ls", "--json"); !strings.Contains(out, `"isolation":"none"`) {
		t.Errorf("list: %s", out)
	}
}

// SIGTERM with kept sessions logs how many are kept and how to release
// them; the next serve takes them back.
func TestShutdownSaysSessionsKept(t *testing.T) {
	g := startGateway(t, "--keep-sandboxes-on-exit=true")
	g.createSession(t)
	g.createSession(t)
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	<-g.done
	log := g.stderr.String()
	if !strings.Contains(log, "msg=sessions_kept count=2") || !strings.Contains(log, "--keep-sandboxes-on-exit=false") || !strings.Contains(log, "sandgate session rm") {
		t.Errorf("no sessions_kept line naming 2 sessions and how to release them:\n%s", log)
	}
	g2 := restartWith(t, g, syscall.SIGTERM, "workdir") // tears them down at its end
	if out := g2.mustCLI(t, "session", "ls", "--json"); strings.Count(out, `"sessionId"`) != 2 {
		t.Errorf("the next serve does not hold the 2 kept sessions: %s", out)
	}
}
