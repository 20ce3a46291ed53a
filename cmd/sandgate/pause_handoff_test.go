package main

import (
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/gwtest"
)

// TestPauseCheckpointHandsOffSSHExec: an OpenSSH exec under way at a
// pause under serve --checkpoint is not killed with its connection: its
// channel ends saying which background process it is now, the pause is a
// checkpoint (not a freeze) that lists it in keptCommands, and after the
// resume the command finishes (the file it writes holds every line, its
// output from the pause on is the process's, its exit is recorded there
// and in the history).
func TestPauseCheckpointHandsOffSSHExec(t *testing.T) {
	requireLinuxDriver(t)
	criu := criuForTest(t)
	g := startGateway(t, "--sandbox", "linux", "--checkpoint", "--criu", criu)
	s := g.createSession(t)
	id := s.SessionID
	pc := procClient{g: g, base: "/v1/sessions/" + id + "/processes"}
	const loop = `for i in $(seq 30); do echo $i >> /workspace/out; echo line-$i; sleep 0.2; done; echo end`
	_, ready, out, errb, done := openSSH(t, g, s, "line-3", loop)
	select {
	case <-ready:
	case <-time.After(60 * time.Second):
		t.Fatalf("the ssh command never started: %q %q", out.String(), errb.String())
	}
	var a pauseAnswer
	if code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/pause", nil, &a); code != http.StatusOK || a.Status != "paused" {
		t.Fatalf("pause: %d %+v", code, a)
	}
	t.Logf("pause: %+v", a.Pause)
	if a.Pause.Method != "checkpoint" {
		t.Errorf("pause with an ssh command under way: method %q, notKept %q", a.Pause.Method, a.Pause.NotKept)
	}
	if len(a.Pause.KeptCommands) != 1 || a.Pause.KeptCommands[0].Command != loop || a.Pause.KeptCommands[0].Source != "ssh" {
		t.Fatalf("keptCommands: %+v", a.Pause.KeptCommands)
	}
	pid := a.Pause.KeptCommands[0].ProcessID
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the ssh connection did not end at the pause")
	}
	if want := "goes on in the sandbox as background process " + pid; !strings.Contains(errb.String(), want) {
		t.Errorf("ssh's stderr does not say %q: %q", want, errb.String())
	}
	// The process API's wait resumes the session; the loop finishes.
	p := pc.waitEnd(t, pid)
	if p.Status != "exited" || p.ExitCode == nil || *p.ExitCode != 0 {
		t.Fatalf("the handed-over command: %+v", p)
	}
	var want strings.Builder
	for i := 1; i <= 30; i++ {
		fmt.Fprintf(&want, "%d\n", i)
	}
	if got := runREST(t, g, id, map[string]any{"command": "cat /workspace/out"}).out(); got != want.String() {
		t.Errorf("/workspace/out after the resume: %q, want 1..30", got)
	}
	lines, cancel := pc.output(t, pid, 0, false)
	data, _, _, _ := collect(t, lines)
	cancel()
	if !strings.HasSuffix(string(data), "line-30\nend\n") {
		t.Errorf("the process's output does not end with the loop's: %q (ssh had %q)", data, out.String())
	}
	var h struct {
		Commands []struct {
			Command  string
			Source   string
			ExitCode *int
		}
	}
	if code := g.api(t, http.MethodGet, "/v1/sessions/"+id+"/commands", nil, &h); code != http.StatusOK {
		t.Fatalf("history: %d", code)
	}
	found := false
	for _, c := range h.Commands {
		if c.Command == loop && c.Source == "ssh" && c.ExitCode != nil && *c.ExitCode == 0 {
			found = true
		}
	}
	if !found {
		t.Errorf("the history lacks the handed-over command's end: %+v", h.Commands)
	}
}

