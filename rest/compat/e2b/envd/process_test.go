package envd_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sandgate/sandgate/internal/gwtest"
	"github.com/sandgate/sandgate/rest/compat/e2b/e2bmeta"
	"github.com/sandgate/sandgate/rest/compat/e2b/envd"
	"github.com/sandgate/sandgate/rest/compat/e2b/envd/gen/process"
)

// bash is a StartRequest as the SDK's commands.run sends it.
func bash(cmd string, stdin bool) *process.StartRequest {
	return &process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", cmd}},
		Stdin:   &stdin,
	}
}

// run collects a Start or Connect stream: the pid of its start event,
// stdout, stderr and pty output, and its end event.
type run struct {
	pid                 uint32
	stdout, stderr, pty strings.Builder
	end                 *process.ProcessEvent_EndEvent
}

// add takes one event; it reports whether the stream ended.
func (r *run) add(t *testing.T, ev *process.ProcessEvent) bool {
	t.Helper()
	switch e := ev.GetEvent().(type) {
	case *process.ProcessEvent_Start:
		if r.pid != 0 {
			t.Fatalf("a second start event: %v", e)
		}
		r.pid = e.Start.GetPid()
	case *process.ProcessEvent_Data:
		switch o := e.Data.GetOutput().(type) {
		case *process.ProcessEvent_DataEvent_Stdout:
			r.stdout.Write(o.Stdout)
		case *process.ProcessEvent_DataEvent_Stderr:
			r.stderr.Write(o.Stderr)
		case *process.ProcessEvent_DataEvent_Pty:
			r.pty.Write(o.Pty)
		}
	case *process.ProcessEvent_End:
		r.end = e.End
		return true
	}
	return false
}

