package gateway_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/workdir"
)

// slowTeardownDriver hands out real workdir sandboxes whose Destroy waits for
// open to be closed, as a slow teardown (many mounts, a loop device) does.
type slowTeardownDriver struct {
	inner *workdir.Driver
	open  chan struct{}
}

func (d slowTeardownDriver) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	sb, err := d.inner.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	return slowTeardownSandbox{sb, d.open}, nil
}

type slowTeardownSandbox struct {
	sandbox.Sandbox
	open chan struct{}
}

func (s slowTeardownSandbox) Destroy(ctx context.Context) error {
	<-s.open
	return s.Sandbox.Destroy(ctx)
}

// With a teardown queue, Delete answers once the session is unreachable,
// before its sandbox is released; a Delete past the queue's bound
// releases its own before it answers; the tombstone says deleted; and
// Shutdown waits for the releases under way.
func TestAsyncTeardown(t *testing.T) {
	wd, err := workdir.New(workdir.Config{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	open := make(chan struct{})
	m := gateway.NewManager(gateway.Config{TeardownQueue: 1}, slowTeardownDriver{wd, open}, discardLog())
	p := gateway.Principal{Tenant: "a"}
	s1, _ := mustCreate(t, m, p, gateway.CreateParams{})
	s2, _ := mustCreate(t, m, p, gateway.CreateParams{})
	ctx := context.Background()
	if err := m.Delete(ctx, p, s1.ID); err != nil { // answers with its Destroy still blocked
		t.Fatal(err)
	}
	if !exists(s1.Sandbox().Workdir()) {
		t.Fatal("the sandbox was released before Delete answered, with its Destroy blocked")
	}
	_, err = m.Get(ctx, p, s1.ID)
	wantCode(t, err, gateway.KindGone, "session_gone")
	if ge, ok := errors.AsType[*gateway.GoneError](err); !ok || ge.Tombstone.Reason != gateway.GoneDeleted {
		t.Errorf("tombstone of a deleted session: %v", err)
	}
	if _, total := m.List(ctx, p, 10, 0); total != 1 {
		t.Fatalf("listed %d sessions, want 1", total)
	}
	// The queue (1) is full: this Delete waits for its own release.
	done := make(chan error, 1)
	go func() { done <- m.Delete(ctx, p, s2.ID) }()
	select {
	case err := <-done:
		t.Fatalf("Delete past the queue's bound answered (%v) before its sandbox was released", err)
	case <-time.After(50 * time.Millisecond):
	}
	shut := make(chan struct{})
	go func() { defer close(shut); m.Shutdown(ctx, false) }()
	select {
	case <-shut:
		t.Fatal("Shutdown did not wait for the release under way")
	case <-time.After(50 * time.Millisecond):
	}
	close(open)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	<-shut
	for _, s := range []*gateway.Session{s1, s2} {
		if exists(s.Sandbox().Workdir()) {
			t.Errorf("sandbox of %s left after Shutdown", s.ID)
		}
	}
}

// gateStore is a real MemStore whose Delete of one record waits until the
// test lets it go, as a slow disk or a cluster store without quorum does.
type gateStore struct {
	*gateway.MemStore
	id      string
	entered chan struct{}
	release chan struct{}
}

func (s *gateStore) Delete(id string) error {
	if id == s.id {
		close(s.entered)
		<-s.release
	}
	return s.MemStore.Delete(id)
}

// A Delete that has taken its session out of the manager when Shutdown
// begins (so Shutdown neither ends it nor waits for it) releases its
// sandbox before it answers: a release left to the background then would
// be cut short by the process's exit.
func TestTeardownRacingShutdown(t *testing.T) {
	wd, err := workdir.New(workdir.Config{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	open := make(chan struct{})
	st := &gateStore{MemStore: gateway.NewMemStore(), entered: make(chan struct{}), release: make(chan struct{})}
	m := gateway.NewManager(gateway.Config{TeardownQueue: 4, Store: st}, slowTeardownDriver{wd, open}, discardLog())
	p := gateway.Principal{Tenant: "a"}
	s, _ := mustCreate(t, m, p, gateway.CreateParams{})
	st.id = s.ID
	ctx := context.Background()
	deleted := make(chan error, 1)
	go func() { deleted <- m.Delete(ctx, p, s.ID) }()
	<-st.entered
	m.Shutdown(ctx, false) // s is no longer the manager's: nothing to wait for
	close(st.release)
	select {
	case err := <-deleted:
		t.Fatalf("Delete answered (%v) after Shutdown with its sandbox's release still to come", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(open)
	if err := <-deleted; err != nil {
		t.Fatal(err)
	}
	if exists(s.Sandbox().Workdir()) {
		t.Error("sandbox left after the Delete answered")
	}
}
