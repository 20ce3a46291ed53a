package main

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sandgate/sandgate/dataplane"
	"github.com/sandgate/sandgate/internal/gwtest"
	"github.com/sandgate/sandgate/rest/compat/e2b/envd/gen/process"
	"github.com/sandgate/sandgate/rest/compat/e2b/envd/gen/process/processconnect"
)

// headerTransport adds hdr to every request.
type headerTransport struct {
	base http.RoundTripper
	hdr  map[string]string
}

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range h.hdr {
		r.Header.Set(k, v)
	}
	return h.base.RoundTrip(r)
}

// envdClient is the E2B envd process client of session id on g.
func envdClient(t *testing.T, g *gatewayProc, id string) processconnect.ProcessClient {
	t.Helper()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: headerTransport{base: tr, hdr: map[string]string{
		"Authorization": "Bearer " + g.Token, "E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983",
	}}}
	return processconnect.NewProcessClient(hc, g.URL+"/compat/e2b/sandbox", connect.WithProtoJSON())
}

// ptyReader collects the terminal output of a Start or Connect stream.
type ptyReader struct {
	out     gwtest.Buffer
	done    chan struct{}
	started chan struct{} // closed at the stream's start event
}

func readPTY[T interface{ GetEvent() *process.ProcessEvent }](st interface {
	Receive() bool
	Msg() T
}) *ptyReader {
	r := &ptyReader{done: make(chan struct{}), started: make(chan struct{})}
	go func() {
		defer close(r.done)
		for st.Receive() {
			if st.Msg().GetEvent().GetStart() != nil {
				select {
				case <-r.started:
				default:
					close(r.started)
				}
			}
			if d := st.Msg().GetEvent().GetData(); d != nil {
				_, _ = r.out.Write(d.GetPty())
			}
		}
	}()
	return r
}

// connected waits for a Connect stream's start event, which the gateway
// sends once it follows the process's output from where it ends then:
// input typed before it may be answered before the stream follows.
func (r *ptyReader) connected(t *testing.T) *ptyReader {
	t.Helper()
	select {
	case <-r.started:
	case <-r.done:
		t.Fatal("the terminal's stream ended before its start event")
	case <-time.After(60 * time.Second):
		t.Fatal("no start event on the terminal's stream")
	}
	return r
}

