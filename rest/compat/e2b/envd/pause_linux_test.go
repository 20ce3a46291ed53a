//go:build linux

package envd_test

import (
	"errors"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sandgate/sandgate/internal/gwtest"
	"github.com/sandgate/sandgate/rest"
	"github.com/sandgate/sandgate/rest/compat/e2b/envd"
	"github.com/sandgate/sandgate/rest/compat/e2b/envd/gen/process"
)

// TestProcessStreamEndsAtPause: a Start stream open when its session is
// paused ends, with session_paused (as /v1's follow does), rather than
// staying open, quiet, for as long as the session is paused; after the
// resume a Connect follows the process, which ran on, again.
func TestProcessStreamEndsAtPause(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("the linux driver needs root in CI")
		}
		t.Skip("the linux driver needs root")
	}
	st := gwtest.Start(t, gwtest.Options{
		Driver: "linux",
		Tokens: map[string]string{aliceKey: "alice"},
		Mounts: func(e gwtest.Engines) []rest.Mount {
			srv := envd.New(envd.Deps{Sessions: e.Sessions, Plane: e.Plane, Log: e.Log, Sealer: testSealer})
			return []rest.Mount{{Prefix: prefix, Handler: http.StripPrefix(prefix, sandboxRouter(e.Sessions, srv))}}
		},
	})
	g := &testGateway{st: st}
	sb := g.newSandbox(t, aliceKey)
	c := ctx(t)
	s, err := sb.proc.Start(c, connect.NewRequest(&process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "echo up; exec sleep 600"}}}))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !s.Receive() || s.Msg().GetEvent().GetStart() == nil {
		t.Fatalf("no start event: %v", s.Err())
	}
	pid := s.Msg().GetEvent().GetStart().GetPid()
	for !strings.Contains(string(s.Msg().GetEvent().GetData().GetStdout()), "up") {
		if !s.Receive() {
			t.Fatalf("no output: %v", s.Err())
		}
	}
	ended := make(chan error, 1)
	go func() {
		for s.Receive() {
		}
		ended <- s.Err()
	}()
	if code := gwtest.DoJSON(t, st.URL, aliceKey, http.MethodPost, "/v1/sessions/"+sb.id+"/pause", nil, nil); code != http.StatusOK {
		t.Fatalf("pause: %d", code)
	}
	select {
	case err := <-ended:
		wantCode(t, err, connect.CodeFailedPrecondition)
		var ce *connect.Error
		if !errors.As(err, &ce) || ce.Meta().Get("Sandgate-Code") != "session_paused" {
			t.Fatalf("the stream ended with %v, want session_paused", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the stream stayed open 30 s after the pause")
	}
	if code := gwtest.DoJSON(t, st.URL, aliceKey, http.MethodPost, "/v1/sessions/"+sb.id+"/resume", nil, nil); code != http.StatusOK {
		t.Fatalf("resume: %d", code)
	}
	sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}
	cs, err := sb.proc.Connect(c, connect.NewRequest(&process.ConnectRequest{Process: sel}))
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if !cs.Receive() || cs.Msg().GetEvent().GetStart().GetPid() != pid {
		t.Fatalf("connect after the resume: %v", cs.Err())
	}
	if _, err := sb.proc.SendSignal(c, connect.NewRequest(&process.SendSignalRequest{Process: sel, Signal: process.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
	for cs.Receive() {
		if cs.Msg().GetEvent().GetEnd() != nil {
			return
		}
	}
	t.Fatalf("no end after the kill: %v", cs.Err())
}
