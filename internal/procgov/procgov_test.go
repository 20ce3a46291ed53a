package procgov

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

const tick = 50 * time.Millisecond

// sample is a tick of tick's length in which the process used cores
// cores and goroutines waited wait for a P.
func sample(cores float64, wait time.Duration) Sample {
	return Sample{Wall: tick, CPU: time.Duration(cores * float64(tick)), Wait: wait}
}

// governor is a Governor with Max Ps, a Hold of four ticks, that
// records what it sets.
func governor(max int) (*Governor, *[]int) {
	var set []int
	g := New(Config{Max: max, Tick: tick, Hold: 4 * tick, Set: func(n int) { set = append(set, n) }})
	return g, &set
}

// feed gives g n ticks of s and returns the Ps after each.
func feed(g *Governor, n int, s Sample) []int {
	var ps []int
	for range n {
		ps = append(ps, g.Observe(s))
	}
	return ps
}

// TestStepDown: an idle process loses one P per Hold, down to one.
func TestStepDown(t *testing.T) {
	g, set := governor(4)
	got := feed(g, 20, sample(0.1, 0))
	want := []int{4, 4, 4, 3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1}
	if !slices.Equal(got, want) || !slices.Equal(*set, []int{3, 2, 1}) {
		t.Fatalf("Ps per idle tick %v, want %v; set %v", got, want, *set)
	}
}

// TestStepDownOnAverage: the step down judges a Hold's average, so a
// bulk transfer on two Ps (0.85-1 cores, in uneven ticks) comes down to
// one; a process that needs more than one core stays.
func TestStepDownOnAverage(t *testing.T) {
	g, set := governor(2)
	for range 2 {
		g.Observe(sample(1.2, 0))
		g.Observe(sample(0.65, 0))
	}
	if g.procs != 1 || !slices.Equal(*set, []int{1}) {
		t.Fatalf("after a Hold at 0.925 cores: %d Ps, set %v; want 1", g.procs, *set)
	}

	g, set = governor(2)
	for range 20 {
		g.Observe(sample(1.3, 0))
		g.Observe(sample(0.9, 0))
	}
	if len(*set) != 0 {
		t.Fatalf("at 1.1 cores on average, set %v; want 2 Ps kept", *set)
	}
}

// TestStepUp: two busy ticks in a row double the Ps, up to Max; one
// alone is a burst and changes nothing; a bulk transfer on one P
// (0.7-0.85 cores, short waits) is not busy.
func TestStepUp(t *testing.T) {
	g, set := governor(4)
	feed(g, 12, sample(0, 0))
	*set = nil
	for _, s := range []Sample{sample(0.95, 0), sample(0.5, 0), sample(0.95, 0), sample(0.8, 30*time.Microsecond)} {
		if n := g.Observe(s); n != 1 {
			t.Fatalf("Observe(%+v): %d Ps, want 1", s, n)
		}
	}
	if got := feed(g, 20, sample(0.85, 800*time.Microsecond)); slices.Max(got) != 1 {
		t.Fatalf("a transfer on one P: Ps %v, want 1 throughout", got)
	}
	got := feed(g, 6, sample(3.9, 0))
	if want := []int{1, 2, 2, 4, 4, 4}; !slices.Equal(got, want) || !slices.Equal(*set, []int{2, 4}) {
		t.Fatalf("busy ticks: Ps %v, want %v; set %v", got, want, *set)
	}
}

// TestWaitsAddPs: goroutines queueing for the one P add Ps even when
// the process's CPU time is low (its threads are not getting a core),
// and keep them.
func TestWaitsAddPs(t *testing.T) {
	g, set := governor(2)
	feed(g, 4, sample(0, 0))
	if got := feed(g, 2, sample(0.5, upWait)); got[1] != 2 {
		t.Fatalf("waits of %v at 0.5 cores: Ps %v, want 2", upWait, got)
	}
	if got := feed(g, 30, sample(0.5, 2*time.Millisecond)); slices.Min(got) != 2 {
		t.Fatalf("goroutines still queueing, yet Ps %v", got)
	}
	if !slices.Equal(*set, []int{1, 2}) {
		t.Fatalf("set %v, want [1 2]", *set)
	}
}

