package gateway

import (
	"context"
	"testing"
	"time"
)

// TestTakeForkSlot: with every slot held by forks under way, one more is
// refused at once; with one held only for an answered fork's images'
// removal, one more waits for that removal and gets the slot; a caller
// that goes away stops waiting.
func TestTakeForkSlot(t *testing.T) {
	ctx := context.Background()
	m := &Manager{}
	m.forking.Store(MaxConcurrentForks)
	start := time.Now()
	if m.takeForkSlot(ctx) {
		t.Fatal("a slot with every one held by forks under way")
	}
	if d := time.Since(start); d >= forkRemovalWait {
		t.Errorf("the refusal waited %v", d)
	}

	m.forkRemoving = 1 // one of them answered, its images being removed
	go func() {
		time.Sleep(50 * time.Millisecond)
		m.forkRemoved()
	}()
	if !m.takeForkSlot(ctx) {
		t.Fatal("no slot once the answered fork's images were removed")
	}
	if n := m.forking.Load(); n != MaxConcurrentForks {
		t.Errorf("%d forks counted, want %d", n, MaxConcurrentForks)
	}

	m.forkMu.Lock()
	m.forkRemoving = 1
	m.forkMu.Unlock()
	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(50*time.Millisecond, cancel)
	if m.takeForkSlot(cctx) {
		t.Error("a slot for a caller gone, the removal still under way")
	}
	if n := m.forking.Load(); n != MaxConcurrentForks {
		t.Errorf("%d forks counted after a caller gave up, want %d", n, MaxConcurrentForks)
	}
}