// wait waits until the terminal output holds want.
func (r *ptyReader) wait(t *testing.T, want string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(r.out.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("the terminal never showed %q: %q", want, r.out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestPauseCheckpointPTY: a process on a terminal (the E2B envd API's
// pty.create) is kept by the sandbox's init, so a pause under serve
// --checkpoint is a checkpoint (less than 1 MiB left resident) with it
// running; after the resume, after a gateway restart while paused, and
// after a gateway restart while it runs,
// the same shell answers on its terminal with its variables and
// directory, its terminal keeps its size, and a resize reaches it.
func TestPauseCheckpointPTY(t *testing.T) {
	requireLinuxDriver(t)
	criu := criuForTest(t)
	args := []string{"--sandbox", "linux", "--checkpoint", "--criu", criu}
	g := startGateway(t, append(args, "--keep-sandboxes-on-exit=true")...)
	id := g.createSession(t).SessionID
	t.Cleanup(func() { deleteQuietly(g, id) })
	c, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	pc := envdClient(t, g, id)
	st, err := pc.Start(c, connect.NewRequest(&process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-i", "-l"},
			Envs: map[string]string{"TERM": "xterm-256color", "PS1": "$ "}},
		Pty: &process.PTY{Size: &process.PTY_Size{Cols: 80, Rows: 24}},
	}))
	if err != nil {
		t.Fatal(err)
	}
	if !st.Receive() || st.Msg().GetEvent().GetStart() == nil {
		t.Fatalf("no start event: %v", st.Err())
	}
	pid := st.Msg().GetEvent().GetStart().GetPid()
	r := readPTY(st)
	sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}
	input := func(t *testing.T, pc processconnect.ProcessClient, s string) { t.Helper(); ptyInput(c, t, pc, sel, s) }
	input(t, pc, "cd /tmp && PTYVAR=kept; echo ready-$((6*7))\n")
	r.wait(t, "ready-42")

	pause := func(t *testing.T, g *gatewayProc) { t.Helper(); pauseByCheckpoint(t, g, id) }
	prevSize := "24x80"
	check := func(t *testing.T, g *gatewayProc, round int) {
		t.Helper()
		if code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/resume", nil, nil); code != http.StatusOK {
			t.Fatalf("resume: %d", code)
		}
		pc := envdClient(t, g, id)
		cs, err := pc.Connect(c, connect.NewRequest(&process.ConnectRequest{Process: sel}))
		if err != nil {
			t.Fatalf("connect after the resume: %v\n%s", err, g.stderr.String())
		}
		defer cs.Close()
		r := readPTY(cs).connected(t)
		// The size it had is kept (the terminal was dumped and restored).
		input(t, pc, "echo \"size-$(stty size | tr ' ' x)\"\n")
		r.wait(t, "size-"+prevSize)
		cols := 90 + round
		prevSize = "33x" + strconv.Itoa(cols)
		if _, err := pc.Update(c, connect.NewRequest(&process.UpdateRequest{Process: sel,
			Pty: &process.PTY{Size: &process.PTY_Size{Cols: uint32(cols), Rows: 33}}})); err != nil {
			t.Fatalf("resize after the resume: %v", err)
		}
		input(t, pc, "echo \"$PTYVAR-$(pwd)-$((40+2))\"; stty size\n")
		r.wait(t, "kept-/tmp-42")
		r.wait(t, "33 "+strconv.Itoa(cols))
	}

	pause(t, g)
	check(t, g, 1)
	_ = st.Close() // an open stream would hold the gateway's shutdown up

	// Paused again, across a gateway restart (that keeps sandboxes).
	pause(t, g)
	g2 := &gatewayProc{DataDir: g.DataDir, Token: g.Token, stdout: &gwtest.Buffer{}, stderr: &gwtest.Buffer{}, done: make(chan struct{})}
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	<-g.done
	g2.start(t, append([]string{"serve", "--listen", "127.0.0.1:0", "--data-dir", g.DataDir, "--api-key", g.Token, "--keep-sandboxes-on-exit=true"}, args...))
	g = g2
	check(t, g, 2)

	// A gateway restart with the session running: the terminal is kept
	// by the init and handed back to the next gateway.
	g3 := &gatewayProc{DataDir: g.DataDir, Token: g.Token, stdout: &gwtest.Buffer{}, stderr: &gwtest.Buffer{}, done: make(chan struct{})}
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	<-g.done
	g3.start(t, append([]string{"serve", "--listen", "127.0.0.1:0", "--data-dir", g.DataDir, "--api-key", g.Token, "--keep-sandboxes-on-exit=false"}, args...))
	g = g3
	check(t, g, 3)
	if code := g.api(t, http.MethodDelete, "/v1/sessions/"+id, nil, nil); code != http.StatusNoContent {
		t.Errorf("delete: %d", code)
	}
}

// deleteQuietly deletes session id on g if g still answers (a test's
// cleanup: the gateway keeps sandboxes on exit).
func deleteQuietly(g *gatewayProc, id string) {
	req, err := http.NewRequest(http.MethodDelete, g.URL+"/v1/sessions/"+id, nil)
	if err != nil {
		return
	}
	req.Header.Set("Authorization", "Bearer "+g.Token)
	if res, err := http.DefaultClient.Do(req); err == nil {
		res.Body.Close()
	}
}

