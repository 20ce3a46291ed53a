package gateway_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/workdir"
)

// countingDriver wraps a real driver: its sandboxes count their resumes.
type countingDriver struct {
	*workdir.Driver
	resumes *atomic.Int32
}

func (d countingDriver) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	sb, err := d.Driver.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	return countingSandbox{sb, sb.(sandbox.Stopper), d.resumes}, nil
}

type countingSandbox struct {
	sandbox.Sandbox
	st      sandbox.Stopper
	resumes *atomic.Int32
}

func (s countingSandbox) Stop(ctx context.Context) error { return s.st.Stop(ctx) }
func (s countingSandbox) Stopped() bool                  { return s.st.Stopped() }
func (s countingSandbox) Resume(ctx context.Context) error {
	s.resumes.Add(1)
	time.Sleep(20 * time.Millisecond) // long enough for the other callers to queue
	return s.st.Resume(ctx)
}

// run runs command in s's sandbox and returns its stdout.
func run(t testing.TB, s *gateway.Session, command string) string {
	t.Helper()
	p, err := s.Sandbox().Start(context.Background(), sandbox.Cmd{Command: command})
	if err != nil {
		t.Fatalf("start %q: %v", command, err)
	}
	p.Stdin().Close()
	var out bytes.Buffer
	go func() { _, _ = io.Copy(io.Discard, p.Stderr()) }()
	_, _ = io.Copy(&out, p.Stdout())
	if _, err := p.Wait(); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

// stored is session id's status in store.
func stored(t testing.TB, store gateway.Store, id string) string {
	t.Helper()
	recs, err := store.All()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if r.ID == id {
			return r.Status
		}
	}
	return ""
}

func TestStopAndResume(t *testing.T) {
	store := gateway.NewMemStore()
	m, root := newManager(t, gateway.Config{Store: store})
	s, _ := mustCreate(t, m, alice, gateway.CreateParams{})
	run(t, s, "echo kept > f")
	p, err := s.Sandbox().Start(context.Background(), sandbox.Cmd{Command: "exec sleep 1000"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan sandbox.Exit, 1) // waited for, as sshd and the data plane do
	go func() { e, _ := p.Wait(); done <- e }()
	closed := make(chan struct{})
	if _, ok := s.AddConn(func() { close(closed) }); !ok {
		t.Fatal("AddConn refused")
	}

	for _, tt := range []struct {
		name string
		p    gateway.Principal
		id   string
		kind gateway.Kind
		code string
	}{
		{"another tenant", bob, s.ID, gateway.KindNotFound, "not_found"},
		{"no such session", alice, "sbx-aaaaaaaaaaaaaaaaaaaa", gateway.KindNotFound, "not_found"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := m.Stop(context.Background(), tt.p, tt.id)
			wantCode(t, err, tt.kind, tt.code)
		})
	}

	got, err := m.Stop(context.Background(), alice, s.ID)
	if err != nil || got != s {
		t.Fatalf("Stop = %v, %v", got, err)
	}
	if st := s.Snapshot().Status; st != gateway.StatusStopped {
		t.Fatalf("status %q after Stop", st)
	}
	if st := stored(t, store, s.ID); st != gateway.StatusStopped {
		t.Errorf("stored status %q after Stop", st)
	}
	if !s.Live() {
		t.Error("a stopped session is not live: it would refuse connections")
	}
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Error("Stop did not close the session's connections")
	}
	select {
	case e := <-done:
		if e.Signal != "KILL" {
			t.Errorf("process ended %+v, want KILL", e)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Stop left a process running")
	}
	if !exists(filepath.Join(root, s.ID, "f")) {
		t.Fatal("Stop removed the files")
	}
	if _, err := m.Stop(context.Background(), alice, s.ID); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	// Processes that must not resume it do not.
	if _, err := s.Start(context.Background(), sandbox.Cmd{Command: "true"}, gateway.StartOptions{}); !errors.Is(err, sandbox.ErrStopped) {
		t.Errorf("start without Resume: %v, want ErrStopped", err)
	}

	// The next process resumes it.
	if out := run(t, s, "cat f"); out != "kept\n" {
		t.Errorf("after resume: %q", out)
	}
	if st := s.Snapshot().Status; st != gateway.StatusRunning {
		t.Errorf("status %q after resume", st)
	}
	if st := stored(t, store, s.ID); st != gateway.StatusRunning {
		t.Errorf("stored status %q after resume", st)
	}

	// Delete of a stopped session removes its files.
	if _, err := m.Stop(context.Background(), alice, s.ID); err != nil {
		t.Fatal(err)
	}
	if err := m.Delete(context.Background(), alice, s.ID); err != nil {
		t.Fatal(err)
	}
	if exists(filepath.Join(root, s.ID)) {
		t.Error("Delete of a stopped session left its workdir")
	}
}

