package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/gwtest"
)

// pauseAnswer is POST /pause's answer: the session and the report.
type pauseAnswer struct {
	Status string `json:"status"`
	Pause  struct {
		Method        string   `json:"method"`
		ResidentBytes *int64   `json:"residentBytes"`
		NotKept       []string `json:"notKept"`
		KeptCommands  []struct {
			ProcessID string `json:"processId"`
			Command   string `json:"command"`
			Source    string `json:"source"`
		} `json:"keptCommands"`
	} `json:"pause"`
}

// pauseSession pauses session id and checks the answer.
func pauseSession(t *testing.T, g *gatewayProc, id string) pauseAnswer {
	t.Helper()
	var a pauseAnswer
	if code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/pause", nil, &a); code != http.StatusOK || a.Status != "paused" {
		t.Fatalf("pause: %d %+v", code, a)
	}
	if a.Pause.Method != "freeze" || len(a.Pause.NotKept) == 0 || a.Pause.ResidentBytes == nil {
		t.Errorf("pause report: %+v", a.Pause)
	}
	return a
}

// frozen reports whether session id's sandbox is frozen, as its freezer
// cgroup (v1 or v2) says; ok is false when there is no such cgroup.
func frozen(id string) (yes, ok bool) {
	for _, f := range []struct{ pat, want string }{
		{"/sys/fs/cgroup/freezer/sandgate/" + id + "/freezer.state", "FROZEN"},
		{"/sys/fs/cgroup/sandgate/" + id + "/cgroup.freeze", "1"},
	} {
		if b, err := os.ReadFile(f.pat); err == nil {
			return strings.TrimSpace(string(b)) == f.want, true
		}
	}
	return false, false
}

