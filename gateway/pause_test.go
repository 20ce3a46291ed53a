package gateway_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/sandbox/workdir"
)

// pausingDriver wraps a real driver: its sandboxes can be paused (a flag:
// workdir cannot freeze), and onPause, when set, runs inside each Pause,
// while the gateway holds the session for it.
type pausingDriver struct {
	*workdir.Driver
	onPause func()
	last    *pausingSandbox // the last one made
}

func (d *pausingDriver) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	sb, err := d.Driver.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	d.last = &pausingSandbox{Sandbox: sb, d: d}
	return d.last, nil
}

type pausingSandbox struct {
	sandbox.Sandbox
	d        *pausingDriver
	paused   atomic.Bool
	unpauses atomic.Int32
}

func (s *pausingSandbox) Pause(context.Context) (sandbox.PauseReport, error) {
	if s.d.onPause != nil {
		s.d.onPause()
	}
	s.paused.Store(true)
	return sandbox.PauseReport{Method: "flag", ResidentBytes: -1}, nil
}

func (s *pausingSandbox) Unpause(context.Context) error {
	if s.paused.Swap(false) {
		s.unpauses.Add(1)
	}
	return nil
}

func (s *pausingSandbox) Paused() bool { return s.paused.Load() }

func newPausingManager(t *testing.T, cfg gateway.Config) (*gateway.Manager, *pausingDriver) {
	t.Helper()
	wd, err := workdir.New(workdir.Config{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	d := &pausingDriver{Driver: wd}
	m := gateway.NewManager(cfg, d, discardLog())
	t.Cleanup(func() { m.Shutdown(context.Background(), false) })
	return m, d
}

// A call that comes while a pause is under way (its sandbox being frozen,
// the status still running) waits for it, then resumes the session: it
// never goes on into a frozen sandbox with the session left paused.
func TestWakeDuringPause(t *testing.T) {
	m, d := newPausingManager(t, gateway.Config{})
	s, _ := mustCreate(t, m, alice, gateway.CreateParams{})
	var wg sync.WaitGroup
	var wakeErr error
	d.onPause = func() {
		wg.Go(func() { wakeErr = s.Wake(context.Background()) })
		time.Sleep(100 * time.Millisecond) // the call comes mid-pause (in either order the end must be the same)
	}
	if _, err := m.Pause(context.Background(), alice, s.ID); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if wakeErr != nil {
		t.Fatal(wakeErr)
	}
	sb := d.last
	if st := s.Status(); st != gateway.StatusRunning || sb.Paused() {
		t.Errorf("after a call woke it during its pause: status %q, sandbox paused %v; want running", st, sb.Paused())
	}
}

// The idle reaper does not pause a session that a call took hold of
// after the reaper chose it.
func TestIdlePauseSkipsSessionHeldSince(t *testing.T) {
	base := time.Now()
	var calls atomic.Int32 // looks at the clock since the reap began (-1: not begun)
	calls.Store(-1)
	var s *gateway.Session
	var release func()
	now := func() time.Time {
		// The reaper's first look at the clock chooses the idle session;
		// its second is its re-check, once it holds the session: a call
		// takes hold of it just before.
		if calls.Load() >= 0 && calls.Add(1) == 2 {
			release = s.Hold()
		}
		if calls.Load() < 0 {
			return base
		}
		return base.Add(2 * time.Minute)
	}
	m, _ := newPausingManager(t, gateway.Config{IdleTimeout: time.Minute, IdleAction: gateway.IdlePause, Now: now})
	s, _ = mustCreate(t, m, alice, gateway.CreateParams{})
	s.Touch(base)
	calls.Store(0)
	m.Reap(context.Background())
	if release == nil {
		t.Fatal("the reaper never looked at the clock again: the test no longer injects its call")
	}
	defer release()
	if st := s.Status(); st != gateway.StatusRunning {
		t.Errorf("status %q: the reaper paused a session held since it chose it", st)
	}
}

// A pause ends the calls in flight (AddPausedCall) with ErrPaused as the
// cause; a delete does not say "paused" to them.
func TestPausedCallEndsOnPauseOnly(t *testing.T) {
	m, _ := newPausingManager(t, gateway.Config{})
	s, _ := mustCreate(t, m, alice, gateway.CreateParams{})
	ctx, remove, ok := s.AddPausedCall(context.Background())
	if !ok {
		t.Fatal("AddPausedCall on a running session")
	}
	defer remove()
	if _, err := m.Pause(context.Background(), alice, s.ID); err != nil {
		t.Fatal(err)
	}
	if !gateway.PausedCause(ctx) {
		t.Errorf("after the pause: cause %v, want ErrPaused", context.Cause(ctx))
	}

	s2, _ := mustCreate(t, m, alice, gateway.CreateParams{})
	ctx2, remove2, ok := s2.AddPausedCall(context.Background())
	if !ok {
		t.Fatal("AddPausedCall on a running session")
	}
	defer remove2()
	if err := m.Delete(context.Background(), alice, s2.ID); err != nil {
		t.Fatal(err)
	}
	if gateway.PausedCause(ctx2) {
		t.Error("a delete ended the call as paused")
	}
}
