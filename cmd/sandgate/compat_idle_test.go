package main

import (
	"net/http"
	"testing"
)

// Issue 35 item 7: a compat call did not count as activity, so the idle
// timeout ended a session under a long /compat/sbs step or
// /compat/agent-sandbox execute. Each call now holds its session while it
// runs, as /v1's do.
func TestCompatCallsHoldTheSession(t *testing.T) {
	g := startGateway(t, "--idle-timeout", "2s", "--step-timeout", "2m")
	t.Run("sbs step", func(t *testing.T) {
		var created struct {
			SessionID string `json:"session_id"`
		}
		if code := g.api(t, http.MethodPost, "/compat/sbs/sessions", map[string]any{}, &created); code != http.StatusOK {
			t.Fatalf("sbs create: %d", code)
		}
		var o struct {
			Output, Error string
			ExitCode      int `json:"exit_code"`
		}
		code := g.api(t, http.MethodPost, "/compat/sbs/sessions/"+created.SessionID+"/step",
			map[string]any{"sandbox_id": created.SessionID, "type": "bash", "payload": map[string]string{"cmd": "sleep 6; echo done"}}, &o)
		if code != http.StatusOK || o.ExitCode != 0 || o.Output != "done\n" {
			t.Errorf("step past the idle timeout: %d %+v", code, o)
		}
	})
	t.Run("agent-sandbox execute", func(t *testing.T) {
		var o struct {
			Output string `json:"output"`
		}
		if code := g.api(t, http.MethodPost, "/compat/agent-sandbox/v1/execute",
			map[string]any{"user_id": "idle", "session_id": "t", "code": "x = 7"}, &o); code != http.StatusOK {
			t.Fatalf("execute: %d", code)
		}
		code := g.api(t, http.MethodPost, "/compat/agent-sandbox/v1/execute",
			map[string]any{"user_id": "idle", "session_id": "t", "code": "import time\ntime.sleep(6)\nprint(x)"}, &o)
		if code != http.StatusOK || o.Output != "7\n" {
			t.Errorf("execute past the idle timeout: %d %q", code, o.Output)
		}
	})
}