// TestForkPTY: a fork of a session with a shell on a terminal (the E2B
// API's pty) has that shell, as the source had it (its variables, its
// directory, its terminal's size), under the same pid, and the source's
// goes on apart from it, and its background process (/v1) with its
// output; so does a fork of the session paused by checkpoint (forked from
// its images).
func TestForkPTY(t *testing.T) {
	requireLinuxDriver(t)
	criu := criuForTest(t)
	g := startGateway(t, "--sandbox", "linux", "--checkpoint", "--criu", criu)
	id := g.createSession(t).SessionID
	c, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	pc := envdClient(t, g, id)
	st, err := pc.Start(c, connect.NewRequest(&process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-i", "-l"},
			Envs: map[string]string{"TERM": "xterm-256color", "PS1": "$ "}},
		Pty: &process.PTY{Size: &process.PTY_Size{Cols: 81, Rows: 25}},
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if !st.Receive() || st.Msg().GetEvent().GetStart() == nil {
		t.Fatalf("no start event: %v", st.Err())
	}
	pid := st.Msg().GetEvent().GetStart().GetPid()
	r := readPTY(st)
	sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}
	input := func(t *testing.T, pc processconnect.ProcessClient, s string) { t.Helper(); ptyInput(c, t, pc, sel, s) }
	input(t, pc, "cd /tmp && PTYVAR=forked; echo ready-$((6*7))\n")
	r.wait(t, "ready-42")
	// And a background process (/v1), its output read by the gateway.
	bg := procClient{g: g, base: "/v1/sessions/" + id + "/processes"}.start(t,
		map[string]any{"command": "i=0; while :; do echo \"n=$i\"; i=$((i+1)); sleep 0.05; done"})

	// checkFork finds the shell in fork fid as the source had it, and
	// sets its own variable there.
	checkFork := func(t *testing.T, fid, mark string) {
		t.Helper()
		fc := envdClient(t, g, fid)
		cs, err := fc.Connect(c, connect.NewRequest(&process.ConnectRequest{Process: sel}))
		if err != nil {
			t.Fatalf("connect in the fork: %v\n%s", err, g.stderr.String())
		}
		defer cs.Close()
		fr := readPTY(cs).connected(t)
		input(t, fc, "echo \"$PTYVAR-$(pwd)-$(stty size | tr ' ' x)-$((40+2))\"; PTYVAR="+mark+"\n")
		fr.wait(t, "forked-/tmp-25x81-42")
		// The background process runs on in the fork, its output kept
		// from the start, once and in order.
		fp := procClient{g: g, base: "/v1/sessions/" + fid + "/processes"}
		start := fp.get(t, bg.ProcessID).OutputBytes
		deadline := time.Now().Add(30 * time.Second)
		for p := fp.get(t, bg.ProcessID); p.Status != "running" || p.OutputBytes < start+100; p = fp.get(t, bg.ProcessID) {
			if p.Status != "running" || time.Now().After(deadline) {
				t.Fatalf("the fork's background process: %+v (from %d bytes)", p, start)
			}
			time.Sleep(50 * time.Millisecond)
		}
		if code := g.api(t, http.MethodPost, fp.base+"/"+bg.ProcessID+"/signal", map[string]any{"signal": "KILL"}, nil); code != http.StatusNoContent {
			t.Fatalf("signal: %d", code)
		}
		fp.waitEnd(t, bg.ProcessID)
		lines, _ := fp.output(t, bg.ProcessID, 0, false)
		data, _, _, _ := collect(t, lines)
		counterLines(t, string(data), "n=")
	}
	fork := func(t *testing.T) string {
		t.Helper()
		var fa forkAnswer
		if code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/fork", map[string]any{"count": 1}, &fa); code != http.StatusCreated || len(fa.Sessions) != 1 {
			t.Fatalf("fork: %d %+v\n%s", code, fa, g.stderr.String())
		}
		return fa.Sessions[0].SessionID
	}
	checkFork(t, fork(t), "fork1")
	// The source's shell is its own.
	input(t, pc, "echo \"src-$PTYVAR\"\n")
	r.wait(t, "src-forked")

	// Forked while paused by checkpoint: from its images.
	var a pauseAnswer
	if code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/pause", nil, &a); code != http.StatusOK || a.Pause.Method != "checkpoint" {
		t.Fatalf("pause: %d %+v\n%s", code, a, g.stderr.String())
	}
	checkFork(t, fork(t), "fork2")
	if code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/resume", nil, nil); code != http.StatusOK {
		t.Fatalf("resume: %d", code)
	}
	cs, err := pc.Connect(c, connect.NewRequest(&process.ConnectRequest{Process: sel}))
	if err != nil {
		t.Fatalf("connect after the resume: %v", err)
	}
	defer cs.Close()
	sr := readPTY(cs).connected(t)
	input(t, pc, "echo \"src-again-$PTYVAR\"\n")
	sr.wait(t, "src-again-forked")
}

