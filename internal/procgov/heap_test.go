package procgov

import (
	"context"
	"runtime"
	"runtime/debug"
	"sync"
	"testing"
	"time"
)

func TestHeapPercentFor(t *testing.T) {
	h := NewHeap(HeapConfig{})
	for _, c := range []struct {
		live uint64
		want int
	}{
		{0, 400},
		{4 << 20, 400},
		{16 << 20, 400},
		{32 << 20, 200},
		{40 << 20, 160},
		{64 << 20, 100},
		{1 << 30, 100},
	} {
		if got := h.PercentFor(c.live); got != c.want {
			t.Errorf("PercentFor(%d MiB) = %d, want %d", c.live>>20, got, c.want)
		}
	}
}

// TestHeapGovernorFollowsCollections runs the governor on this process's
// own collector: a live heap past Slack lowers GOGC at the next
// collection, freeing it raises GOGC back, and stopping puts back the
// GOGC it found.
func TestHeapGovernorFollowsCollections(t *testing.T) {
	orig := debug.SetGCPercent(150)
	defer debug.SetGCPercent(orig)

	var mu sync.Mutex
	var set []int
	h := NewHeap(HeapConfig{Slack: 8 << 20, Set: func(p int) int {
		mu.Lock()
		set = append(set, p)
		mu.Unlock()
		return debug.SetGCPercent(p)
	}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); h.Run(ctx) }()
	last := func() int {
		mu.Lock()
		defer mu.Unlock()
		if len(set) == 0 {
			return 0
		}
		return set[len(set)-1]
	}
	waitFor := func(want int, what string) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			runtime.GC()
			if last() == want {
				return
			}
		}
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("%s: GOGC set to %v, want the last %d", what, set, want)
	}
	waitFor(400, "at start")
	held := make([][]byte, 64)
	for i := range held {
		held[i] = make([]byte, 1<<20)
		held[i][0] = 1
	}
	waitFor(100, "with 64 MiB live")
	runtime.KeepAlive(held)
	held = nil
	waitFor(400, "once it is freed")
	cancel()
	<-done
	if got := debug.SetGCPercent(150); got != 150 {
		t.Errorf("after Run, GOGC is %d, want the 150 it found", got)
	}
}
