package main

import (
	"fmt"
	"os/exec"
	"strings"
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
