package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sandgate/sandgate/internal/gwtest"
	"github.com/sandgate/sandgate/rest/compat/e2b/envd/gen/process"
)

// TestPauseCheckpointKeepsProcesses: under serve --checkpoint a pause is
// a checkpoint (less than 1 MiB left resident) even while the gateway
// holds the session's background processes (/processes: a counter and a
// server; a shell on a terminal, started with the E2B API) and an OpenSSH
// shell is open: the shell's client is told why
// and its connection closes, the processes are let go of and taken back
// after the resume, the server answers on its port, the kernel keeps its
// variable, the terminal's shell its variable and directory, and the counter's output goes on at its offset, nothing lost
// or repeated; the same across a gateway restart while paused.
func TestPauseCheckpointKeepsProcesses(t *testing.T) {
	ssh := gwtest.RequireTool(t, "ssh")
	requireLinuxDriver(t)
	criu := criuForTest(t)
	args := []string{"--sandbox", "linux", "--checkpoint", "--criu", criu}
	g := startGateway(t, append(args, "--keep-sandboxes-on-exit=true")...)
	s := g.createSession(t)
	id := s.SessionID
	// Deleted before the gateway stops, even when the test fails (the
	// gateway keeps sandboxes on exit).
	t.Cleanup(func() { deleteQuietly(g, id) })
	base := "/v1/sessions/" + id + "/processes"
	pc := procClient{g: g, base: base}

	if a := runPython(t, g, id, map[string]any{"code": "x = 4242\nx"}); a.result() != "4242" {
		t.Fatalf("python: %+v", a)
	}
	counter := pc.start(t, map[string]any{"name": "counter",
		"command": `i=0; while :; do echo "n=$i"; i=$((i+1)); sleep 0.02; done`})
	server := pc.start(t, map[string]any{"name": "server",
		"command": "exec python3 -m http.server 8765 --bind 127.0.0.1"})
	const probe = `python3 -c 'import urllib.request as u; print(u.urlopen("http://127.0.0.1:8765/").status)'`
	deadline := time.Now().Add(30 * time.Second)
	for runREST(t, g, id, map[string]any{"command": probe + " 2>/dev/null || true"}).out() != "200\n" {
		if time.Now().After(deadline) {
			t.Fatal("the background server never answered")
		}
		time.Sleep(200 * time.Millisecond)
	}
	var lastBytes int64
	grows := func(pc procClient, what string) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for {
			p := pc.get(t, counter.ProcessID)
			if p.Status != "running" || p.PID != counter.PID {
				t.Fatalf("%s: counter is %s, pid %d (was %d)", what, p.Status, p.PID, counter.PID)
			}
			if p.OutputBytes > lastBytes+200 {
				lastBytes = p.OutputBytes
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the counter's output stays at %d bytes", what, p.OutputBytes)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	grows(pc, "before the pause")

	// A shell on a terminal (the E2B API's pty.create), its stream closed.
	c, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	st, err := envdClient(t, g, id).Start(c, connect.NewRequest(&process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-i", "-l"}, Envs: map[string]string{"PS1": "$ "}},
		Pty:     &process.PTY{Size: &process.PTY_Size{Cols: 80, Rows: 24}},
	}))
	if err != nil {
		t.Fatal(err)
	}
	if !st.Receive() || st.Msg().GetEvent().GetStart() == nil {
		t.Fatalf("no start event: %v", st.Err())
	}
	term := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: st.Msg().GetEvent().GetStart().GetPid()}}
	typeIn := func(t *testing.T, g *gatewayProc, in, want string) {
		t.Helper()
		pc := envdClient(t, g, id)
		cs, err := pc.Connect(c, connect.NewRequest(&process.ConnectRequest{Process: term}))
		if err != nil {
			t.Fatalf("connect to the terminal: %v", err)
		}
		defer cs.Close()
		r := readPTY(cs).connected(t)
		if _, err := pc.SendInput(c, connect.NewRequest(&process.SendInputRequest{Process: term,
			Input: &process.ProcessInput{Input: &process.ProcessInput_Pty{Pty: []byte(in)}}})); err != nil {
			t.Fatalf("terminal input: %v", err)
		}
		r.wait(t, want)
	}
	_ = st.Close()
	typeIn(t, g, "cd /tmp && TV=kept; echo tv-$((6*7))\n", "tv-42")

	// An interactive OpenSSH shell, open at the pause.
	cmd := newCmd(g.clientEnv(), ssh, append(g.sshOpts(t, s), "-tt", id)...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	ready := make(chan struct{})
	var sshOut bytes.Buffer
	done := make(chan error, 1)
	go func() {
		sc := bufio.NewReader(stdout)
		var once bool
		for {
			line, err := sc.ReadString('\n')
			sshOut.WriteString(line)
			if !once && strings.Contains(line, "shell-ready-") && !strings.Contains(line, "echo") {
				once = true
				close(ready)
			}
			if err != nil {
				break
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
		done <- cmd.Wait()
	}()
	if _, err := io.WriteString(stdin, "echo shell-ready-$((6*7))\n"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ready:
	case <-time.After(60 * time.Second):
		t.Fatalf("the ssh shell never answered: %q %q", sshOut.String(), errb.String())
	}

	pause := func(t *testing.T, g *gatewayProc) { t.Helper(); pauseByCheckpoint(t, g, id) }
	check := func(t *testing.T, g *gatewayProc, pc procClient) {
		t.Helper()
		if a := runPython(t, g, id, map[string]any{"code": "x"}); a.result() != "4242" || a.StateLost {
			t.Errorf("kernel after resume: %+v", a)
		}
		if out := runREST(t, g, id, map[string]any{"command": probe}).out(); out != "200\n" {
			t.Errorf("server after resume: %q", out)
		}
		if p := pc.get(t, server.ProcessID); p.Status != "running" || p.PID != server.PID {
			t.Errorf("server process after resume: %+v (pid was %d)", p, server.PID)
		}
		grows(pc, "after the resume")
		typeIn(t, g, "echo \"$TV-$(pwd)-$((40+2))\"\n", "kept-/tmp-42")
	}

	pause(t, g)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the open ssh shell did not end at the pause")
	}
	if !strings.Contains(errb.String(), "the session is being paused") && !strings.Contains(sshOut.String(), "the session is being paused") {
		t.Errorf("ssh did not say why it ended: stdout %q stderr %q", sshOut.String(), errb.String())
	}
	check(t, g, pc)

	// Paused again, across a gateway restart.
	pause(t, g)
	g2 := &gatewayProc{DataDir: g.DataDir, Token: g.Token, stdout: &gwtest.Buffer{}, stderr: &gwtest.Buffer{}, done: make(chan struct{})}
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	<-g.done
	g2.start(t, append([]string{"serve", "--listen", "127.0.0.1:0", "--data-dir", g.DataDir, "--api-key", g.Token, "--keep-sandboxes-on-exit=false"}, args...))
	g = g2
	if st := sessionStatus(t, g, id); st != "paused" {
		t.Fatalf("status %q after a restart, want paused\n%s", st, g.stderr.String())
	}
	pc = procClient{g: g, base: base}
	check(t, g, pc)

	// The counter's whole output, from offset 0: nothing lost or twice.
	if code := g.api(t, http.MethodPost, base+"/"+counter.ProcessID+"/signal", map[string]any{"signal": "TERM"}, nil); code != http.StatusNoContent {
		t.Fatalf("signal: %d", code)
	}
	if p := pc.waitEnd(t, counter.ProcessID); p.Status != "killed" || p.ExitSignal != "TERM" {
		t.Errorf("the counter after TERM: %+v", p)
	}
	lines, _ := pc.output(t, counter.ProcessID, 0, false)
	data, _, _, _ := collect(t, lines)
	n := counterLines(t, string(data), "n=")
	t.Logf("the counter wrote %d lines across two pauses by checkpoint and a restart", n)
	if code := g.api(t, http.MethodDelete, "/v1/sessions/"+id, nil, nil); code != http.StatusNoContent {
		t.Errorf("delete: %d", code)
	}
}

// openSSH starts ssh with args for session s and returns its stdin, a
// channel closed once a line of its output contains want, what it wrote,
// and a channel that gets its end.
func openSSH(t *testing.T, g *gatewayProc, s sessionJSON, want string, args ...string) (io.WriteCloser, <-chan struct{}, *gwtest.Buffer, *gwtest.Buffer, <-chan error) {
	t.Helper()
	ssh := gwtest.RequireTool(t, "ssh")
	cmd := newCmd(g.clientEnv(), ssh, append(append(g.sshOpts(t, s), s.SessionID), args...)...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	errb := &gwtest.Buffer{}
	cmd.Stderr = errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	out := &gwtest.Buffer{}
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		r := bufio.NewReader(stdout)
		seen := false
		for {
			line, err := r.ReadString('\n')
			_, _ = out.Write([]byte(line))
			if !seen && strings.Contains(line, want) {
				seen = true
				close(ready)
			}
			if err != nil {
				break
			}
		}
		done <- cmd.Wait()
	}()
	return stdin, ready, out, errb, done
}

// TestPauseCheckpointSSH: an OpenSSH shell open at a pause under serve
// --checkpoint no longer makes it a freeze: its client is told why, its
// connection closes, its shell ends (SIGHUP), and the pause is a
// checkpoint that keeps the kernel's variable. An SSH command that
// ignores SIGHUP is handed to the process API (as every exec is): the
// pause is a checkpoint, and the process can be signalled after it.
func TestPauseCheckpointSSH(t *testing.T) {
	requireLinuxDriver(t)
	criu := criuForTest(t)
	g := startGateway(t, "--sandbox", "linux", "--checkpoint", "--criu", criu)
	s := g.createSession(t)
	id := s.SessionID
	if a := runPython(t, g, id, map[string]any{"code": "x = 4242\nx"}); a.result() != "4242" {
		t.Fatalf("python: %+v", a)
	}
	pause := func(t *testing.T) pauseAnswer {
		t.Helper()
		var a pauseAnswer
		start := time.Now()
		if code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/pause", nil, &a); code != http.StatusOK || a.Status != "paused" {
			t.Fatalf("pause: %d %+v", code, a)
		}
		t.Logf("pause (%s) answered in %s", a.Pause.Method, time.Since(start).Round(time.Millisecond))
		if a.Pause.ResidentBytes != nil {
			t.Logf("pause (%s): %d bytes left resident", a.Pause.Method, *a.Pause.ResidentBytes)
		}
		return a
	}
	ended := func(t *testing.T, done <-chan error, out, errb *gwtest.Buffer) {
		t.Helper()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("the open ssh connection did not end at the pause")
		}
		if !strings.Contains(errb.String()+out.String(), "the session is being paused") {
			t.Errorf("ssh did not say why it ended: stdout %q stderr %q", out.String(), errb.String())
		}
	}

	t.Run("shell", func(t *testing.T) {
		stdin, ready, out, errb, done := openSSH(t, g, s, "shell-ready-42", "-tt")
		if _, err := io.WriteString(stdin, "echo shell-ready-$((6*7))\n"); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ready:
		case <-time.After(60 * time.Second):
			t.Fatalf("the ssh shell never answered: %q %q", out.String(), errb.String())
		}
		a := pause(t)
		if a.Pause.Method != "checkpoint" {
			t.Errorf("pause with an ssh shell open: %+v", a.Pause)
		}
		ended(t, done, out, errb)
		if a := runPython(t, g, id, map[string]any{"code": "x"}); a.result() != "4242" || a.StateLost {
			t.Errorf("kernel after resume: %+v", a)
		}
	})

	t.Run("ignores-sighup", func(t *testing.T) {
		// An exec that would outlive its connection (it ignores SIGHUP),
		// which made the pause a freeze before commands under way were
		// handed over: it is handed to the process API like any exec, the
		// pause is a checkpoint, and the process can be signalled after.
		_, ready, out, errb, done := openSSH(t, g, s, "hup-ignored", "trap '' HUP; echo hup-ignored; exec sleep 600")
		select {
		case <-ready:
		case <-time.After(60 * time.Second):
			t.Fatalf("the ssh command never started: %q %q", out.String(), errb.String())
		}
		a := pause(t)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("the open ssh connection did not end at the pause")
		}
		t.Logf("pause: %+v", a.Pause)
		if a.Pause.Method != "checkpoint" || len(a.Pause.KeptCommands) != 1 ||
			a.Pause.KeptCommands[0].Command != "trap '' HUP; echo hup-ignored; exec sleep 600" {
			t.Fatalf("pause with an ssh command that ignores SIGHUP: %+v", a.Pause)
		}
		pid := a.Pause.KeptCommands[0].ProcessID
		if !strings.Contains(errb.String(), "background process "+pid) {
			t.Errorf("ssh did not say where its command went: %q", errb.String())
		}
		if a := runPython(t, g, id, map[string]any{"code": "x"}); a.result() != "4242" || a.StateLost {
			t.Errorf("kernel after resume: %+v", a)
		}
		pc := procClient{g: g, base: "/v1/sessions/" + id + "/processes"}
		if p := pc.get(t, pid); p.Status != "running" {
			t.Fatalf("the handed-over command after the resume: %+v", p)
		}
		if code := g.api(t, http.MethodPost, pc.base+"/"+pid+"/signal", map[string]any{"signal": "TERM"}, nil); code != http.StatusNoContent {
			t.Fatalf("signal: %d", code)
		}
		if p := pc.waitEnd(t, pid); p.Status != "killed" || p.ExitSignal != "TERM" {
			t.Errorf("the handed-over command after its TERM: %+v", p)
		}
	})
}
