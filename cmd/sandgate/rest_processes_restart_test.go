package main

import (
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/gwtest"
)

// restartKeeping stops g with sig (SIGKILL: a crash), waits pause (what
// the processes do while no gateway runs), and starts a new gateway on
// the same data dir that keeps sandboxes when it stops too.
func restartKeeping(t *testing.T, g *gatewayProc, sig syscall.Signal, pause time.Duration) *gatewayProc {
	t.Helper()
	return restartDriver(t, g, sig, pause, "linux")
}

// restartDriver is restartKeeping with the given driver.
func restartDriver(t *testing.T, g *gatewayProc, sig syscall.Signal, pause time.Duration, driver string) *gatewayProc {
	t.Helper()
	_ = g.cmd.Process.Signal(sig)
	<-g.done
	time.Sleep(pause)
	g2 := &gatewayProc{DataDir: g.DataDir, Token: g.Token, stdout: &gwtest.Buffer{}, stderr: &gwtest.Buffer{}, done: make(chan struct{})}
	g2.start(t, []string{"serve", "--listen", "127.0.0.1:0", "--data-dir", g.DataDir, "--sandbox", driver,
		"--api-key", g.Token, "--keep-sandboxes-on-exit=true"})
	return g2
}

// counterLines checks that text is "<prefix>0\n<prefix>1\n..." with no
// number missing or repeated, and returns how many lines it has.
func counterLines(t *testing.T, text, prefix string) int {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
	for i, l := range lines {
		if l != prefix+strconv.Itoa(i) {
			t.Fatalf("line %d of the output is %q, want %q (lost or repeated output)", i, l, prefix+strconv.Itoa(i))
		}
	}
	return len(lines)
}