// startStream starts req and returns its stream once the start event came.
func (sb *sandbox) start(t *testing.T, c context.Context, req *process.StartRequest) (*connect.ServerStreamForClient[process.StartResponse], *run) {
	t.Helper()
	st, err := sb.proc.Start(c, connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	r := &run{}
	if !st.Receive() {
		t.Fatalf("no start event: %v", st.Err())
	}
	if r.add(t, st.Msg().GetEvent()); r.pid == 0 {
		t.Fatalf("first event %v is not a start with a pid", st.Msg())
	}
	return st, r
}

// wait reads a stream to its end event.
func wait[T interface{ GetEvent() *process.ProcessEvent }](t *testing.T, st interface {
	Receive() bool
	Msg() T
	Err() error
}, r *run) {
	t.Helper()
	for st.Receive() {
		if r.add(t, st.Msg().GetEvent()) {
			return
		}
	}
	t.Fatalf("stream ended without an end event: %v (stdout %q, pty %q)", st.Err(), r.stdout.String(), r.pty.String())
}

func TestStartStreamsOutputAndEnd(t *testing.T) {
	g := newGateway(t, envd.WatchBounds{})
	sb := g.newSandbox(t, aliceKey)
	c := ctx(t)

	req := bash(`echo "hi $GREETING"; echo oops >&2; exit 3`, false)
	req.Process.Envs = map[string]string{"GREETING": "there"}
	st, r := sb.start(t, c, req)
	wait(t, st, r)
	if got := r.stdout.String(); got != "hi there\n" {
		t.Errorf("stdout %q", got)
	}
	if got := r.stderr.String(); got != "oops\n" {
		t.Errorf("stderr %q", got)
	}
	if r.end.GetExitCode() != 3 || !r.end.GetExited() || r.end.GetStatus() != "exit status 3" || r.end.GetError() != "exit status 3" {
		t.Errorf("end %v", r.end)
	}

	// A success has no error.
	st, r = sb.start(t, c, bash("true", false))
	wait(t, st, r)
	if r.end.GetExitCode() != 0 || r.end.Error != nil {
		t.Errorf("end %v", r.end)
	}

	// /v1 sees the commands as background processes, in the history too.
	var procs struct {
		Processes []struct {
			Command string `json:"command"`
			Status  string `json:"status"`
		} `json:"processes"`
	}
	if code := gwtest.DoJSON(t, g.st.URL, aliceKey, http.MethodGet, "/v1/sessions/"+sb.id+"/processes", nil, &procs); code != http.StatusOK {
		t.Fatalf("list processes: %d", code)
	}
	if len(procs.Processes) != 2 || !strings.Contains(procs.Processes[0].Command, "exit 3") || procs.Processes[0].Status != "exited" {
		t.Errorf("/v1 processes: %+v", procs.Processes)
	}
}

func TestStartRefusesBadConfigs(t *testing.T) {
	g := newGateway(t, envd.WatchBounds{})
	sb := g.newSandbox(t, aliceKey)
	c := ctx(t)
	long := strings.Repeat("x", 5000)
	tooMany := map[string]string{}
	for i := range 65 {
		tooMany["V"+strings.Repeat("a", i)] = "1"
	}
	for name, req := range map[string]*process.StartRequest{
		"no cmd":        {Process: &process.ProcessConfig{}},
		"no process":    {},
		"nul":           {Process: &process.ProcessConfig{Cmd: "/bin/echo", Args: []string{"a\x00b"}}},
		"env name":      {Process: &process.ProcessConfig{Cmd: "/bin/true", Envs: map[string]string{"A=B": "x"}}},
		"env too long":  {Process: &process.ProcessConfig{Cmd: "/bin/true", Envs: map[string]string{"A": long}}},
		"too many envs": {Process: &process.ProcessConfig{Cmd: "/bin/true", Envs: tooMany}},
		"tag":           {Process: &process.ProcessConfig{Cmd: "/bin/true"}, Tag: &long},
	} {
		t.Run(name, func(t *testing.T) {
			st, err := sb.proc.Start(c, connect.NewRequest(req))
			if err == nil {
				st.Receive()
				err = st.Err()
				_ = st.Close()
			}
			wantCode(t, err, connect.CodeInvalidArgument)
		})
	}
}

func TestBackgroundConnectListSignal(t *testing.T) {
	g := newGateway(t, envd.WatchBounds{})
	sb := g.newSandbox(t, aliceKey)
	c := ctx(t)

	// A background command: the SDK reads the start event and may go away.
	tag := "server"
	req := bash("echo ready; sleep 60", false)
	req.Tag = &tag
	sctx, cancel := context.WithCancel(c)
	st, r := sb.start(t, sctx, req)
	if !st.Receive() || r.add(t, st.Msg().GetEvent()) || r.stdout.String() != "ready\n" {
		t.Fatalf("first output: %q, %v", r.stdout.String(), st.Err())
	}
	cancel()
	_ = st.Close()

	// It runs on after its client left.
	list, err := sb.proc.List(c, connect.NewRequest(&process.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(list.Msg.GetProcesses()); n != 1 {
		t.Fatalf("%d processes listed, want 1", n)
	}
	p := list.Msg.GetProcesses()[0]
	if p.GetPid() != r.pid || p.GetTag() != "server" || p.GetConfig().GetCmd() != "/bin/bash" || p.GetConfig().GetArgs()[2] != "echo ready; sleep 60" {
		t.Errorf("listed %v", p)
	}

	// Connect by tag, then by pid: each gets the start event, then what
	// comes from now on.
	conn, err := sb.proc.Connect(c, connect.NewRequest(&process.ConnectRequest{
		Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Tag{Tag: "server"}}}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cr := &run{}
	if !conn.Receive() || cr.add(t, conn.Msg().GetEvent()) || cr.pid != r.pid {
		t.Fatalf("connect: start event %v, %v", conn.Msg(), conn.Err())
	}
	byPid := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: r.pid}}
	if _, err := sb.proc.SendSignal(c, connect.NewRequest(&process.SendSignalRequest{Process: byPid, Signal: process.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
	wait(t, conn, cr)
	if cr.end.GetExited() || cr.end.GetExitCode() != -1 || cr.end.GetStatus() != "signal: killed" {
		t.Errorf("end %v", cr.end)
	}
	if cr.stdout.Len() != 0 {
		t.Errorf("connect replayed output %q", cr.stdout.String())
	}

	// Ended, it is no longer listed, and signals to it are not_found (the
	// SDK's kill then answers False).
	list, err = sb.proc.List(c, connect.NewRequest(&process.ListRequest{}))
	if err != nil || len(list.Msg.GetProcesses()) != 0 {
		t.Fatalf("list after kill: %v %v", list, err)
	}
	_, err = sb.proc.SendSignal(c, connect.NewRequest(&process.SendSignalRequest{Process: byPid, Signal: process.Signal_SIGNAL_SIGTERM}))
	wantCode(t, err, connect.CodeNotFound)
	_, err = sb.proc.SendSignal(c, connect.NewRequest(&process.SendSignalRequest{Process: byPid}))
	wantCode(t, err, connect.CodeInvalidArgument)
	_, err = sb.proc.SendInput(c, connect.NewRequest(&process.SendInputRequest{Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: 999999}}}))
	wantCode(t, err, connect.CodeNotFound)
	st2, err := sb.proc.Connect(c, connect.NewRequest(&process.ConnectRequest{Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Tag{Tag: "nope"}}}))
	if err == nil {
		st2.Receive()
		err = st2.Err()
		_ = st2.Close()
	}
	wantCode(t, err, connect.CodeNotFound)
}

func TestInputStreamsAndCloseStdin(t *testing.T) {
	g := newGateway(t, envd.WatchBounds{})
	sb := g.newSandbox(t, aliceKey)
	c := ctx(t)

	st, r := sb.start(t, c, bash("cat; echo done", true))
	sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: r.pid}}
	readUntil := func(want string) {
		t.Helper()
		for !strings.Contains(r.stdout.String(), want) {
			if !st.Receive() || r.add(t, st.Msg().GetEvent()) {
				t.Fatalf("stream ended before %q: %q %v", want, r.stdout.String(), st.Err())
			}
		}
	}
	if _, err := sb.proc.SendInput(c, connect.NewRequest(&process.SendInputRequest{Process: sel,
		Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("one\n")}}})); err != nil {
		t.Fatal(err)
	}
	readUntil("one\n")

	in := sb.proc.StreamInput(c)
	if err := in.Send(&process.StreamInputRequest{Event: &process.StreamInputRequest_Start{Start: &process.StreamInputRequest_StartEvent{Process: sel}}}); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"two\n", "three\n"} {
		if err := in.Send(&process.StreamInputRequest{Event: &process.StreamInputRequest_Data{Data: &process.StreamInputRequest_DataEvent{
			Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte(s)}}}}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := in.CloseAndReceive(); err != nil {
		t.Fatal(err)
	}
	readUntil("three\n")

	if _, err := sb.proc.CloseStdin(c, connect.NewRequest(&process.CloseStdinRequest{Process: sel})); err != nil {
		t.Fatal(err)
	}
	wait(t, st, r)
	if r.stdout.String() != "one\ntwo\nthree\ndone\n" || r.end.GetExitCode() != 0 {
		t.Errorf("stdout %q, end %v", r.stdout.String(), r.end)
	}

	// Without stdin the command reads EOF at once, as from /dev/null.
	st, r = sb.start(t, c, bash("cat; echo eof", false))
	wait(t, st, r)
	if r.stdout.String() != "eof\n" {
		t.Errorf("stdout %q", r.stdout.String())
	}

	// A stream that does not start with its process is refused.
	in = sb.proc.StreamInput(c)
	_ = in.Send(&process.StreamInputRequest{Event: &process.StreamInputRequest_Data{Data: &process.StreamInputRequest_DataEvent{}}})
	_, err := in.CloseAndReceive()
	wantCode(t, err, connect.CodeInvalidArgument)
}