// TestPauseCheckpointHandsOffSSHExecPTY: the same for an exec on a
// terminal (ssh -tt): the init keeps its terminal, and the loop finishes
// after the resume.
func TestPauseCheckpointHandsOffSSHExecPTY(t *testing.T) {
	requireLinuxDriver(t)
	criu := criuForTest(t)
	g := startGateway(t, "--sandbox", "linux", "--checkpoint", "--criu", criu)
	s := g.createSession(t)
	id := s.SessionID
	pc := procClient{g: g, base: "/v1/sessions/" + id + "/processes"}
	const loop = `for i in $(seq 20); do echo $i >> /workspace/out; echo line-$i; sleep 0.2; done; echo end`
	_, ready, out, errb, done := openSSH(t, g, s, "line-3", "-tt", loop)
	select {
	case <-ready:
	case <-time.After(60 * time.Second):
		t.Fatalf("the ssh command never started: %q %q", out.String(), errb.String())
	}
	var a pauseAnswer
	if code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/pause", nil, &a); code != http.StatusOK || a.Status != "paused" {
		t.Fatalf("pause: %d %+v", code, a)
	}
	if a.Pause.Method != "checkpoint" || len(a.Pause.KeptCommands) != 1 || a.Pause.KeptCommands[0].Command != loop {
		t.Fatalf("pause with an ssh command on a terminal under way: %+v", a.Pause)
	}
	pid := a.Pause.KeptCommands[0].ProcessID
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the ssh connection did not end at the pause")
	}
	if want := "background process " + pid; !strings.Contains(errb.String()+out.String(), want) {
		t.Errorf("ssh does not say %q: %q %q", want, out.String(), errb.String())
	}
	p := pc.waitEnd(t, pid)
	if p.Status != "exited" || p.ExitCode == nil || *p.ExitCode != 0 {
		t.Fatalf("the handed-over command: %+v", p)
	}
	var want strings.Builder
	for i := 1; i <= 20; i++ {
		fmt.Fprintf(&want, "%d\n", i)
	}
	if got := runREST(t, g, id, map[string]any{"command": "cat /workspace/out"}).out(); got != want.String() {
		t.Errorf("/workspace/out after the resume: %q, want 1..20", got)
	}
	lines, cancel := pc.output(t, pid, 0, false)
	data, _, _, _ := collect(t, lines)
	cancel()
	if !strings.Contains(string(data), "line-20\r\nend\r\n") {
		t.Errorf("the process's output does not end with the loop's: %q", data)
	}
}

// TestPauseCheckpointHandsOffRESTCommand: a REST command under way
// (POST /commands) at a pause under serve --checkpoint is handed to the
// process API too: its answer is 409 session_paused naming the process,
// the pause is a checkpoint listing it, and after the resume the command
// finishes there.
func TestPauseCheckpointHandsOffRESTCommand(t *testing.T) {
	requireLinuxDriver(t)
	criu := criuForTest(t)
	g := startGateway(t, "--sandbox", "linux", "--checkpoint", "--criu", criu)
	s := g.createSession(t)
	id := s.SessionID
	pc := procClient{g: g, base: "/v1/sessions/" + id + "/processes"}
	const loop = `for i in $(seq 30); do echo $i >> /workspace/out; echo line-$i; sleep 0.2; done; echo end`
	type answer struct {
		code int
		body map[string]any
	}
	ans := make(chan answer, 1)
	go func() {
		var body map[string]any
		code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/commands", map[string]any{"command": loop, "timeout": 120}, &body)
		ans <- answer{code, body}
	}()
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(runREST(t, g, id, map[string]any{"command": "cat /workspace/out 2>/dev/null || true"}).out(), "3\n") {
		if time.Now().After(deadline) {
			t.Fatal("the REST command never wrote its third line")
		}
		time.Sleep(100 * time.Millisecond)
	}
	var a pauseAnswer
	if code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/pause", nil, &a); code != http.StatusOK || a.Status != "paused" {
		t.Fatalf("pause: %d %+v", code, a)
	}
	t.Logf("pause: %+v", a.Pause)
	if a.Pause.Method != "checkpoint" || len(a.Pause.KeptCommands) != 1 || a.Pause.KeptCommands[0].Source != "rest" ||
		a.Pause.KeptCommands[0].Command != loop {
		t.Fatalf("pause with a REST command under way: %+v", a.Pause)
	}
	pid := a.Pause.KeptCommands[0].ProcessID
	var got answer
	select {
	case got = <-ans:
	case <-time.After(30 * time.Second):
		t.Fatal("the REST command's call did not end at the pause")
	}
	if msg := fmt.Sprint(got.body); got.code != http.StatusConflict || !strings.Contains(msg, "session_paused") ||
		!strings.Contains(msg, "background process "+pid) {
		t.Errorf("the command's answer: %d %v", got.code, got.body)
	}
	p := pc.waitEnd(t, pid)
	if p.Status != "exited" || p.ExitCode == nil || *p.ExitCode != 0 {
		t.Fatalf("the handed-over command: %+v", p)
	}
	var want strings.Builder
	for i := 1; i <= 30; i++ {
		fmt.Fprintf(&want, "%d\n", i)
	}
	if out := runREST(t, g, id, map[string]any{"command": "cat /workspace/out"}).out(); out != want.String() {
		t.Errorf("/workspace/out after the resume: %q, want 1..30", out)
	}
}