// ptyInput writes s to the terminal of the process sel (E2B's SendInput).
func ptyInput(ctx context.Context, t *testing.T, pc processconnect.ProcessClient, sel *process.ProcessSelector, s string) {
	t.Helper()
	if _, err := pc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: sel,
		Input: &process.ProcessInput{Input: &process.ProcessInput_Pty{Pty: []byte(s)}}})); err != nil {
		t.Fatalf("input: %v", err)
	}
}

// pauseByCheckpoint pauses session id and fails unless the pause was a
// checkpoint that left under 1 MiB resident.
func pauseByCheckpoint(t *testing.T, g *gatewayProc, id string) {
	t.Helper()
	var a pauseAnswer
	start := time.Now()
	if code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/pause", nil, &a); code != http.StatusOK || a.Status != "paused" {
		t.Fatalf("pause: %d %+v", code, a)
	}
	t.Logf("pause (%s) answered in %s", a.Pause.Method, time.Since(start).Round(time.Millisecond))
	if a.Pause.Method != "checkpoint" || a.Pause.ResidentBytes == nil || *a.Pause.ResidentBytes >= 1<<20 {
		t.Fatalf("pause report: %+v (resident %v)\n%s", a.Pause, a.Pause.ResidentBytes, g.stderr.String())
	}
	t.Logf("paused by checkpoint: %d bytes resident", *a.Pause.ResidentBytes)
}