// TestRESTProcessesSurviveRestart follows background processes across a
// SIGTERM restart, then a kill -9 one: a running process keeps its id
// and pid and goes on running, its output goes on at the offset it had
// (nothing lost, nothing twice), one that ends while no gateway runs
// shows its exit and its last output, and input and signals reach them
// after the restart.
func TestRESTProcessesSurviveRestart(t *testing.T) {
	requireLinuxDriver(t)
	g := startGateway(t, "--sandbox", "linux", "--keep-sandboxes-on-exit=true")
	s := g.createSession(t)
	base := "/v1/sessions/" + s.SessionID + "/processes"
	pc := procClient{g: g, base: base}
	counter := pc.start(t, map[string]any{"name": "counter",
		"command": `i=0; while :; do echo "n=$i"; echo "e=$i" >&2; i=$((i+1)); sleep 0.02; done`})
	reader := pc.start(t, map[string]any{"command": `read x; echo "got $x"; exit 7`})
	var lastBytes int64
	grows := func(pc procClient, what string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
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
	grows(pc, "before the restarts")

	for _, step := range []struct {
		sig   syscall.Signal
		pause time.Duration
	}{{syscall.SIGTERM, 500 * time.Millisecond}, {syscall.SIGKILL, time.Second}} {
		var ender restProcess
		if step.sig == syscall.SIGKILL {
			// Ends while no gateway runs: its exit and output wait.
			ender = pc.start(t, map[string]any{"command": "sleep 0.3; echo bye; exit 5"})
		}
		g = restartKeeping(t, g, step.sig, step.pause)
		pc = procClient{g: g, base: base}
		grows(pc, "after "+step.sig.String())
		if ender.ProcessID != "" {
			p := pc.waitEnd(t, ender.ProcessID)
			if p.Status != "exited" || p.ExitCode == nil || *p.ExitCode != 5 {
				t.Errorf("a process that ended while no gateway ran: %+v, want exited 5", p)
			}
			lines, _ := pc.output(t, ender.ProcessID, 0, false)
			if data, _, _, _ := collect(t, lines); string(data) != "bye\n" {
				t.Errorf("its output is %q, want bye", data)
			}
		}
	}

	// Input reaches a process the gateway took back, and so does EOF.
	if code := g.api(t, http.MethodPost, base+"/"+reader.ProcessID+"/stdin", map[string]any{"data": "hello\n", "eof": true}, nil); code != http.StatusNoContent {
		t.Fatalf("stdin after the restarts: %d", code)
	}
	if p := pc.waitEnd(t, reader.ProcessID); p.ExitCode == nil || *p.ExitCode != 7 {
		t.Errorf("the reader after the restarts: %+v, want exited 7", p)
	}
	// A signal ends the counter; its whole output, from offset 0, is the
	// count with nothing lost or repeated across both restarts.
	if code := g.api(t, http.MethodPost, base+"/"+counter.ProcessID+"/signal", map[string]any{"signal": "TERM"}, nil); code != http.StatusNoContent {
		t.Fatalf("signal after the restarts: %d", code)
	}
	if p := pc.waitEnd(t, counter.ProcessID); p.Status != "killed" || p.ExitSignal != "TERM" {
		t.Errorf("the counter after TERM: %+v", p)
	}
	lines, _ := pc.output(t, counter.ProcessID, 0, false)
	var stdout, stderr strings.Builder
	next := int64(0)
	for l := range lines {
		if l.Offset != nil {
			if *l.Offset != next {
				t.Fatalf("output line at offset %d, want %d", *l.Offset, next)
			}
			stdout.WriteString(l.Stdout)
			stderr.WriteString(l.Stderr)
			next += int64(len(l.Stdout) + len(l.Stderr))
		}
	}
	n := counterLines(t, stdout.String(), "n=")
	counterLines(t, stderr.String(), "e=")
	t.Logf("the counter wrote %d lines (%d bytes) across a SIGTERM and a SIGKILL restart", n, next)
	if code := g.api(t, http.MethodDelete, "/v1/sessions/"+s.SessionID, nil, nil); code != http.StatusNoContent {
		t.Fatalf("delete: %d", code)
	}
}

// TestRESTProcessOutputTenantBound: the output that one tenant's
// background processes keep on the host is bounded over all its sessions
// (--max-process-output-per-tenant; a running process counts the 16 MiB
// it may keep): a start past it is 429 process_output_limit, another
// tenant is not affected, and a process that ended frees what it does
// not keep.
func TestRESTProcessOutputTenantBound(t *testing.T) {
	g := startGateway(t, "--api-key", "a:tok-a", "--api-key", "b:tok-b", "--max-process-output-per-tenant", "40MiB")
	as := func(tok string) *gatewayProc { c := *g; c.Token = tok; return &c }
	a, b := as("tok-a"), as("tok-b")
	s1, s2, sb := a.createSession(t), a.createSession(t), b.createSession(t)
	p1 := procClient{g: a, base: "/v1/sessions/" + s1.SessionID + "/processes"}
	p2 := procClient{g: a, base: "/v1/sessions/" + s2.SessionID + "/processes"}
	pb := procClient{g: b, base: "/v1/sessions/" + sb.SessionID + "/processes"}
	first := p1.start(t, map[string]any{"command": "sleep 600"})
	p2.start(t, map[string]any{"command": "sleep 600"})
	var e struct {
		Error struct{ Code string } `json:"error"`
	}
	if code := a.api(t, http.MethodPost, p1.base, map[string]any{"command": "sleep 600"}, &e); code != http.StatusTooManyRequests || e.Error.Code != "process_output_limit" {
		t.Fatalf("a third 16 MiB process of the tenant, over two sessions: %d %q, want 429 process_output_limit", code, e.Error.Code)
	}
	pb.start(t, map[string]any{"command": "sleep 600"}) // another tenant's budget
	if code := a.api(t, http.MethodPost, p1.base+"/"+first.ProcessID+"/signal", map[string]any{"signal": "KILL"}, nil); code != http.StatusNoContent {
		t.Fatalf("signal: %d", code)
	}
	p1.waitEnd(t, first.ProcessID)
	p1.start(t, map[string]any{"command": "sleep 600"}) // the ended one keeps no output
	for _, s := range []struct {
		g  *gatewayProc
		id string
	}{{a, s1.SessionID}, {a, s2.SessionID}, {b, sb.SessionID}} {
		s.g.api(t, http.MethodDelete, "/v1/sessions/"+s.id, nil, nil)
	}
}

// shellAnswer is a shell command's answer, as far as these tests look.
type shellAnswer struct {
	ExitCode  *int   `json:"exitCode"`
	Stdout    string `json:"stdout"`
	Cwd       string `json:"cwd"`
	StateLost bool   `json:"stateLost"`
}

// TestRESTStateAcrossRestart: what a persistent shell and a Python kernel
// hold across gateway restarts is kept, or said to be lost. On the linux
// driver the sandbox keeps the shell's bash and the kernel's interpreter,
// and the next gateway takes them back: plain variables, jobs, the
// directory, the kernel's variables, across a SIGTERM and a kill -9
// restart, with stateLost false. On workdir they end with the gateway:
// the shell comes back from its saved state (directory, exported
// variables) and the first answers of both say stateLost.
func TestRESTStateAcrossRestart(t *testing.T) {
	for _, driver := range []string{"linux", "workdir"} {
		t.Run(driver, func(t *testing.T) {
			if driver == "linux" {
				requireLinuxDriver(t)
			}
			g := startGateway(t, "--sandbox", driver, "--keep-sandboxes-on-exit=true")
			s := g.createSession(t)
			shell := func(g *gatewayProc, cmd string) shellAnswer {
				t.Helper()
				var a shellAnswer
				if code := g.api(t, http.MethodPost, "/v1/sessions/"+s.SessionID+"/commands",
					map[string]any{"shell": "main", "command": cmd}, &a); code != http.StatusOK {
					t.Fatalf("shell %q: %d", cmd, code)
				}
				return a
			}
			shell(g, "mkdir -p sub; cd sub; PLAIN=p1; export EXP=e1; sleep 600 & true")
			if a := runPython(t, g, s.SessionID, map[string]any{"code": "x = 41"}); a.Error != nil {
				t.Fatalf("python: %+v", a.Error)
			}
			// A shell and a kernel that the next gateway is asked to end
			// before it used them.
			if code := g.api(t, http.MethodPost, "/v1/sessions/"+s.SessionID+"/commands",
				map[string]any{"shell": "other", "command": "true"}, nil); code != http.StatusOK {
				t.Fatalf("shell other: %d", code)
			}
			runPython(t, g, s.SessionID, map[string]any{"code": "1", "kernel": "k2"})
			kept := driver == "linux"
			sigs := []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL}
			if !kept {
				sigs = sigs[1:] // workdir's processes end with the gateway either way
			}
			for _, sig := range sigs {
				g = restartDriver(t, g, sig, 200*time.Millisecond, driver)
				a := shell(g, `echo "$PLAIN/$EXP/$(jobs | wc -l)"`)
				py := runPython(t, g, s.SessionID, map[string]any{"code": "'x' in dir()"})
				if kept {
					if a.Stdout != "p1/e1/1\n" || !strings.HasSuffix(a.Cwd, "/sub") || a.StateLost {
						t.Errorf("after %s the shell answers %+v, want its plain and exported variables, its job and directory kept", sig, a)
					}
					if py.result() != "True" || py.StateLost || py.Restarted {
						t.Errorf("after %s the kernel answers %s (stateLost %v), want its variable kept", sig, py.result(), py.StateLost)
					}
					continue
				}
				if a.Stdout != "/e1/0\n" || !strings.HasSuffix(a.Cwd, "/sub") || !a.StateLost {
					t.Errorf("after %s the shell answers %+v, want its saved state (directory, exported variable) and stateLost", sig, a)
				}
				if py.result() != "False" || !py.StateLost || !py.Restarted {
					t.Errorf("after %s the kernel answers %s (restarted %v stateLost %v), want a new one that says so", sig, py.result(), py.Restarted, py.StateLost)
				}
				if a := shell(g, "true"); a.StateLost {
					t.Error("a second command says stateLost too")
				}
				if py := runPython(t, g, s.SessionID, map[string]any{"code": "1"}); py.StateLost {
					t.Error("a second cell says stateLost too")
				}
			}
			if code := g.api(t, http.MethodDelete, "/v1/sessions/"+s.SessionID+"/shells/other", nil, nil); code != http.StatusNoContent {
				t.Errorf("delete of a shell of the gateway before: %d", code)
			}
			var reset struct{ Existed bool }
			if code := g.api(t, http.MethodPost, "/v1/sessions/"+s.SessionID+"/python/reset", map[string]any{"kernel": "k2"}, &reset); code != http.StatusOK || !reset.Existed {
				t.Errorf("reset of a kernel of the gateway before: %d existed %v", code, reset.Existed)
			}
			if code := g.api(t, http.MethodDelete, "/v1/sessions/"+s.SessionID, nil, nil); code != http.StatusNoContent {
				t.Fatalf("delete: %d", code)
			}
		})
	}
}