func TestPTYStartInputResize(t *testing.T) {
	g := newGateway(t, envd.WatchBounds{})
	sb := g.newSandbox(t, aliceKey)
	c := ctx(t)

	// As the SDK's pty.create sends it.
	st, r := sb.start(t, c, &process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-i", "-l"},
			Envs: map[string]string{"TERM": "xterm-256color", "LANG": "C.UTF-8"}},
		Pty: &process.PTY{Size: &process.PTY_Size{Cols: 80, Rows: 24}},
	})
	sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: r.pid}}
	if _, err := sb.proc.Update(c, connect.NewRequest(&process.UpdateRequest{Process: sel,
		Pty: &process.PTY{Size: &process.PTY_Size{Cols: 101, Rows: 33}}})); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.proc.SendInput(c, connect.NewRequest(&process.SendInputRequest{Process: sel,
		Input: &process.ProcessInput{Input: &process.ProcessInput_Pty{Pty: []byte("stty size; tty; exit 7\n")}}})); err != nil {
		t.Fatal(err)
	}
	wait(t, st, r)
	if out := r.pty.String(); !strings.Contains(out, "33 101") || !strings.Contains(out, "/dev/pts/") {
		t.Errorf("terminal output %q: no new size or no tty", out)
	}
	if r.stdout.Len() != 0 || r.end.GetExitCode() != 7 {
		t.Errorf("stdout %q, end %v", r.stdout.String(), r.end)
	}

	// A command without a terminal cannot be resized.
	st, r = sb.start(t, c, bash("sleep 60", false))
	sel = &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: r.pid}}
	_, err := sb.proc.Update(c, connect.NewRequest(&process.UpdateRequest{Process: sel, Pty: &process.PTY{Size: &process.PTY_Size{Cols: 10, Rows: 10}}}))
	wantCode(t, err, connect.CodeInvalidArgument)
	_, _ = sb.proc.SendSignal(c, connect.NewRequest(&process.SendSignalRequest{Process: sel, Signal: process.Signal_SIGNAL_SIGKILL}))
	wait(t, st, r)
}

