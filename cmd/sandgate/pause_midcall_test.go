package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// waitWorkspaceFile polls the session (REST commands) until file exists
// in its workspace: a call under way wrote it.
func waitWorkspaceFile(t *testing.T, g *gatewayProc, id, file string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for runREST(t, g, id, map[string]any{"command": "test -e " + file + " && echo yes || true"}).out() != "yes\n" {
		if time.Now().After(deadline) {
			t.Fatalf("%s never appeared: the call under way did not start", file)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// pausedCallAnswer checks that a call the pause ended answered 409
// session_paused, saying that its code goes on in the sandbox.
func pausedCallAnswer(t *testing.T, ans <-chan apiAnswer, what string) {
	t.Helper()
	var got apiAnswer
	select {
	case got = <-ans:
	case <-time.After(30 * time.Second):
		t.Fatalf("the %s under way did not end at the pause", what)
	}
	msg := fmt.Sprint(got.body)
	if got.code != http.StatusConflict || !strings.Contains(msg, "session_paused") || !strings.Contains(msg, "goes on in the sandbox") {
		t.Errorf("the %s's answer: %d %v", what, got.code, got.body)
	}
	t.Logf("the %s's answer: %d %v", what, got.code, got.body)
}

// pauseWhileWriting pauses session id while a call under way writes
// fast, and checks that the pause is a checkpoint. What the cgroups
// still count right at its answer is then a little higher than
// pauseByCheckpoint's bound: the kernel frees the pipe buffers' memory
// lazily (measured: 1.06–1.1 MiB at the answer, 0.55 MiB a moment later,
// the cgroup's rss and cache both 0), so the bound here is 2 MiB; a
// freeze keeps the whole kernel (tens of MiB).
func pauseWhileWriting(t *testing.T, g *gatewayProc, id string) {
	t.Helper()
	var a pauseAnswer
	if code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/pause", nil, &a); code != http.StatusOK || a.Status != "paused" {
		t.Fatalf("pause: %d %+v", code, a)
	}
	if a.Pause.Method != "checkpoint" || a.Pause.ResidentBytes == nil || *a.Pause.ResidentBytes >= 2<<20 {
		t.Fatalf("pause report: %+v (resident %v)", a.Pause, a.Pause.ResidentBytes)
	}
	t.Logf("paused by checkpoint: %d bytes resident", *a.Pause.ResidentBytes)
}

type apiAnswer struct {
	code int
	body map[string]any
}

// TestPauseCheckpointKernelCallUnderWay: a Python kernel call under way
// at a pause under serve --checkpoint no longer makes the pause a freeze:
// the pause is a checkpoint (memory freed), the call answers 409
// session_paused, and its cell goes on after the resume, in the kernel
// taken back with its state: the next call sees the variables set before
// the call and what the interrupted cell set after the resume (x == 42),
// and its output is only its own (the interrupted cell's late output is
// dropped).
func TestPauseCheckpointKernelCallUnderWay(t *testing.T) {
	requireLinuxDriver(t)
	criu := criuForTest(t)
	g := startGateway(t, "--sandbox", "linux", "--checkpoint", "--criu", criu)
	id := g.createSession(t).SessionID
	if a := runPython(t, g, id, map[string]any{"code": "y = 7\ny"}); a.result() != "7" {
		t.Fatalf("python: %+v", a)
	}
	ans := make(chan apiAnswer, 1)
	go func() {
		var body map[string]any
		code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/python", map[string]any{"timeout": 120,
			"code": "import time\nprint('before')\nx = 41\nopen('/workspace/kstarted', 'w').close()\n" +
				"time.sleep(3)\nx += 1\nprint('late-output')\n'late-result'"}, &body)
		ans <- apiAnswer{code, body}
	}()
	waitWorkspaceFile(t, g, id, "/workspace/kstarted")
	pauseByCheckpoint(t, g, id)
	pausedCallAnswer(t, ans, "kernel call")

	a := runPython(t, g, id, map[string]any{"code": "print('own')\n(x, y)"})
	if a.result() != "(42, 7)" || a.StateLost || a.Restarted || a.Error != nil {
		t.Errorf("the next call after the resume: %+v (result %s)", a, a.result())
	}
	if a.Stdout == nil || *a.Stdout != "own\n" {
		t.Errorf("the next call's stdout is not only its own: %v", a.Stdout)
	}
	// And again: the kernel is an ordinary one from then on.
	if a := runPython(t, g, id, map[string]any{"code": "x + y"}); a.result() != "49" || a.StateLost {
		t.Errorf("a later call: %+v", a)
	}

	// A cell that writes all the time (the channel is cut anywhere, in
	// a frame too) and runs on for longer than the next call's timeout:
	// that call waits for it (as for a call queued before it), then
	// answers with only its own output, the state whole.
	go func() {
		var body map[string]any
		code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/python", map[string]any{"timeout": 120,
			"code": "import sys, time\nopen('/workspace/kstarted2', 'w').close()\n" +
				"for i in range(500):\n    sys.stdout.write('z' * 3000 + '\\n')\n    time.sleep(0.008)\nz_done = i"}, &body)
		ans <- apiAnswer{code, body}
	}()
	waitWorkspaceFile(t, g, id, "/workspace/kstarted2")
	time.Sleep(300 * time.Millisecond) // well into its output
	pauseWhileWriting(t, g, id)
	pausedCallAnswer(t, ans, "writing kernel call")
	a = runPython(t, g, id, map[string]any{"code": "print('own2')\n(z_done, x)", "timeout": 1})
	if a.result() != "(499, 42)" || a.StateLost || a.Restarted || a.Error != nil || a.TimedOut {
		t.Errorf("the call after the writing cell: %+v (result %s)", a, a.result())
	}
	if a.Stdout == nil || *a.Stdout != "own2\n" {
		t.Errorf("the call after the writing cell: stdout is not only its own: %.200q", derefOr(a.Stdout))
	}
}

