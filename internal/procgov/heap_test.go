package procgov

import (
	"context"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
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

func TestHeapLimitFor(t *testing.T) {
	for _, c := range []struct {
		live    uint64
		percent int
		slack   uint64
		nonHeap uint64
		ceiling int64
		want    int64
	}{
		// 4 MiB under GOGC 400: a 20 MiB goal, and 64 MiB of slack (more
		// than its quarter).
		{4 << 20, 400, 64 << 20, 0, noLimit, 84 << 20},
		{4 << 20, 400, 64 << 20, 3 << 20, noLimit, 87 << 20},
		{4 << 20, 400, 0, 0, noLimit, 25 << 20},
		// 512 MiB under GOGC 100: 1 GiB, and its quarter (more than the
		// slack).
		{512 << 20, 100, 64 << 20, 0, noLimit, 1280 << 20},
		// GOMEMLIMIT stays the ceiling.
		{512 << 20, 100, 64 << 20, 0, 1 << 30, 1 << 30},
	} {
		if got := LimitFor(c.live, c.percent, c.slack, c.nonHeap, c.ceiling); got != c.want {
			t.Errorf("LimitFor(%d MiB, %d, %d MiB, %d MiB, %d) = %d MiB, want %d MiB", c.live>>20, c.percent, c.slack>>20, c.nonHeap>>20, c.ceiling, got>>20, c.want>>20)
		}
	}
}

// heapGoal is the runtime's heap goal now (/gc/heap/goal:bytes): the
// lower of GOGC's and the memory limit's.
func heapGoal() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/goal:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// TestHeapGovernorBoundsAJump: what the governor sets after a cycle
// bounds the heap until it steps again, however late that is. Its view
// of the live heap is held at 8 MiB (a governor that has not heard of a
// cycle yet, armCycleSignal) while the live heap jumps to 40 MiB and a
// cycle runs: GOGC alone, still at 300 for 8 MiB, let the heap grow to
// four times 40 MiB (160 MiB) before the next one; the memory limit
// for 8 MiB (its 32 MiB goal and 24 MiB of slack) keeps the goal under
// 64 MiB.
func TestHeapGovernorBoundsAJump(t *testing.T) {
	origPercent := debug.SetGCPercent(100)
	defer debug.SetGCPercent(origPercent)
	origLimit := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(origLimit)

	h := NewHeap(HeapConfig{Slack: 24 << 20, Live: func() uint64 { return 8 << 20 }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); h.Run(ctx) }()
	defer func() { cancel(); <-done }()
	// The governor has stepped once it set GOGC 300 (24 MiB of slack
	// for 8 MiB).
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		runtime.GC()
		if p := debug.SetGCPercent(-1); p == 300 || time.Now().After(deadline) {
			debug.SetGCPercent(p)
			if p != 300 {
				t.Fatalf("GOGC %d, want 300", p)
			}
			break
		} else {
			debug.SetGCPercent(p)
		}
	}
	held := make([][]byte, 40)
	for i := range held {
		held[i] = make([]byte, 1<<20)
		held[i][0] = 1
	}
	runtime.GC()
	goal := heapGoal()
	runtime.KeepAlive(held)
	if goal > 64<<20 {
		t.Errorf("with 40 MiB live and the governor's view at 8 MiB, the heap goal is %d MiB, want at most 64 MiB (the limit for 8 MiB)", goal>>20)
	}
}

// TestHeapGovernorRestoresLimit: Run keeps a GOMEMLIMIT it finds as the
// ceiling of the limits it sets, and puts it back when it stops.
func TestHeapGovernorRestoresLimit(t *testing.T) {
	origPercent := debug.SetGCPercent(100)
	defer debug.SetGCPercent(origPercent)
	origLimit := debug.SetMemoryLimit(1 << 30)
	defer debug.SetMemoryLimit(origLimit)

	var mu sync.Mutex
	var limits []int64
	h := NewHeap(HeapConfig{Live: func() uint64 { return 256 << 20 }, SetLimit: func(l int64) int64 {
		if l >= 0 {
			mu.Lock()
			limits = append(limits, l)
			mu.Unlock()
		}
		return debug.SetMemoryLimit(l)
	}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); h.Run(ctx) }()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		runtime.GC()
		mu.Lock()
		n := len(limits)
		mu.Unlock()
		if n > 0 {
			break
		}
	}
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	// 256 MiB live under GOGC 100 asks for 640 MiB and what is outside
	// the heap; then the 1 GiB it found is back.
	if len(limits) < 2 || limits[0] < 640<<20 || limits[0] >= 1<<30 || limits[len(limits)-1] != 1<<30 {
		t.Errorf("limits set %v, want 640 MiB and a little more, then 1 GiB back", limits)
	}
	// A live heap that asks for more than the ceiling gets the ceiling.
	if got := LimitFor(1<<30, 100, 64<<20, 0, 1<<30); got != 1<<30 {
		t.Errorf("LimitFor past the ceiling = %d", got)
	}
	if got := debug.SetMemoryLimit(-1); got != 1<<30 {
		t.Errorf("after Run the limit is %d, want the 1 GiB it found", got)
	}
}
