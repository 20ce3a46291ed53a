package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sandbox/workdir"
)

// wantGone checks that err is the session_gone of a tombstone with reason,
// and that its message tells it and the words in want.
func wantGone(t *testing.T, err error, reason string, want ...string) {
	t.Helper()
	if !errors.Is(err, gateway.ErrGone) {
		t.Fatalf("error %v is not ErrGone", err)
	}
	if !errors.Is(err, gateway.ErrNotFound) {
		t.Errorf("a gone session should also be ErrNotFound to callers that do not tell them apart")
	}
	wantCode(t, err, gateway.KindGone, "session_gone")
	var g *gateway.GoneError
	if !errors.As(err, &g) || g.Tombstone.Reason != reason {
		t.Fatalf("tombstone %+v, want reason %q", g, reason)
	}
	ge, _ := gateway.AsError(err)
	for _, w := range append(want, "(reason: "+reason+")") {
		if !strings.Contains(ge.Message, w) {
			t.Errorf("message %q lacks %q", ge.Message, w)
		}
	}
}

func wantNotFound(t *testing.T, err error) {
	t.Helper()
	if errors.Is(err, gateway.ErrGone) {
		t.Fatalf("error %v is gone, want a plain not_found", err)
	}
	wantCode(t, err, gateway.KindNotFound, "not_found")
}

func TestTombstoneDelete(t *testing.T) {
	clock := newClock()
	m, _ := newManager(t, gateway.Config{Now: clock.Now, IdleTimeout: -1})
	ctx := context.Background()
	s, _ := mustCreate(t, m, alice, gateway.CreateParams{})
	if err := m.Delete(ctx, alice, s.ID); err != nil {
		t.Fatal(err)
	}
	_, err := m.Get(ctx, alice, s.ID)
	wantGone(t, err, gateway.GoneDeleted, "deleted at 2030-01-02T03:04:05Z", `by tenant "alice" (api_key)`, s.ID)
	// Every route that looks the session up says so: update and delete too.
	ttl := 600
	_, err = m.Update(ctx, alice, s.ID, gateway.UpdateParams{TTL: &ttl})
	wantGone(t, err, gateway.GoneDeleted)
	wantGone(t, m.Delete(ctx, alice, s.ID), gateway.GoneDeleted)

	// Another tenant sees nothing: a missing id, exactly.
	_, err = m.Get(ctx, bob, s.ID)
	wantNotFound(t, err)
	wantNotFound(t, m.Delete(ctx, bob, s.ID))
	_, errUnknown := m.Get(ctx, bob, "sb_doesnotexist")
	wantNotFound(t, errUnknown)
	if err.Error() != errUnknown.Error() {
		t.Errorf("another tenant's tombstone %q differs from a missing id %q", err, errUnknown)
	}
	// An id that never existed stays not_found.
	_, err = m.Get(ctx, alice, "sb_doesnotexist")
	wantNotFound(t, err)
}

func TestTombstoneExpiry(t *testing.T) {
	clock := newClock()
	m, _ := newManager(t, gateway.Config{Now: clock.Now, IdleTimeout: 10 * time.Minute})
	ctx := context.Background()
	short, _ := mustCreate(t, m, alice, gateway.CreateParams{TTL: 60})
	idle, _ := mustCreate(t, m, alice, gateway.CreateParams{TTL: 3600})
	clock.Advance(time.Minute)
	idle.Touch(clock.Now())
	m.Reap(ctx)
	_, err := m.Get(ctx, alice, short.ID)
	wantGone(t, err, gateway.GoneTTL, "expired at 2030-01-02T03:05:05Z", "ttl")
	if _, err := m.Get(ctx, alice, idle.ID); err != nil {
		t.Fatalf("the active session went: %v", err)
	}
	clock.Advance(10 * time.Minute)
	m.Reap(ctx)
	_, err = m.Get(ctx, alice, idle.ID)
	wantGone(t, err, gateway.GoneIdle, "expired at 2030-01-02T03:15:05Z", "idle")
	_, err = m.Get(ctx, bob, idle.ID)
	wantNotFound(t, err)
}

