package rest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/rest"
	"github.com/sandgate/sandgate/sandbox"
)

// brokenStopDriver makes sandboxes whose Stop fails.
type brokenStopDriver struct{ gateway.Driver }

func (d brokenStopDriver) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	sb, err := d.Driver.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	return brokenStopSandbox{sb}, nil
}

type brokenStopSandbox struct{ sandbox.Sandbox }

func (brokenStopSandbox) Stop(context.Context) error   { return errors.New("the init would not die") }
func (brokenStopSandbox) Resume(context.Context) error { return nil }
func (brokenStopSandbox) Stopped() bool                { return false }

// onlySessions hides every optional method of the manager (Stop).
type onlySessions struct{ rest.Sessions }

func TestContractStop(t *testing.T) {
	cov := newCoverage()
	g := newGateway(t, gwOptions{cov: cov})
	s := g.create(t, aliceKey, "")
	stopPath := "/v1/sessions/" + s.SessionID + "/stop"
	command := func(t *testing.T, g *testGateway, id, cmd string) cmdOut {
		t.Helper()
		body, _ := json.Marshal(map[string]string{"command": cmd})
		r := g.do(t, http.MethodPost, "/v1/sessions/"+id+"/commands", aliceKey, body)
		expect(t, r, http.StatusOK, "")
		var out cmdOut
		if err := json.Unmarshal(r.body, &out); err != nil {
			t.Fatal(err)
		}
		return out
	}

	t.Run("stop-then-resume", func(t *testing.T) {
		// A sleep no other test (or process on the host: the workdir
		// driver shares the host's pid namespace) runs, by its length.
		sleep := fmt.Sprintf("sleep %d", 100000+os.Getpid()%100000)
		if out := command(t, g, s.SessionID, "echo kept > f; "+sleep+" >/dev/null 2>&1 &"); out.ExitCode == nil || *out.ExitCode != 0 {
			t.Fatalf("setup: %+v", out)
		}
		r := g.do(t, http.MethodPost, stopPath, aliceKey, nil)
		expect(t, r, http.StatusOK, "")
		if got := r.session(t); got.Status != gateway.StatusStopped || got.SessionID != s.SessionID {
			t.Fatalf("stop answered %+v", got)
		}
		if got := g.do(t, http.MethodGet, "/v1/sessions/"+s.SessionID, aliceKey, nil).session(t); got.Status != gateway.StatusStopped {
			t.Errorf("GET after stop: status %q", got.Status)
		}
		if l := g.list(t, aliceKey); l.Total != 1 || l.Sessions[0].Status != gateway.StatusStopped {
			t.Errorf("list after stop: %+v", l)
		}
		// The files stay on the host.
		if b, err := os.ReadFile(filepath.Join(g.root, s.SessionID, "f")); err != nil || string(b) != "kept\n" {
			t.Errorf("file after stop: %q %v", b, err)
		}
		// Stopping a stopped session is a no-op.
		r = g.do(t, http.MethodPost, stopPath, aliceKey, nil)
		expect(t, r, http.StatusOK, "")
		if got := r.session(t); got.Status != gateway.StatusStopped {
			t.Errorf("second stop: status %q", got.Status)
		}
		// The next command starts it again; the sleep did not survive.
		out := command(t, g, s.SessionID, "cat f; pgrep -f '^"+sleep+"$' | wc -l")
		if out.Stdout == nil || *out.Stdout != "kept\n0\n" {
			t.Errorf("after resume: %+v", out)
		}
		if got := g.do(t, http.MethodGet, "/v1/sessions/"+s.SessionID, aliceKey, nil).session(t); got.Status != gateway.StatusRunning {
			t.Errorf("GET after resume: status %q", got.Status)
		}
		// Background processes: a stop ends them, and the ids after the
		// resume go on, so an old id never names a new process.
		procs := "/v1/sessions/" + s.SessionID + "/processes"
		var p struct {
			ProcessID string `json:"processId"`
		}
		for _, want := range []string{"p1", "p2"} {
			r = g.do(t, http.MethodPost, procs, aliceKey, []byte(`{"command": "sleep 60"}`))
			expect(t, r, http.StatusCreated, "")
			if err := json.Unmarshal(r.body, &p); err != nil || p.ProcessID != want {
				t.Fatalf("process id %q (%v), want %s", p.ProcessID, err, want)
			}
			if want == "p1" {
				expect(t, g.do(t, http.MethodPost, stopPath, aliceKey, nil), http.StatusOK, "")
			}
		}
		expect(t, g.do(t, http.MethodPost, procs+"/p2/signal", aliceKey, []byte(`{"signal": "KILL"}`)), http.StatusNoContent, "")

		// A stopped session accepts CONNECT (the tunnel resumes it with
		// its first process) and can be deleted.
		expect(t, g.do(t, http.MethodPost, stopPath, aliceKey, nil), http.StatusOK, "")
		r, conn, _ := g.rawConnect(t, "/v1/sessions/"+s.SessionID, "Proxy-Authorization", "Bearer "+aliceKey)
		expect(t, r, http.StatusOK, "")
		if conn != nil {
			conn.Close()
		}
	})

	t.Run("errors", func(t *testing.T) {
		other := g.create(t, aliceKey, "")
		path := "/v1/sessions/" + other.SessionID + "/stop"
		expect(t, g.do(t, http.MethodPost, path, "", nil), http.StatusUnauthorized, "unauthorized")
		expect(t, g.do(t, http.MethodPost, path, bobKey, nil), http.StatusNotFound, "not_found")
		expect(t, g.do(t, http.MethodPost, "/v1/sessions/sbx-aaaaaaaaaaaaaaaaaaaa/stop", aliceKey, nil), http.StatusNotFound, "not_found")
		expect(t, g.do(t, http.MethodGet, path, aliceKey, nil), http.StatusMethodNotAllowed, "method_not_allowed")
		expect(t, g.do(t, http.MethodPost, path, aliceKey, nil), http.StatusOK, "")
		expect(t, g.do(t, http.MethodDelete, "/v1/sessions/"+other.SessionID, aliceKey, nil), http.StatusNoContent, "")
		expect(t, g.do(t, http.MethodPost, path, aliceKey, nil), http.StatusGone, "session_gone")
		if _, err := os.Stat(filepath.Join(g.root, other.SessionID)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("delete of a stopped session left its workdir: %v", err)
		}
	})

	t.Run("failed-session", func(t *testing.T) {
		store := gateway.NewMemStore()
		lost := putLostSession(t, store, "alice")
		fg := newGateway(t, gwOptions{store: store, restore: true, cov: cov})
		expect(t, fg.do(t, http.MethodPost, "/v1/sessions/"+lost+"/stop", aliceKey, nil), http.StatusConflict, "session_not_running")
	})

	t.Run("unsupported", func(t *testing.T) {
		ug := newGateway(t, gwOptions{cov: cov, wrap: func(s rest.Sessions) rest.Sessions { return onlySessions{s} }})
		id := ug.create(t, aliceKey, "").SessionID
		expect(t, ug.do(t, http.MethodPost, "/v1/sessions/"+id+"/stop", aliceKey, nil), http.StatusBadRequest, "stop_unsupported")
	})

	t.Run("sandbox-failure", func(t *testing.T) {
		bg := newGateway(t, gwOptions{cov: cov, wrapDriver: func(d gateway.Driver) gateway.Driver { return brokenStopDriver{d} }})
		id := bg.create(t, aliceKey, "").SessionID
		expect(t, bg.do(t, http.MethodPost, "/v1/sessions/"+id+"/stop", aliceKey, nil), http.StatusInternalServerError, "sandbox_failed")
	})

	t.Run("store-failure", func(t *testing.T) {
		store := &switchStore{MemStore: gateway.NewMemStore()}
		sg := newGateway(t, gwOptions{store: store, cov: cov})
		id := sg.create(t, aliceKey, "").SessionID
		store.fail.Store(true)
		defer store.fail.Store(false)
		expect(t, sg.do(t, http.MethodPost, "/v1/sessions/"+id+"/stop", aliceKey, nil), http.StatusServiceUnavailable, "store_failed")
	})

	t.Run("rate-limited", func(t *testing.T) {
		rl := newGateway(t, gwOptions{rateLimit: 2, cov: cov})
		id := rl.create(t, aliceKey, "").SessionID
		var r result
		for range 3 {
			if r = rl.do(t, http.MethodPost, "/v1/sessions/"+id+"/stop", aliceKey, nil); r.status == http.StatusTooManyRequests {
				break
			}
		}
		expect(t, r, http.StatusTooManyRequests, "rate_limited")
	})

	requireSeen(t, cov, func(p string) bool { return strings.Contains(p, "/stop") }, nil)
}