// TestPauseAndResume: POST /pause parks a linux sandbox's processes with
// their memory (the python kernel's variable, a background server on the
// sandbox's loopback, a persistent shell's cd and export), POST /resume
// and any later use (a REST command, a kernel call, an SSH connect) let
// them run again where they were; a paused session stays paused across a
// gateway restart; deleting it leaves no frozen cgroup behind.
func TestPauseAndResume(t *testing.T) {
	ssh := gwtest.RequireTool(t, "ssh")
	requireLinuxDriver(t)
	g := startGateway(t, "--keep-sandboxes-on-exit=true", "--sandbox", "linux")
	s := g.createSession(t)
	id := s.SessionID

	// The state a pause must keep.
	if a := runPython(t, g, id, map[string]any{"code": "x = 41 * 2\nx"}); a.result() != "82" {
		t.Fatalf("python: %+v", a)
	}
	const server = "nohup python3 -m http.server 8765 --bind 127.0.0.1 >/dev/null 2>&1 &"
	runREST(t, g, id, map[string]any{"command": server})
	const probe = `python3 -c 'import urllib.request as u; print(u.urlopen("http://127.0.0.1:8765/").status)'`
	deadline := time.Now().Add(20 * time.Second)
	for runREST(t, g, id, map[string]any{"command": probe + " 2>/dev/null || true"}).out() != "200\n" {
		if time.Now().After(deadline) {
			t.Fatal("the background server never answered")
		}
		time.Sleep(200 * time.Millisecond)
	}
	if a := runREST(t, g, id, map[string]any{"command": "mkdir -p /tmp/deep && cd /tmp/deep && export PAUSED_VAR=kept", "shell": "main"}); a.ExitCode == nil || *a.ExitCode != 0 {
		t.Fatalf("shell setup: %+v", a)
	}
	check := func(t *testing.T, g *gatewayProc) {
		t.Helper()
		if a := runPython(t, g, id, map[string]any{"code": "x"}); a.result() != "82" {
			t.Errorf("kernel after resume: %+v", a)
		}
		if out := runREST(t, g, id, map[string]any{"command": probe}).out(); out != "200\n" {
			t.Errorf("server after resume: %q", out)
		}
		if out := runREST(t, g, id, map[string]any{"command": "pwd; echo $PAUSED_VAR", "shell": "main"}).out(); out != "/tmp/deep\nkept\n" {
			t.Errorf("shell after resume: %q", out)
		}
	}

	t.Run("explicit", func(t *testing.T) {
		pauseSession(t, g, id)
		if f, ok := frozen(id); !ok || !f {
			t.Errorf("sandbox frozen = %v (cgroup found: %v)", f, ok)
		}
		if st := sessionStatus(t, g, id); st != "paused" {
			t.Errorf("status %q after pause", st)
		}
		pauseSession(t, g, id) // a second pause changes nothing
		var r fullSession
		if code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/resume", nil, &r); code != http.StatusOK || r.Status != "running" {
			t.Fatalf("resume: %d %+v", code, r)
		}
		if f, _ := frozen(id); f {
			t.Error("still frozen after resume")
		}
		check(t, g)
	})

	t.Run("cli", func(t *testing.T) {
		if out := g.mustCLI(t, "session", "pause", id); !strings.Contains(out, "paused") {
			t.Errorf("session pause:\n%s", out)
		}
		if out := g.mustCLI(t, "session", "resume", id); !strings.Contains(out, "running") {
			t.Errorf("session resume:\n%s", out)
		}
	})

	t.Run("auto-resume-on-a-call", func(t *testing.T) {
		pauseSession(t, g, id)
		check(t, g) // its first call resumes it
		if st := sessionStatus(t, g, id); st != "running" {
			t.Errorf("status %q after a call", st)
		}
	})

	t.Run("auto-resume-on-ssh", func(t *testing.T) {
		pauseSession(t, g, id)
		opts := append(g.sshOpts(t, s), id)
		if out, e, code := runClient(t, g.clientEnv(), nil, ssh, append(opts, "echo hi")...); out != "hi\n" || code != 0 {
			t.Errorf("ssh on a paused session: %q %d %s", out, code, e)
		}
		if st := sessionStatus(t, g, id); st != "running" {
			t.Errorf("status %q after ssh", st)
		}
	})

	t.Run("open-ssh-channel-ends-with-the-reason", func(t *testing.T) {
		opts := append(g.sshOpts(t, s), id)
		var errb bytes.Buffer
		cmd := newCmd(g.clientEnv(), ssh, append(opts, "echo started; exec sleep 600")...)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = &errb
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, _ = io.Copy(io.Discard, stdout)
			done <- cmd.Wait()
		}()
		// Wait until the command runs, then pause under it.
		deadline := time.Now().Add(30 * time.Second)
		for !strings.Contains(runREST(t, g, id, map[string]any{"command": "ps -eo args"}).out(), "sleep 600") {
			if time.Now().After(deadline) {
				t.Fatal("the ssh command never started")
			}
			time.Sleep(100 * time.Millisecond)
		}
		pauseSession(t, g, id)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			t.Fatal("the open ssh connection did not end at the pause")
		}
		if !strings.Contains(errb.String(), "the session is being paused") {
			t.Errorf("ssh's stderr does not say why it ended: %q", errb.String())
		}
		runREST(t, g, id, map[string]any{"command": "pkill -f 'sleep 600' || true"})
	})

	t.Run("across-a-restart", func(t *testing.T) {
		pauseSession(t, g, id)
		g2 := restartWith(t, g, syscall.SIGTERM, "linux")
		if st := sessionStatus(t, g2, id); st != "paused" {
			t.Fatalf("status %q after a restart, want paused", st)
		}
		if f, _ := frozen(id); !f {
			t.Error("the restarted gateway thawed the paused sandbox")
		}
		check(t, g2)
		if st := sessionStatus(t, g2, id); st != "running" {
			t.Errorf("status %q after resuming on the new gateway", st)
		}

		// Deleting a paused session removes its (frozen) cgroups.
		pauseSession(t, g2, id)
		if code := g2.api(t, http.MethodDelete, "/v1/sessions/"+id, nil, nil); code != http.StatusNoContent {
			t.Fatalf("delete: %d", code)
		}
		if _, ok := frozen(id); ok {
			t.Error("the freezer cgroup is left after delete")
		}
		if _, err := os.Stat(filepath.Join(g2.DataDir, "sandboxes", id)); !os.IsNotExist(err) {
			t.Errorf("the sandbox's directory is left after delete: %v", err)
		}
	})
}