// The SDK's command timeout (Connect-Timeout-Ms) bounds the process, as
// envd's does; a client that only goes away does not.
func TestStartTimeoutKillsTheProcess(t *testing.T) {
	g := newGateway(t, envd.WatchBounds{})
	sb := g.newSandbox(t, aliceKey)
	c := ctx(t)

	tctx, cancel := context.WithTimeout(c, 2*time.Second)
	defer cancel()
	st, r := sb.start(t, tctx, bash("sleep 120", false))
	for st.Receive() {
		r.add(t, st.Msg().GetEvent())
	}
	wantCode(t, st.Err(), connect.CodeDeadlineExceeded)
	var info struct {
		Status     string `json:"status"`
		ExitSignal string `json:"exitSignal"`
	}
	eventually(t, "the timed-out process to be killed", func() bool {
		gwtest.DoJSON(t, g.st.URL, aliceKey, http.MethodGet, "/v1/sessions/"+sb.id+"/processes/p1", nil, &info)
		return info.Status == "killed"
	})
}

func TestKeepaliveEvents(t *testing.T) {
	g := newGateway(t, envd.WatchBounds{})
	sb := g.newSandbox(t, aliceKey)
	c := ctx(t)
	req := connect.NewRequest(bash("sleep 60", false))
	req.Header().Set("Keepalive-Ping-Interval", "1")
	st, err := sb.proc.Start(c, req)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	r := &run{}
	st.Receive()
	r.add(t, st.Msg().GetEvent())
	if !st.Receive() || st.Msg().GetEvent().GetKeepalive() == nil {
		t.Fatalf("want a keepalive event, got %v %v", st.Msg(), st.Err())
	}
	_, _ = sb.proc.SendSignal(c, connect.NewRequest(&process.SendSignalRequest{
		Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: r.pid}}, Signal: process.Signal_SIGNAL_SIGKILL}))
	wait(t, st, r)
}

