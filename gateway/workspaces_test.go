package gateway_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/workspace"
)

// failingDriver fails every create.
type failingDriver struct{}

func (failingDriver) Create(context.Context, sandbox.Spec) (sandbox.Sandbox, error) {
	return nil, errors.New("no sandbox today")
}

// TestWorkspaceKeptHoweverTheSessionEnds: the Manager hands a named
// workspace's files to the workspace engine whether the session is
// deleted, expires (ttl or idle) or the gateway ends it at shutdown, and
// a failed create releases the workspace.
func TestWorkspaceKeptHoweverTheSessionEnds(t *testing.T) {
	ctx := context.Background()
	ws, err := workspace.New(workspace.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	clock := newClock()
	m, _ := newManager(t, gateway.Config{Workspaces: ws, Now: clock.Now, IdleTimeout: time.Hour})
	alice := gateway.Principal{Tenant: "alice"}
	if _, err := ws.CreateWorkspace(ctx, "alice", "w"); err != nil {
		t.Fatal(err)
	}
	ref := gateway.CreateParams{Workspace: gateway.WorkspaceRef{Name: "w"}}
	step := 0
	next := func(end func(s *gateway.Session)) {
		t.Helper()
		s, _ := mustCreate(t, m, alice, ref)
		dir := s.Sandbox().Workdir()
		for i := range step {
			if _, err := os.Stat(filepath.Join(dir, "step", string(rune('0'+i)))); err != nil {
				t.Errorf("step %d: the file of step %d is missing: %v", step, i, err)
			}
		}
		if _, _, err := m.Create(ctx, alice, ref); err == nil {
			t.Fatal("a second live session got the workspace")
		} else {
			wantCode(t, err, gateway.KindConflict, "workspace_busy")
		}
		if err := os.MkdirAll(filepath.Join(dir, "step"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "step", string(rune('0'+step))), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		end(s)
		step++
	}
	next(func(s *gateway.Session) {
		if err := m.Delete(ctx, alice, s.ID); err != nil {
			t.Fatal(err)
		}
	})
	next(func(*gateway.Session) { clock.Advance(time.Duration(gateway.MaxTTL) * time.Second); m.Reap(ctx) })
	next(func(*gateway.Session) { clock.Advance(2 * time.Hour); m.Reap(ctx) })
	next(func(*gateway.Session) {})

	// A create that fails lets go of the workspace.
	bad := gateway.NewManager(gateway.Config{Workspaces: ws}, failingDriver{}, discardLog())
	m.Shutdown(ctx, false) // ends the last session: its files are kept
	if _, _, err := bad.Create(ctx, alice, ref); err == nil {
		t.Fatal("create on a failing driver succeeded")
	}
	m2, _ := newManager(t, gateway.Config{Workspaces: ws})
	s, _ := mustCreate(t, m2, alice, ref)
	if entries, err := os.ReadDir(filepath.Join(s.Sandbox().Workdir(), "step")); err != nil || len(entries) != 4 {
		t.Errorf("after shutdown: %d files (%v), want 4", len(entries), err)
	}
	// Another tenant has no such workspace.
	_, _, err = m2.Create(ctx, gateway.Principal{Tenant: "bob"}, ref)
	wantCode(t, err, gateway.KindNotFound, "workspace_not_found")
}

// TestIdempotencyKeyCountsTheWorkspace: an Idempotency-Key used again
// with another workspace or snapshot is idempotency_key_reused, and with
// the same one replays.
func TestIdempotencyKeyCountsTheWorkspace(t *testing.T) {
	ctx := context.Background()
	ws, err := workspace.New(workspace.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := newManager(t, gateway.Config{Workspaces: ws})
	alice := gateway.Principal{Tenant: "alice"}
	for _, name := range []string{"w", "v"} {
		if _, err := ws.CreateWorkspace(ctx, "alice", name); err != nil {
			t.Fatal(err)
		}
	}
	cp := gateway.CreateParams{IdempotencyKey: "k1", Workspace: gateway.WorkspaceRef{Name: "w"}}
	s, _ := mustCreate(t, m, alice, cp)
	again, _, err := m.Create(ctx, alice, cp)
	if err != nil || again.ID != s.ID {
		t.Fatalf("replay with the same workspace: %v", err)
	}
	for _, ref := range []gateway.WorkspaceRef{{Name: "v"}, {}, {FromSnapshot: "snap_000000000000000000000000"}} {
		other := cp
		other.Workspace = ref
		_, _, err := m.Create(ctx, alice, other)
		wantCode(t, err, gateway.KindUnprocessable, "idempotency_key_reused")
	}
	// A key first used without a workspace is reused by one with it.
	plain := gateway.CreateParams{IdempotencyKey: "k2"}
	mustCreate(t, m, alice, plain)
	plain.Workspace = gateway.WorkspaceRef{Name: "v"}
	_, _, err = m.Create(ctx, alice, plain)
	wantCode(t, err, gateway.KindUnprocessable, "idempotency_key_reused")
}