// TestPauseRefusals: the errors of /pause and /resume.
func TestPauseRefusals(t *testing.T) {
	g := startGateway(t) // workdir: it cannot pause
	id := g.createSession(t).SessionID
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/pause", nil, &e); code != http.StatusBadRequest || e.Error.Code != "pause_unsupported" {
		t.Errorf("pause on workdir: %d %+v", code, e)
	}
	if code := g.api(t, http.MethodPost, "/v1/sessions/sbx-aaaaaaaaaaaaaaaaaaaa/pause", nil, nil); code != http.StatusNotFound {
		t.Errorf("pause of an unknown session: %d", code)
	}
	if code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/resume", nil, nil); code != http.StatusOK {
		t.Errorf("resume of a running session: %d", code)
	}
}

// TestE2BPauseKeepsProcesses: on the linux driver, E2B's pause is a pause
// in place (the session is paused, not stopped: a background process and
// the kernel live on), and E2B's resume lets it run again.
func TestE2BPauseKeepsProcesses(t *testing.T) {
	requireLinuxDriver(t)
	g := startGateway(t, "--sandbox", "linux")
	e2b := func(method, path string, body string) (int, []byte) {
		t.Helper()
		req, err := http.NewRequest(method, g.URL+"/compat/e2b"+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-API-Key", g.Token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	code, b := e2b(http.MethodPost, "/sandboxes", `{"templateID": "base", "timeout": 600}`)
	if code != http.StatusCreated {
		t.Fatalf("create: %d %s", code, b)
	}
	var sb struct {
		SandboxID string `json:"sandboxID"`
	}
	if err := json.Unmarshal(b, &sb); err != nil {
		t.Fatal(err)
	}
	id := sb.SandboxID
	if a := runPython(t, g, id, map[string]any{"code": "e2b_kept = 7"}); a.errName() != "" {
		t.Fatalf("python: %+v", a)
	}
	if code, b := e2b(http.MethodPost, "/sandboxes/"+id+"/pause", ""); code != http.StatusNoContent {
		t.Fatalf("pause: %d %s", code, b)
	}
	if st := sessionStatus(t, g, id); st != "paused" {
		t.Errorf("status after E2B's pause: %q, want paused (in place, not stopped)", st)
	}
	if code, b := e2b(http.MethodPost, "/sandboxes/"+id+"/pause", ""); code != http.StatusConflict {
		t.Errorf("second pause: %d %s", code, b)
	}
	if code, b := e2b(http.MethodPost, "/sandboxes/"+id+"/resume", `{"timeout": 600}`); code != http.StatusCreated {
		t.Fatalf("resume: %d %s", code, b)
	}
	if st := sessionStatus(t, g, id); st != "running" {
		t.Errorf("status after E2B's resume: %q", st)
	}
	if a := runPython(t, g, id, map[string]any{"code": "e2b_kept"}); a.result() != "7" {
		t.Errorf("kernel after E2B's pause and resume: %+v", a)
	}
}

// TestIdleActionPause: with --idle-action pause an idle session is paused
// in place instead of expiring (its kernel's variable kept, its next call
// resumes it), and expires once it has stayed paused for --paused-ttl.
func TestIdleActionPause(t *testing.T) {
	requireLinuxDriver(t)
	g := startGateway(t, "--sandbox", "linux", "--idle-timeout", "2s", "--idle-action", "pause", "--paused-ttl", "3s")
	id := g.createSession(t).SessionID
	if a := runPython(t, g, id, map[string]any{"code": "idle_kept = 5"}); a.errName() != "" {
		t.Fatalf("python: %+v", a)
	}
	// Watch the freezer on the host: any API call would count as activity.
	waitFrozen := func(want bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			if f, _ := frozen(id); f == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("sandbox frozen never became %v", want)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitFrozen(true)
	if a := runPython(t, g, id, map[string]any{"code": "idle_kept"}); a.result() != "5" {
		t.Errorf("kernel after the idle pause: %+v", a)
	}
	if st := sessionStatus(t, g, id); st != "running" {
		t.Errorf("status after a call on the idle-paused session: %q", st)
	}
	// Idle again: paused, then, 3 s later, expired and removed.
	waitFrozen(true)
	dir := filepath.Join(g.DataDir, "sandboxes", id)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(dir); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the paused session did not expire after --paused-ttl")
		}
		time.Sleep(200 * time.Millisecond)
	}
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if code := g.api(t, http.MethodGet, "/v1/sessions/"+id, nil, &e); code != http.StatusGone || e.Error.Code != "session_gone" {
		t.Errorf("GET after the paused TTL: %d %+v", code, e)
	}
}

// TestPauseEndsCallsInFlight: a pause ends the REST calls in flight on
// the session, saying session_paused, instead of leaving them to wait on
// a frozen sandbox until the next resume: a followed process output ends
// with done false, the error and where to pick it up; a command's answer
// is 409 session_paused, and the command goes on once the session
// resumes.
func TestPauseEndsCallsInFlight(t *testing.T) {
	requireLinuxDriver(t)
	g := startGateway(t, "--sandbox", "linux")
	id := g.createSession(t).SessionID
	do := func(method, path string, body any) *http.Response {
		t.Helper()
		var rd io.Reader
		if body != nil {
			b, _ := json.Marshal(body)
			rd = bytes.NewReader(b)
		}
		req, err := http.NewRequest(method, g.URL+path, rd)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+g.Token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	var proc struct {
		ProcessID string `json:"processId"`
	}
	if code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/processes", map[string]any{"command": "echo started; exec sleep 600"}, &proc); code != http.StatusCreated && code != http.StatusOK {
		t.Fatalf("process: %d", code)
	}
	follow := do(http.MethodGet, "/v1/sessions/"+id+"/processes/"+proc.ProcessID+"/output?follow=true", nil)
	defer follow.Body.Close()
	lines := make(chan string, 16)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(follow.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	type answer struct {
		code int
		body []byte
	}
	cmd := make(chan answer, 1)
	go func() {
		resp := do(http.MethodPost, "/v1/sessions/"+id+"/commands", map[string]any{"command": "touch /tmp/in-flight; sleep 20; echo late > /tmp/late"})
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		cmd <- answer{resp.StatusCode, b}
	}()
	// Both calls are under way before the pause.
	deadline := time.Now().Add(30 * time.Second)
	for runREST(t, g, id, map[string]any{"command": "test -e /tmp/in-flight && echo yes || true"}).out() != "yes\n" {
		if time.Now().After(deadline) {
			t.Fatal("the command never started")
		}
		time.Sleep(100 * time.Millisecond)
	}
	select {
	case l := <-lines:
		if !strings.Contains(l, "started") {
			t.Fatalf("first output line %q", l)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no output on the followed stream")
	}

	pauseSession(t, g, id)
	// Each ends within a generous bound (the old code: not until a resume).
	const bound = 60 * time.Second
	var last string
	timeout := time.After(bound)
stream:
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				break stream
			}
			last = l
		case <-timeout:
			t.Fatalf("the followed output stream did not end at the pause (last line %q)", last)
		}
	}
	var end struct {
		Done       *bool  `json:"done"`
		NextOffset *int64 `json:"nextOffset"`
		Error      struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(last), &end); err != nil || end.Done == nil || *end.Done || end.NextOffset == nil || end.Error.Code != "session_paused" {
		t.Errorf("the stream's last line %q: want done false, nextOffset and error session_paused", last)
	}
	select {
	case a := <-cmd:
		var e struct {
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		_ = json.Unmarshal(a.body, &e)
		if a.code != http.StatusConflict || e.Error.Code != "session_paused" {
			t.Errorf("the command in flight answered %d %s, want 409 session_paused", a.code, a.body)
		}
	case <-time.After(bound):
		t.Fatal("the command in flight did not answer at the pause")
	}
	if st := sessionStatus(t, g, id); st != "paused" {
		t.Errorf("status %q after the calls ended", st)
	}
	// The next call resumes the session; the command went on, and ends.
	deadline = time.Now().Add(60 * time.Second)
	for runREST(t, g, id, map[string]any{"command": "cat /tmp/late 2>/dev/null || true"}).out() != "late\n" {
		if time.Now().After(deadline) {
			t.Fatal("the command paused in flight did not go on after the resume")
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// TestPauseKeepsKernelThroughTimeout: a kernel call in flight at the
// pause whose timeout runs out while the session is paused does not get
// the kernel killed (its interrupt cannot land on a frozen process): the
// session stays paused, and once resumed the cell is interrupted and the
// kernel keeps its state.
func TestPauseKeepsKernelThroughTimeout(t *testing.T) {
	requireLinuxDriver(t)
	g := startGateway(t, "--sandbox", "linux")
	id := g.createSession(t).SessionID
	if a := runPython(t, g, id, map[string]any{"code": "kept = 5"}); a.errName() != "" {
		t.Fatalf("python: %+v", a)
	}
	type answer struct {
		code int
		a    pyAnswer
	}
	call := make(chan answer, 1)
	go func() {
		var a pyAnswer
		code := gwtest.DoJSON(t, g.URL, g.Token, http.MethodPost, "/v1/sessions/"+id+"/python",
			map[string]any{"code": "open('/tmp/cell', 'w').close()\nimport time\ntime.sleep(60)", "timeout": 15}, &a)
		call <- answer{code, a}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for runREST(t, g, id, map[string]any{"command": "test -e /tmp/cell && echo yes || true"}).out() != "yes\n" {
		if time.Now().After(deadline) {
			t.Fatal("the cell never started")
		}
		time.Sleep(100 * time.Millisecond)
	}
	pauseSession(t, g, id)
	// Past the cell's timeout and its interrupt's grace (15 s + 2 s).
	time.Sleep(22 * time.Second)
	if st := sessionStatus(t, g, id); st != "paused" {
		t.Errorf("status %q while paused past the cell's timeout, want paused (the kernel was restarted?)", st)
	}
	var r fullSession
	if code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/resume", nil, &r); code != http.StatusOK {
		t.Fatalf("resume: %d", code)
	}
	select {
	case a := <-call:
		if a.code != http.StatusOK || a.a.StateLost {
			t.Errorf("the cell in flight answered %d %+v", a.code, a.a)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the cell in flight never answered after the resume")
	}
	if a := runPython(t, g, id, map[string]any{"code": "kept"}); a.result() != "5" {
		t.Errorf("the kernel lost its state: %+v", a)
	}
}

// TestPauseCutsDownloadInFlight: a pause cuts a file download under way
// (the paused SFTP server's connection closes) instead of leaving it to
// wait on the frozen server until a resume; the next file call resumes
// the session and works.
func TestPauseCutsDownloadInFlight(t *testing.T) {
	requireLinuxDriver(t)
	g := startGateway(t, "--sandbox", "linux")
	id := g.createSession(t).SessionID
	runREST(t, g, id, map[string]any{"command": "truncate -s 1G /tmp/big && echo small > /tmp/small"})
	req, err := http.NewRequest(http.MethodGet, g.URL+"/v1/sessions/"+id+"/files?path=/tmp/big", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+g.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("download: %d", resp.StatusCode)
	}
	if _, err := io.CopyN(io.Discard, resp.Body, 1<<20); err != nil {
		t.Fatal(err)
	}
	pauseSession(t, g, id)
	got := make(chan int64, 1)
	go func() {
		n, _ := io.Copy(io.Discard, resp.Body)
		got <- n
	}()
	select {
	case n := <-got:
		if n+1<<20 >= 1<<30 {
			t.Errorf("the whole file came while the session was paused (%d bytes)", n)
		}
	case <-time.After(90 * time.Second):
		t.Fatal("the download under way did not end at the pause")
	}
	if st := sessionStatus(t, g, id); st != "paused" {
		t.Errorf("status %q after the download was cut", st)
	}
	var body bytes.Buffer
	req2, _ := http.NewRequest(http.MethodGet, g.URL+"/v1/sessions/"+id+"/files?path=/tmp/small", nil)
	req2.Header.Set("Authorization", "Bearer "+g.Token)
	resp2, err := http.DefaultClient.Do(req2)
	if err != nil {
		t.Fatal(err)
	}
	defer resp2.Body.Close()
	_, _ = io.Copy(&body, resp2.Body)
	if resp2.StatusCode != http.StatusOK || body.String() != "small\n" {
		t.Errorf("the next file call: %d %q", resp2.StatusCode, body.String())
	}
}