func derefOr(p *string) string {
	if p == nil {
		return "<nil>"
	}
	return *p
}

// TestPauseCheckpointShellCommandUnderWay: the same for a persistent
// shell's command under way ({"shell": "main"}): the pause is a
// checkpoint, the command's answer 409 session_paused, and after the
// resume the next command in that shell finds the shell's state as the
// interrupted command left it once it ended (its cd and both exports),
// with only its own output.
func TestPauseCheckpointShellCommandUnderWay(t *testing.T) {
	requireLinuxDriver(t)
	criu := criuForTest(t)
	g := startGateway(t, "--sandbox", "linux", "--checkpoint", "--criu", criu)
	id := g.createSession(t).SessionID
	if out := runREST(t, g, id, map[string]any{"command": "export Z=0; echo ready", "shell": "main"}).out(); out != "ready\n" {
		t.Fatalf("shell: %q", out)
	}
	ans := make(chan apiAnswer, 1)
	go func() {
		var body map[string]any
		code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/commands", map[string]any{"shell": "main", "timeout": 120,
			"command": "cd /tmp; export A=1; echo before; : > /workspace/sstarted; sleep 3; export B=2; echo late-output"}, &body)
		ans <- apiAnswer{code, body}
	}()
	waitWorkspaceFile(t, g, id, "/workspace/sstarted")
	pauseByCheckpoint(t, g, id)
	pausedCallAnswer(t, ans, "shell command")

	a := runREST(t, g, id, map[string]any{"command": `echo own; echo "$Z-$A-$B-$(pwd)"`, "shell": "main"})
	if a.out() != "own\n0-1-2-/tmp\n" || a.code() != 0 {
		t.Errorf("the next command after the resume: %q (exit %d)", a.out(), a.code())
	}
	if a := runREST(t, g, id, map[string]any{"command": `echo "$A$B"`, "shell": "main"}); a.out() != "12\n" {
		t.Errorf("a later command: %q", a.out())
	}

	// A command that writes all the time and runs on for longer than
	// the next command's timeout: that one waits for it, then answers
	// with only its own output, the state whole.
	go func() {
		var body map[string]any
		code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/commands", map[string]any{"shell": "main", "timeout": 120,
			"command": `: > /workspace/sstarted2; for i in $(seq 300); do printf '%03000d\n' 0; sleep 0.01; done; export C=3`}, &body)
		ans <- apiAnswer{code, body}
	}()
	waitWorkspaceFile(t, g, id, "/workspace/sstarted2")
	time.Sleep(300 * time.Millisecond)
	pauseWhileWriting(t, g, id)
	pausedCallAnswer(t, ans, "writing shell command")
	a = runREST(t, g, id, map[string]any{"command": `echo own2; echo "$A$B$C"`, "shell": "main", "timeout": 1})
	if a.out() != "own2\n123\n" || a.code() != 0 || a.TimedOut {
		t.Errorf("the command after the writing one: %.200q (exit %d, timed out %v)", a.out(), a.code(), a.TimedOut)
	}
}