func TestTombstoneFailedSession(t *testing.T) {
	clock := newClock()
	store := gateway.NewMemStore()
	ctx := context.Background()
	// Two sessions whose sandboxes are lost across a restart: they fail,
	// and stay until they expire or are deleted.
	for _, id := range []string{"sb_lostone", "sb_losttwo"} {
		r := gateway.Record{ID: id, Tenant: alice.Tenant}
		r.Status, r.CreatedAt, r.ExpiresAt, r.LastActivityAt, r.TTL = gateway.StatusRunning, clock.Now(), clock.Now().Add(time.Minute), clock.Now(), 60
		if err := store.Put(r); err != nil {
			t.Fatal(err)
		}
	}
	m, _ := newManager(t, gateway.Config{Now: clock.Now, IdleTimeout: -1, Store: store})
	if err := m.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	s, err := m.Get(ctx, alice, "sb_lostone")
	if err != nil || s.Snapshot().Status != gateway.StatusFailed {
		t.Fatalf("restored session: %v", err)
	}
	why := s.Snapshot().StatusReason
	if err := m.Delete(ctx, alice, "sb_losttwo"); err != nil {
		t.Fatal(err)
	}
	_, err = m.Get(ctx, alice, "sb_losttwo")
	wantGone(t, err, gateway.GoneDeleted, `by tenant "alice"`, "it had failed: "+why)
	clock.Advance(time.Minute)
	m.Reap(ctx)
	_, err = m.Get(ctx, alice, "sb_lostone")
	wantGone(t, err, gateway.GoneFailed, "ended at", "it had failed: "+why)
	_, err = m.Get(ctx, bob, "sb_lostone")
	wantNotFound(t, err)
}

func TestTombstonePrunedAfterTTL(t *testing.T) {
	clock := newClock()
	store := gateway.NewMemStore()
	m, _ := newManager(t, gateway.Config{Now: clock.Now, IdleTimeout: -1, Store: store, TombstoneTTL: time.Hour})
	ctx := context.Background()
	s1, _ := mustCreate(t, m, alice, gateway.CreateParams{})
	s2, _ := mustCreate(t, m, alice, gateway.CreateParams{})
	if err := m.Delete(ctx, alice, s1.ID); err != nil {
		t.Fatal(err)
	}
	clock.Advance(30 * time.Minute)
	if err := m.Delete(ctx, alice, s2.ID); err != nil {
		t.Fatal(err)
	}
	clock.Advance(30*time.Minute - time.Nanosecond)
	m.PruneTombstones()
	_, err := m.Get(ctx, alice, s1.ID)
	wantGone(t, err, gateway.GoneDeleted)
	clock.Advance(time.Nanosecond) // s1's tombstone is exactly ttl old
	_, err = m.Get(ctx, alice, s1.ID)
	wantNotFound(t, err)
	m.PruneTombstones()
	ts, _ := store.Tombstones()
	if len(ts) != 1 || ts[0].ID != s2.ID {
		t.Errorf("stored tombstones after the prune: %+v, want only %s", ts, s2.ID)
	}
	_, err = m.Get(ctx, alice, s2.ID)
	wantGone(t, err, gateway.GoneDeleted)
	clock.Advance(30 * time.Minute)
	m.PruneTombstones()
	if ts, _ := store.Tombstones(); len(ts) != 0 {
		t.Errorf("stored tombstones after all expired: %+v", ts)
	}
}

func TestTombstonesBounded(t *testing.T) {
	clock := newClock()
	store := gateway.NewMemStore()
	m, _ := newManager(t, gateway.Config{Now: clock.Now, IdleTimeout: -1, Store: store, MaxTombstones: 3})
	ctx := context.Background()
	var ids []string
	for range 5 {
		s, _ := mustCreate(t, m, alice, gateway.CreateParams{})
		if err := m.Delete(ctx, alice, s.ID); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, s.ID)
		clock.Advance(time.Second)
	}
	for i, id := range ids {
		_, err := m.Get(ctx, alice, id)
		if i < 2 {
			wantNotFound(t, err) // the oldest were dropped
		} else {
			wantGone(t, err, gateway.GoneDeleted)
		}
	}
	if ts, _ := store.Tombstones(); len(ts) != 3 {
		t.Errorf("store keeps %d tombstones, want 3", len(ts))
	}
}