// Another tenant's session is not reachable, and a session's processes
// are its own.
func TestProcessesAreTheSessions(t *testing.T) {
	g := newGateway(t, envd.WatchBounds{})
	alice := g.newSandbox(t, aliceKey)
	bob := g.newSandbox(t, bobKey)
	c := ctx(t)
	st, r := alice.start(t, c, bash("sleep 60", false))

	_, err := bob.proc.SendSignal(c, connect.NewRequest(&process.SendSignalRequest{
		Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: r.pid}}, Signal: process.Signal_SIGNAL_SIGKILL}))
	wantCode(t, err, connect.CodeNotFound)
	// Bob naming Alice's sandbox gets what a missing one gets (the test
	// router answers a plain 404, which a Go Connect client reads as
	// unimplemented and the SDKs as not_found).
	intruder := g.client(t, bobKey, alice.id)
	if _, err = intruder.proc.List(c, connect.NewRequest(&process.ListRequest{})); err == nil {
		t.Errorf("bob listed alice's processes")
	}
	status, _, body := intruder.do(t, http.MethodGet, "/health", "", nil)
	var e struct {
		Error struct{ Code string } `json:"error"`
	}
	_ = json.Unmarshal([]byte(body), &e)
	if status != http.StatusNotFound || e.Error.Code != "not_found" {
		t.Errorf("bob's health of alice's sandbox: %d %s", status, body)
	}
	_, _ = alice.proc.SendSignal(c, connect.NewRequest(&process.SendSignalRequest{
		Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: r.pid}}, Signal: process.Signal_SIGNAL_SIGKILL}))
	wait(t, st, r)

	status, _, _ = alice.do(t, http.MethodGet, "/health", "", nil)
	if status != http.StatusNoContent {
		t.Errorf("health: %d", status)
	}
}

// A sandbox's envVars (the E2B create's, kept in its metadata) reach
// every command, under the command's own envs.
func TestSandboxEnvVars(t *testing.T) {
	g := newGateway(t, envd.WatchBounds{})
	var s struct {
		SessionID string `json:"sessionId"`
	}
	md, err := testSealer.Metadata(e2bmeta.Record{EnvVars: map[string]string{"A": "from-create", "B": "from-create"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	body := map[string]any{"metadata": md}
	if code := gwtest.DoJSON(t, g.st.URL, aliceKey, http.MethodPost, "/v1/sessions", body, &s); code != http.StatusCreated {
		t.Fatalf("create: %d", code)
	}
	sb := g.client(t, aliceKey, s.SessionID)
	req := bash(`echo "$A $B"`, false)
	req.Process.Envs = map[string]string{"B": "from-command"}
	st, r := sb.start(t, ctx(t), req)
	wait(t, st, r)
	if got := r.stdout.String(); got != "from-create from-command\n" {
		t.Errorf("stdout %q", got)
	}
}

// The streaming calls open at once are bounded per session (and per
// tenant and gateway): past it a stream is refused before its process
// starts.
func TestStreamsAreBounded(t *testing.T) {
	g := newGateway(t, envd.WatchBounds{}, envd.StreamBounds{PerSession: 2})
	sb := g.newSandbox(t, aliceKey)
	other := g.newSandbox(t, aliceKey)
	c := ctx(t)
	st1, r1 := sb.start(t, c, bash("sleep 60", false))
	conn, err := sb.proc.Connect(c, connect.NewRequest(&process.ConnectRequest{
		Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: r1.pid}}}))
	if err != nil {
		t.Fatal(err)
	}
	if !conn.Receive() {
		t.Fatal(conn.Err())
	}
	refused, err := sb.proc.Start(c, connect.NewRequest(bash("echo never", false)))
	if err == nil {
		refused.Receive()
		err = refused.Err()
		_ = refused.Close()
	}
	wantCode(t, err, connect.CodeResourceExhausted)
	// The refused command did not start.
	list, err := sb.proc.List(c, connect.NewRequest(&process.ListRequest{}))
	if err != nil || len(list.Msg.GetProcesses()) != 1 {
		t.Fatalf("list: %v %v", list, err)
	}
	// Another session has its own.
	st2, r2 := other.start(t, c, bash("echo fine", false))
	wait(t, st2, r2)

	_ = conn.Close()
	eventually(t, "room for a stream", func() bool {
		st, err := sb.proc.Start(c, connect.NewRequest(bash("echo again", false)))
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		if !st.Receive() {
			return false
		}
		r := &run{}
		r.add(t, st.Msg().GetEvent())
		wait(t, st, r)
		return r.stdout.String() == "again\n"
	})
	_, _ = sb.proc.SendSignal(c, connect.NewRequest(&process.SendSignalRequest{
		Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: r1.pid}}, Signal: process.Signal_SIGNAL_SIGKILL}))
	wait(t, st1, r1)
}