// TestPauseCheckpointPTYOutput: what a process on a terminal writes
// around a pause by checkpoint, its reader let go of before the dump, is
// all in its output after the resume, once and in order.
func TestPauseCheckpointPTYOutput(t *testing.T) {
	requireLinuxDriver(t)
	criu := criuForTest(t)
	g := startGateway(t, "--sandbox", "linux", "--checkpoint", "--criu", criu)
	id := g.createSession(t).SessionID
	c, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	pc := envdClient(t, g, id)
	st, err := pc.Start(c, connect.NewRequest(&process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", `stty -echo -onlcr; i=0; while :; do for j in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do echo "p=$i"; i=$((i+1)); done; sleep 0.01; done`}},
		Pty:     &process.PTY{Size: &process.PTY_Size{Cols: 80, Rows: 24}},
	}))
	if err != nil {
		t.Fatal(err)
	}
	if !st.Receive() || st.Msg().GetEvent().GetStart() == nil {
		t.Fatalf("no start event: %v", st.Err())
	}
	sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: st.Msg().GetEvent().GetStart().GetPid()}}
	_ = st.Close()
	var listed struct {
		Processes []restProcess `json:"processes"`
	}
	if code := g.api(t, http.MethodGet, "/v1/sessions/"+id+"/processes", nil, &listed); code != http.StatusOK || len(listed.Processes) != 1 {
		t.Fatalf("processes: %d %+v", code, listed)
	}
	list := listed.Processes
	proc := procClient{g: g, base: "/v1/sessions/" + id + "/processes"}
	grows := func(what string) {
		t.Helper()
		start := proc.get(t, list[0].ProcessID).OutputBytes
		deadline := time.Now().Add(60 * time.Second)
		for proc.get(t, list[0].ProcessID).OutputBytes < start+2000 {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the output does not grow", what)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	grows("before the pauses")
	for i := range 2 {
		var a pauseAnswer
		if code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/pause", nil, &a); code != http.StatusOK || a.Pause.Method != "checkpoint" {
			t.Fatalf("pause %d: %d %+v\n%s", i, code, a, g.stderr.String())
		}
		if code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/resume", nil, nil); code != http.StatusOK {
			t.Fatalf("resume %d: %d", i, code)
		}
		grows("after a resume")
	}
	if _, err := pc.SendSignal(c, connect.NewRequest(&process.SendSignalRequest{Process: sel, Signal: process.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
	proc.waitEnd(t, list[0].ProcessID)
	lines, _ := proc.output(t, list[0].ProcessID, 0, false)
	data, _, _, _ := collect(t, lines)
	text := string(data)
	if i := strings.LastIndexByte(text, '\n'); i >= 0 {
		text = text[:i+1] // the line the kill cut
	}
	n := counterLines(t, text, "p=")
	t.Logf("the terminal showed %d lines across two pauses by checkpoint", n)
}

// TestForkAfterFreezeFallback: a fork of a session paused by a freeze
// after its background process was let go of (a command under way held
// the pause back from a checkpoint) resumes it, forks it, and the fork
// has the background process with all its output, once and in order: the
// process is taken back either before the fork's checkpoint or after it,
// never during it.
func TestForkAfterFreezeFallback(t *testing.T) {
	requireLinuxDriver(t)
	criu := criuForTest(t)
	g := startGateway(t, "--sandbox", "linux", "--checkpoint", "--criu", criu)
	id := g.createSession(t).SessionID
	pc := procClient{g: g, base: "/v1/sessions/" + id + "/processes"}
	bg := pc.start(t, map[string]any{"command": `i=0; while :; do echo "n=$i"; i=$((i+1)); sleep 0.01; done`})
	deadline := time.Now().Add(30 * time.Second)
	for pc.get(t, bg.ProcessID).OutputBytes < 500 {
		if time.Now().After(deadline) {
			t.Fatal("the background process writes nothing")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A REST command under way that the process API cannot take (it runs
	// its most, dataplane.DefaultMaxRunning, so the hand-over is refused:
	// docs/pause.md) keeps its connection, so the pause is a freeze (after
	// the background processes were let go of).
	for range dataplane.DefaultMaxRunning - 1 {
		pc.start(t, map[string]any{"command": "sleep 1000"})
	}
	go func() {
		req, _ := http.NewRequest(http.MethodPost, g.URL+"/v1/sessions/"+id+"/commands", strings.NewReader(`{"command":"sleep 15"}`))
		req.Header.Set("Authorization", "Bearer "+g.Token)
		req.Header.Set("Content-Type", "application/json")
		if res, err := http.DefaultClient.Do(req); err == nil {
			res.Body.Close()
		}
	}()
	time.Sleep(time.Second)
	var a pauseAnswer
	if code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/pause", nil, &a); code != http.StatusOK || a.Pause.Method != "freeze" {
		t.Fatalf("pause: %d %+v", code, a)
	}
	for round := range 3 {
		var fa forkAnswer
		if code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/fork", map[string]any{"count": 1}, &fa); code != http.StatusCreated || len(fa.Sessions) != 1 {
			t.Fatalf("fork %d: %d %+v\n%s", round, code, fa, g.stderr.String())
		}
		fid := fa.Sessions[0].SessionID
		fp := procClient{g: g, base: "/v1/sessions/" + fid + "/processes"}
		start := fp.get(t, bg.ProcessID).OutputBytes
		deadline := time.Now().Add(30 * time.Second)
		for p := fp.get(t, bg.ProcessID); p.OutputBytes < start+200; p = fp.get(t, bg.ProcessID) {
			if p.Status != "running" || time.Now().After(deadline) {
				t.Fatalf("fork %d: its background process: %+v (from %d bytes)", round, p, start)
			}
			time.Sleep(50 * time.Millisecond)
		}
		if code := g.api(t, http.MethodPost, fp.base+"/"+bg.ProcessID+"/signal", map[string]any{"signal": "KILL"}, nil); code != http.StatusNoContent {
			t.Fatalf("signal: %d", code)
		}
		fp.waitEnd(t, bg.ProcessID)
		lines, _ := fp.output(t, bg.ProcessID, 0, false)
		data, _, _, _ := collect(t, lines)
		counterLines(t, string(data), "n=")
		deleteQuietly(g, fid)
		// Paused again, by a freeze (the command still runs), for the
		// next round.
		if code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/pause", nil, &a); code != http.StatusOK {
			t.Fatalf("pause: %d %+v", code, a)
		}
	}
}
