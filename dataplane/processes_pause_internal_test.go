package dataplane

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sandbox"
)

// TestReleasedProcessNotTakenBack: a call on a process let go of for a
// pause that is not taken back within releasedWait answers 503
// process_unavailable (to be tried again), not a 500; one whose session
// ends meanwhile answers that.
func TestReleasedProcessNotTakenBack(t *testing.T) {
	sp := &sessionProcs{gone: make(chan struct{})}
	pr := &Process{sp: sp, running: true, released: true, back: make(chan struct{})}
	_, err := pr.proc(context.Background()) // waits releasedWait (30 s)
	ge, ok := gateway.AsError(err)
	if !ok || ge.Kind != gateway.KindUnavailable || ge.Code != "process_unavailable" {
		t.Fatalf("a process not taken back: %v (%+v)", err, ge)
	}
	go func() { time.Sleep(100 * time.Millisecond); close(sp.gone) }()
	if _, err := pr.proc(context.Background()); !errors.Is(err, ErrSessionEnded) {
		t.Fatalf("its session ended: %v", err)
	}
}

// raceProc is a process whose calls fail as a pause's release makes them
// fail (its control connection closed under the call), calling onCall
// first: the release that races the call.
type raceProc struct {
	sandbox.Process
	onCall  func()
	signals []syscall.Signal
	sizes   []sandbox.Window
	fail    bool
}

func (r *raceProc) Signal(sig syscall.Signal) error {
	if r.onCall != nil {
		r.onCall()
	}
	if r.fail {
		return errors.New("signal process group: write unix: use of closed network connection")
	}
	r.signals = append(r.signals, sig)
	return nil
}

func (r *raceProc) Resize(w sandbox.Window) error {
	if r.onCall != nil {
		r.onCall()
	}
	if r.fail {
		return errors.New("set window size: file already closed")
	}
	r.sizes = append(r.sizes, w)
	return nil
}

// TestCallRacingReleaseWaitsForTakeBack: a signal or a resize that a
// pause's release races (the process let go of under the call, which
// then fails) waits for the process to be taken back and goes to it,
// instead of answering a 500 for a process that runs on.
func TestCallRacingReleaseWaitsForTakeBack(t *testing.T) {
	sp := &sessionProcs{gone: make(chan struct{})}
	back := &raceProc{}
	pr := &Process{sp: sp, running: true, pty: true}
	old := &raceProc{fail: true}
	old.onCall = func() {
		pr.mu.Lock()
		pr.released, pr.back = true, make(chan struct{})
		ch := pr.back
		pr.mu.Unlock()
		go func() { // taken back after the resume
			pr.mu.Lock()
			pr.p, pr.released = back, false
			pr.mu.Unlock()
			close(ch)
		}()
	}
	pr.p = old
	if err := pr.Signal(syscall.SIGTERM); err != nil {
		t.Errorf("a signal that a release raced: %v", err)
	}
	if len(back.signals) != 1 || back.signals[0] != syscall.SIGTERM {
		t.Errorf("the process taken back got signals %v", back.signals)
	}
	pr.p = old
	if err := pr.Resize(sandbox.Window{Cols: 100, Rows: 30}); err != nil {
		t.Errorf("a resize that a release raced: %v", err)
	}
	if len(back.sizes) != 1 || back.sizes[0].Cols != 100 {
		t.Errorf("the process taken back got sizes %v", back.sizes)
	}
	// A failure that no release raced is the call's.
	pr.p = &raceProc{fail: true}
	if err := pr.Signal(syscall.SIGTERM); err == nil {
		t.Error("a failed signal answered nil")
	}
}

// TestWriteStdinWaitsUnlocked: a write to the input of a process let go
// of for a pause waits for it to be taken back without holding the
// input's lock, which a next pause's release needs (TryLock) and other
// writes wait on.
func TestWriteStdinWaitsUnlocked(t *testing.T) {
	sp := &sessionProcs{gone: make(chan struct{})}
	pr := &Process{sp: sp, running: true, released: true, back: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { _, err := pr.WriteStdin(ctx, []byte("x"), false); done <- err }()
	time.Sleep(200 * time.Millisecond) // it waits in proc, for the take-back
	if !pr.stdinMu.TryLock() {
		t.Fatal("WriteStdin holds the input's lock while it waits for the take-back")
	}
	pr.stdinMu.Unlock()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("WriteStdin whose call ended: %v", err)
	}
}