// Many first calls to a stopped session resume it once.
func TestStopConcurrentResume(t *testing.T) {
	root := t.TempDir()
	d, err := workdir.New(workdir.Config{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	var resumes atomic.Int32
	m := gateway.NewManager(gateway.Config{}, countingDriver{d, &resumes}, discardLog())
	t.Cleanup(func() { m.Shutdown(context.Background(), false) })
	s, _ := mustCreate(t, m, alice, gateway.CreateParams{})
	if _, err := m.Stop(context.Background(), alice, s.ID); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	outs := make([]string, 16)
	for i := range outs {
		wg.Go(func() { outs[i] = run(t, s, "echo up") })
	}
	wg.Wait()
	for i, out := range outs {
		if out != "up\n" {
			t.Errorf("call %d: %q", i, out)
		}
	}
	if n := resumes.Load(); n != 1 {
		t.Errorf("%d resumes, want 1", n)
	}
}

// A stopped session stays stopped across a gateway restart, and resumes.
func TestStopSurvivesRestart(t *testing.T) {
	store := gateway.NewMemStore()
	root := t.TempDir()
	d, err := workdir.New(workdir.Config{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	m := gateway.NewManager(gateway.Config{Store: store}, d, discardLog())
	s, _ := mustCreate(t, m, alice, gateway.CreateParams{})
	run(t, s, "echo kept > f")
	if _, err := m.Stop(context.Background(), alice, s.ID); err != nil {
		t.Fatal(err)
	}
	m.Shutdown(context.Background(), true)

	m2 := gateway.NewManager(gateway.Config{Store: store}, d, discardLog())
	t.Cleanup(func() { m2.Shutdown(context.Background(), false) })
	if err := m2.Restore(context.Background()); err != nil {
		t.Fatal(err)
	}
	s2, err := m2.Get(context.Background(), alice, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if st := s2.Snapshot().Status; st != gateway.StatusStopped {
		t.Fatalf("restored status %q, want stopped", st)
	}
	if out := run(t, s2, "cat f"); out != "kept\n" {
		t.Errorf("after restart and resume: %q", out)
	}
	if st := s2.Snapshot().Status; st != gateway.StatusRunning {
		t.Errorf("status %q after resume", st)
	}
}

// A failed session cannot be stopped; a stopped one still expires.
func TestStopFailedAndExpiry(t *testing.T) {
	store := gateway.NewMemStore()
	root := t.TempDir()
	d, err := workdir.New(workdir.Config{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	m := gateway.NewManager(gateway.Config{Store: store}, d, discardLog())
	lost, _ := mustCreate(t, m, alice, gateway.CreateParams{})
	m.Shutdown(context.Background(), true)
	if err := os.RemoveAll(filepath.Join(root, lost.ID)); err != nil {
		t.Fatal(err)
	}

	clock := newClock()
	m2 := gateway.NewManager(gateway.Config{Store: store, Now: clock.Now, IdleTimeout: -1}, d, discardLog())
	t.Cleanup(func() { m2.Shutdown(context.Background(), false) })
	if err := m2.Restore(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, err = m2.Stop(context.Background(), alice, lost.ID)
	wantCode(t, err, gateway.KindConflict, "session_not_running")

	s, _ := mustCreate(t, m2, alice, gateway.CreateParams{TTL: 60})
	if _, err := m2.Stop(context.Background(), alice, s.ID); err != nil {
		t.Fatal(err)
	}
	clock.Advance(61 * time.Second)
	m2.Reap(context.Background())
	if _, err := m2.Get(context.Background(), alice, s.ID); !errors.Is(err, gateway.ErrNotFound) {
		t.Errorf("stopped session past its TTL: %v", err)
	}
	if exists(filepath.Join(root, s.ID)) {
		t.Error("the reaper left a stopped session's workdir")
	}
}