// TestPauseCheckpointHandsOffSSHExecRestart: a command handed over at a
// pause is the process API's across a gateway restart while the session
// is paused: the restarted gateway lists it, resumes the session, and
// the command finishes.
func TestPauseCheckpointHandsOffSSHExecRestart(t *testing.T) {
	requireLinuxDriver(t)
	criu := criuForTest(t)
	args := []string{"--sandbox", "linux", "--checkpoint", "--criu", criu}
	g := startGateway(t, append(args, "--keep-sandboxes-on-exit=true")...)
	s := g.createSession(t)
	id := s.SessionID
	t.Cleanup(func() { deleteQuietly(g, id) })
	const loop = `for i in $(seq 20); do echo $i >> /workspace/out; echo line-$i; sleep 0.2; done; echo end`
	_, ready, out, errb, done := openSSH(t, g, s, "line-3", loop)
	select {
	case <-ready:
	case <-time.After(60 * time.Second):
		t.Fatalf("the ssh command never started: %q %q", out.String(), errb.String())
	}
	var a pauseAnswer
	if code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/pause", nil, &a); code != http.StatusOK ||
		a.Pause.Method != "checkpoint" || len(a.Pause.KeptCommands) != 1 {
		t.Fatalf("pause: %d %+v", code, a)
	}
	pid := a.Pause.KeptCommands[0].ProcessID
	<-done
	g2 := &gatewayProc{DataDir: g.DataDir, Token: g.Token, stdout: &gwtest.Buffer{}, stderr: &gwtest.Buffer{}, done: make(chan struct{})}
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	<-g.done
	g2.start(t, append([]string{"serve", "--listen", "127.0.0.1:0", "--data-dir", g.DataDir, "--api-key", g.Token, "--keep-sandboxes-on-exit=false"}, args...))
	g = g2
	pc := procClient{g: g, base: "/v1/sessions/" + id + "/processes"}
	p := pc.waitEnd(t, pid)
	if p.Status != "exited" || p.ExitCode == nil || *p.ExitCode != 0 {
		t.Fatalf("the handed-over command after a restart: %+v\n%s", p, g.stderr.String())
	}
	var want strings.Builder
	for i := 1; i <= 20; i++ {
		fmt.Fprintf(&want, "%d\n", i)
	}
	if got := runREST(t, g, id, map[string]any{"command": "cat /workspace/out"}).out(); got != want.String() {
		t.Errorf("/workspace/out: %q, want 1..20", got)
	}
}

// TestPauseCheckpointHandedRESTCommandKeepsItsTimeout: a REST command
// handed over at a pause keeps what was left of its timeout, as running
// time (the pause not counted): once the session runs again, it is ended
// as its timeout would have ended it, rather than run on for ever as a
// background process.
func TestPauseCheckpointHandedRESTCommandKeepsItsTimeout(t *testing.T) {
	requireLinuxDriver(t)
	criu := criuForTest(t)
	g := startGateway(t, "--sandbox", "linux", "--checkpoint", "--criu", criu)
	id := g.createSession(t).SessionID
	pc := procClient{g: g, base: "/v1/sessions/" + id + "/processes"}
	ans := make(chan int, 1)
	go func() {
		var body map[string]any
		ans <- g.api(t, http.MethodPost, "/v1/sessions/"+id+"/commands", map[string]any{"command": "echo x > /workspace/started; sleep 600", "timeout": 8}, &body)
	}()
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(runREST(t, g, id, map[string]any{"command": "cat /workspace/started 2>/dev/null || true"}).out(), "x") {
		if time.Now().After(deadline) {
			t.Fatal("the REST command never started")
		}
		time.Sleep(50 * time.Millisecond)
	}
	var a pauseAnswer
	if code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/pause", nil, &a); code != http.StatusOK || a.Pause.Method != "checkpoint" || len(a.Pause.KeptCommands) != 1 {
		t.Fatalf("pause: %d %+v", code, a.Pause)
	}
	pid := a.Pause.KeptCommands[0].ProcessID
	if code := <-ans; code != http.StatusConflict {
		t.Errorf("the command's answer: %d, want 409", code)
	}
	resumed := time.Now()
	if code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/resume", nil, nil); code != http.StatusOK {
		t.Fatalf("resume: %d", code)
	}
	p := pc.waitEnd(t, pid)
	if p.Status != "killed" || (p.ExitSignal != "HUP" && p.ExitSignal != "KILL") {
		t.Fatalf("the handed-over command past its timeout: %+v, want killed by HUP or KILL", p)
	}
	if p.EndedAt == nil || p.EndedAt.Before(resumed) {
		t.Errorf("ended at %v, before the resume (%v): the pause's time counted", p.EndedAt, resumed)
	}
	if !strings.Contains(g.stderr.String(), "process_timed_out") {
		t.Error("no process_timed_out in the gateway's log")
	}
}