// TestPauseCheckpointKernelCallUnderWayReset: a call that waits, after
// the resume, for the cell a pause let go of does not hold a reset of
// the kernel: the reset ends the interpreter (and the cell), the waiting
// call answers kernel_reset, and the next call gets a fresh kernel.
func TestPauseCheckpointKernelCallUnderWayReset(t *testing.T) {
	requireLinuxDriver(t)
	criu := criuForTest(t)
	g := startGateway(t, "--sandbox", "linux", "--checkpoint", "--criu", criu)
	id := g.createSession(t).SessionID
	ans := make(chan apiAnswer, 2)
	post := func(code string) {
		var body map[string]any
		c := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/python", map[string]any{"timeout": 900, "code": code}, &body)
		ans <- apiAnswer{c, body}
	}
	go post("import time\nx = 1\nopen('/workspace/kstarted', 'w').close()\ntime.sleep(600)")
	waitWorkspaceFile(t, g, id, "/workspace/kstarted")
	pauseByCheckpoint(t, g, id)
	pausedCallAnswer(t, ans, "kernel call")
	go post("x") // resumes the session, then waits for the sleeping cell
	deadline := time.Now().Add(60 * time.Second)
	for sessionStatus(t, g, id) != "running" {
		if time.Now().After(deadline) {
			t.Fatal("the next call did not resume the session")
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // into its wait
	var reset map[string]any
	if code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/python/reset", map[string]any{}, &reset); code != http.StatusOK || reset["existed"] != true {
		t.Fatalf("reset: %d %v", code, reset)
	}
	select {
	case got := <-ans:
		if got.code != http.StatusConflict || !strings.Contains(fmt.Sprint(got.body), "kernel_reset") {
			t.Errorf("the waiting call after the reset: %d %v", got.code, got.body)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the waiting call did not end with the reset")
	}
	if a := runPython(t, g, id, map[string]any{"code": "'x' in globals()"}); a.result() != "False" {
		t.Errorf("after the reset: %+v (result %s)", a, a.result())
	}
}

// TestPauseCheckpointWhileWaitingForInterruptedCall: a call that waits,
// after the resume, for the cell (command) a pause let go of, and that a
// second pause by checkpoint ends there, answers 409 session_paused
// saying that its own code did not run (it was never sent, and is not),
// not that it goes on in the sandbox (the answer of the call whose code
// was under way): a client told so would not run it again. On the merged
// code both said "goes on in the sandbox".
func TestPauseCheckpointWhileWaitingForInterruptedCall(t *testing.T) {
	requireLinuxDriver(t)
	criu := criuForTest(t)
	g := startGateway(t, "--sandbox", "linux", "--checkpoint", "--criu", criu)
	id := g.createSession(t).SessionID
	for _, c := range []struct{ what, path, start, next, ran string }{
		{"kernel call", "/python", "import time\nopen('/workspace/started', 'w').close()\ntime.sleep(600)",
			"open('/workspace/ran', 'w').close()", "/workspace/ran"},
		{"shell command", "/commands", ": > /workspace/started2; sleep 600", ": > /workspace/ran2", "/workspace/ran2"},
	} {
		ans := make(chan apiAnswer, 2)
		post := func(code string) {
			body := map[string]any{"timeout": 900, "code": code}
			if c.path == "/commands" {
				body = map[string]any{"timeout": 900, "command": code, "shell": "main"}
			}
			var got map[string]any
			status := g.api(t, http.MethodPost, "/v1/sessions/"+id+c.path, body, &got)
			ans <- apiAnswer{status, got}
		}
		go post(c.start)
		started := "/workspace/started"
		if c.path == "/commands" {
			started = "/workspace/started2"
		}
		waitWorkspaceFile(t, g, id, started)
		// pauseWhileWriting's bound (2 MiB): what the cgroup counts
		// right at the answer of these pauses was measured up to 1.3 MiB
		// under load (lazily freed buffers); a freeze keeps tens of MiB.
		pauseWhileWriting(t, g, id)
		pausedCallAnswer(t, ans, c.what)

		go post(c.next) // resumes the session, then waits for the interrupted one
		deadline := time.Now().Add(60 * time.Second)
		for sessionStatus(t, g, id) != "running" {
			if time.Now().After(deadline) {
				t.Fatalf("the next %s did not resume the session", c.what)
			}
			time.Sleep(50 * time.Millisecond)
		}
		time.Sleep(500 * time.Millisecond) // into its wait
		pauseWhileWriting(t, g, id)
		var got apiAnswer
		select {
		case got = <-ans:
		case <-time.After(60 * time.Second):
			t.Fatalf("the waiting %s did not end at the second pause", c.what)
		}
		msg := fmt.Sprint(got.body)
		if got.code != http.StatusConflict || !strings.Contains(msg, "session_paused") || strings.Contains(msg, "goes on in the sandbox") {
			t.Errorf("the waiting %s's answer at the second pause: %d %v", c.what, got.code, got.body)
		}
		if out := runREST(t, g, id, map[string]any{"command": "test -e " + c.ran + " && echo ran || echo not"}).out(); out != "not\n" {
			t.Errorf("the waiting %s's code: %q, want not run", c.what, out)
		}
	}
}