// TestBounceHoldsLonger: a P taken away and needed back within two
// Holds doubles the Hold before the next step down (up to maxHold of
// them); one needed back after maxHold Holds brings it back.
func TestBounceHoldsLonger(t *testing.T) {
	g, set := governor(2)
	feed(g, 4, sample(0, 0)) // down at tick 4
	feed(g, 2, sample(0.95, 0))
	if g.procs != 2 || g.hold != 8*tick {
		t.Fatalf("after a bounce: %d Ps, hold %v; want 2, %v", g.procs, g.hold, 8*tick)
	}
	if got := feed(g, 8, sample(0, 0)); got[6] != 2 || got[7] != 1 {
		t.Fatalf("step down after a bounce: Ps %v, want it at the 8th tick", got)
	}
	for range 10 { // bounces back to back: the hold stops growing
		feed(g, 2, sample(0.95, 0))
		for g.procs != 1 {
			g.Observe(sample(0, 0))
		}
	}
	if g.hold != maxHold*4*tick {
		t.Fatalf("hold %v after many bounces, want %v", g.hold, maxHold*4*tick)
	}
	feed(g, maxHold*4, sample(0.5, 0)) // maxHold Holds on one P
	feed(g, 2, sample(0.95, 0))
	if got := feed(g, 4, sample(0, 0)); got[3] != 1 || g.hold != 4*tick {
		t.Fatalf("after a long calm: Ps %v, hold %v; want down again after %v", got, g.hold, 4*tick)
	}
	if n := len(*set); n != 3+2*10+2 {
		t.Fatalf("%d changes, want %d", n, 3+2*10+2)
	}
}

// TestMaxOne: a Governor with one P to give never sets anything.
func TestMaxOne(t *testing.T) {
	g := New(Config{Max: 0, Tick: tick, Hold: tick, Set: func(n int) { t.Fatalf("set %d", n) }})
	for _, s := range []Sample{sample(0, 0), sample(5, time.Second), sample(0, 0)} {
		if got := g.Observe(s); got != 1 {
			t.Fatalf("Observe(%+v) = %d, want 1", s, got)
		}
	}
}

// TestRun drives the real runtime: idle, the process comes down to one
// P; with more CPU-bound goroutines than that, back up to Max; when Run
// ends, at Max again.
func TestRun(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	const max = 2
	runtime.GOMAXPROCS(max)
	g := New(Config{
		Max: max, Tick: 20 * time.Millisecond, Hold: 100 * time.Millisecond,
		Set: func(n int) { runtime.GOMAXPROCS(n) }, CPU: ProcessCPU,
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); g.Run(ctx) }()
	defer func() { cancel(); <-done }()

	waitProcs(t, 1, "idle")

	// Eight goroutines that each compute for 200 µs at a time: on one P
	// they use it all, and queue for it for about 1.4 ms at a time
	// (which counts even when a loaded host gives the process less of
	// a core).
	var stop atomic.Bool
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for !stop.Load() {
				_ = spin(200 * time.Microsecond)
				runtime.Gosched()
			}
		})
	}
	waitProcs(t, max, "busy")
	stop.Store(true)
	wg.Wait()
	waitProcs(t, 1, "idle again")

	cancel()
	<-done
	if got := runtime.GOMAXPROCS(0); got != max {
		t.Fatalf("after Run: GOMAXPROCS %d, want %d", got, max)
	}
}

// TestRunClockFails: a CPU clock that fails stops the Governor where it
// is (at Max), and Run returns.
func TestRunClockFails(t *testing.T) {
	g := New(Config{Max: 3, Set: func(n int) { t.Errorf("set %d", n) },
		CPU: func() (time.Duration, error) { return 0, errors.New("no clock") }})
	done := make(chan struct{})
	go func() { defer close(done); g.Run(context.Background()) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run kept going without a clock")
	}
}

// TestProcessCPU: the clock counts this process's work.
func TestProcessCPU(t *testing.T) {
	a, err := ProcessCPU()
	if err != nil {
		t.Skipf("no process CPU clock here: %v", err)
	}
	_ = spin(50 * time.Millisecond)
	b, err := ProcessCPU()
	if err != nil {
		t.Fatal(err)
	}
	if b-a < 20*time.Millisecond {
		t.Fatalf("50 ms of computing counted as %v", b-a)
	}
}

func waitProcs(t *testing.T, want int, what string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for runtime.GOMAXPROCS(0) != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s: GOMAXPROCS %d after 20 s, want %d", what, runtime.GOMAXPROCS(0), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// spin computes for d of wall time.
func spin(d time.Duration) int {
	end := time.Now().Add(d)
	x := 1
	for time.Now().Before(end) {
		for i := range 1000 {
			x = x*31 + i
		}
	}
	return x
}