func TestTombstonesDisabled(t *testing.T) {
	m, _ := newManager(t, gateway.Config{IdleTimeout: -1, TombstoneTTL: -1})
	ctx := context.Background()
	s, _ := mustCreate(t, m, alice, gateway.CreateParams{})
	if err := m.Delete(ctx, alice, s.ID); err != nil {
		t.Fatal(err)
	}
	_, err := m.Get(ctx, alice, s.ID)
	wantNotFound(t, err)
}

// TestTombstoneSurvivesRestart: tombstones are in the bolt store, so a
// restarted gateway still answers session_gone, and still prunes them.
func TestTombstoneSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	clock := newClock()
	open := func() (*gateway.Manager, *gateway.BoltStore) {
		store, err := gateway.OpenBoltStore(filepath.Join(dir, "sessions.db"))
		if err != nil {
			t.Fatal(err)
		}
		wd, err := workdir.New(workdir.Config{Root: filepath.Join(dir, "sessions")})
		if err != nil {
			t.Fatal(err)
		}
		return gateway.NewManager(gateway.Config{Store: store, Now: clock.Now, IdleTimeout: -1}, wd, discardLog()), store
	}
	ctx := context.Background()
	m1, store1 := open()
	gone, _ := mustCreate(t, m1, alice, gateway.CreateParams{TTL: 600})
	expired, _ := mustCreate(t, m1, alice, gateway.CreateParams{TTL: 60})
	if err := m1.Delete(ctx, alice, gone.ID); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Minute)
	m1.Reap(ctx)
	m1.Shutdown(ctx, true)
	store1.Close()

	m2, store2 := open()
	t.Cleanup(func() {
		m2.Shutdown(ctx, false)
		store2.Close()
	})
	if err := m2.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	_, err := m2.Get(ctx, alice, gone.ID)
	wantGone(t, err, gateway.GoneDeleted, `by tenant "alice" (api_key)`, "deleted at 2030-01-02T03:04:05Z")
	_, err = m2.Get(ctx, alice, expired.ID)
	wantGone(t, err, gateway.GoneTTL, "expired at 2030-01-02T03:05:05Z")
	_, err = m2.Get(ctx, bob, gone.ID)
	wantNotFound(t, err)

	clock.Advance(gateway.DefaultTombstoneTTL)
	m2.PruneTombstones()
	if ts, err := store2.Tombstones(); err != nil || len(ts) != 0 {
		t.Errorf("stored tombstones after the ttl: %v %v", ts, err)
	}
	_, err = m2.Get(ctx, alice, gone.ID)
	wantNotFound(t, err)
}

// TestGoneErrorMessage: each reason reads as it should.
func TestGoneErrorMessage(t *testing.T) {
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, c := range []struct {
		t    gateway.Tombstone
		want string
	}{
		{gateway.Tombstone{ID: "sb_1", Reason: gateway.GoneDeleted, At: at, ByTenant: "acme", ByMethod: "jwt"},
			`session sb_1 is gone (reason: deleted): deleted at 2030-01-02T03:04:05Z by tenant "acme" (jwt)`},
		{gateway.Tombstone{ID: "sb_1", Reason: gateway.GoneTTL, At: at}, "session sb_1 is gone (reason: ttl_expired): expired at 2030-01-02T03:04:05Z: its ttl ran out"},
		{gateway.Tombstone{ID: "sb_1", Reason: gateway.GoneIdle, At: at}, "session sb_1 is gone (reason: idle_expired): expired at 2030-01-02T03:04:05Z: idle for longer than the idle timeout"},
		{gateway.Tombstone{ID: "sb_1", Reason: gateway.GoneFailed, At: at, Failure: "oom"}, "session sb_1 is gone (reason: failed): ended at 2030-01-02T03:04:05Z; it had failed: oom"},
	} {
		if got := fmt.Sprint(&gateway.GoneError{Tombstone: c.t}); got != c.want {
			t.Errorf("message\n got %s\nwant %s", got, c.want)
		}
	}
}
