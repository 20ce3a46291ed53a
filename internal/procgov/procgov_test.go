package procgov

import (
	"context"
	"errors"
	"math"
	"os"
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

// fakeRuntime is GOMAXPROCS for the policy's tests: def is the
// runtime's default, set what the Governor made GOMAXPROCS, in order.
type fakeRuntime struct {
	def, procs int
	set        []int
}

func (r *fakeRuntime) Procs() int { return r.procs }
func (r *fakeRuntime) Set(n int)  { r.procs = n; r.set = append(r.set, n) }
func (r *fakeRuntime) Default()   { r.procs = r.def; r.set = append(r.set, r.def) }

// governor is a Governor over a fakeRuntime whose default is def, with
// a Hold of four ticks; it returns what the Governor sets.
func governor(def int) (*Governor, *[]int) {
	rt := &fakeRuntime{def: def, procs: def}
	g := New(Config{Runtime: rt, Tick: tick, Hold: 4 * tick})
	return g, &rt.set
}

// feed gives g n ticks of s and returns the Ps after each.
func feed(g *Governor, n int, s Sample) []int {
	var ps []int
	for range n {
		ps = append(ps, g.Observe(s))
	}
	return ps
}

// TestIdleTicksSlower: a process idle for a Hold is looked at every
// IdleTick; the first tick with work, or with goroutines waiting for a
// P, brings Tick back.
func TestIdleTicksSlower(t *testing.T) {
	g, _ := governor(2)
	if got := g.Next(); got != tick {
		t.Fatalf("at start: next tick in %v, want %v", got, tick)
	}
	var nexts []time.Duration
	for range 5 {
		g.Observe(sample(0.001, 0))
		nexts = append(nexts, g.Next())
	}
	idle := 250 * time.Millisecond
	if want := []time.Duration{tick, tick, tick, idle, idle}; !slices.Equal(nexts, want) {
		t.Fatalf("next ticks while idle %v, want %v", nexts, want)
	}
	g.Observe(sample(0.05, 0))
	if got := g.Next(); got != tick {
		t.Fatalf("after a tick with work: next in %v, want %v", got, tick)
	}
	feed(g, 4, sample(0, 0))
	g.Observe(sample(0, 2*time.Millisecond))
	if got := g.Next(); got != tick {
		t.Fatalf("after a tick with waits: next in %v, want %v", got, tick)
	}
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

	// A tick in which goroutines queued, anywhere in the Hold, keeps the
	// P for that Hold.
	g, set = governor(2)
	feed(g, 1, sample(0.1, 0))
	feed(g, 1, sample(0.1, 2*time.Millisecond))
	if got := feed(g, 6, sample(0.1, 0)); got[1] != 2 || got[5] != 1 {
		t.Fatalf("a queueing tick in the Hold: Ps %v, want 2 until the next Hold ends", got)
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
	feed(g, 4, sample(0, 0))    // down at tick 4
	feed(g, 3, sample(0.5, 0))  // one P keeps up...
	feed(g, 2, sample(0.95, 0)) // ...until 250 ms later: under two Holds
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

// TestMaxOne: with one P to give, the Governor changes nothing.
func TestMaxOne(t *testing.T) {
	g, set := governor(1)
	for _, smp := range []Sample{sample(0, 0), sample(5, time.Second), sample(5, time.Second), sample(0, 0)} {
		if got := g.Observe(smp); got != 1 {
			t.Fatalf("Observe(%+v) = %d, want 1", smp, got)
		}
	}
	if len(*set) != 0 {
		t.Fatalf("set %v, want nothing", *set)
	}
}

// TestFollowsTheDefault: at the runtime's default the Governor takes
// what the runtime follows (a cgroup limit lowered, say); going back up
// it asks for the default again rather than a number of its own.
func TestFollowsTheDefault(t *testing.T) {
	rt := &fakeRuntime{def: 4, procs: 4}
	g := New(Config{Runtime: rt, Tick: tick, Hold: 4 * tick})
	rt.def, rt.procs = 3, 3 // the runtime followed a new limit
	if got := g.Observe(sample(2, 0)); got != 3 {
		t.Fatalf("after the runtime moved to 3: %d Ps", got)
	}
	feed(g, 4, sample(0.1, 0))
	if rt.procs != 2 || !slices.Equal(rt.set, []int{2}) {
		t.Fatalf("idle: GOMAXPROCS %d, set %v; want 2", rt.procs, rt.set)
	}
	rt.def = 5 // more CPUs meanwhile: the default is what going up reaches
	feed(g, 2, sample(1.9, 0))
	if rt.procs != 5 || g.Observe(sample(4, 0)) != 5 {
		t.Fatalf("busy: GOMAXPROCS %d, set %v; want the default, 5", rt.procs, rt.set)
	}
}

// TestP90 reads the histogram's growth as the runtime lays it out.
func TestP90(t *testing.T) {
	inf := math.Inf(1)
	buckets := []float64{math.Inf(-1), 0, 1e-6, 1e-3, 1e-2, inf}
	for _, c := range []struct {
		name         string
		prev, counts []uint64
		want         time.Duration
	}{
		{"nothing", []uint64{0, 0, 0, 0, 0}, []uint64{0, 0, 0, 0, 0}, 0},
		{"fewer than minWaits", []uint64{0, 0, 0, 0, 0}, []uint64{0, 0, 0, 7, 0}, 0},
		{"growth, not totals", []uint64{0, 50, 0, 0, 0}, []uint64{0, 52, 0, 5, 0}, 0},
		{"all in one bucket: its upper bound", []uint64{0, 0, 0, 0, 0}, []uint64{0, 0, 0, 8, 0}, 10 * time.Millisecond},
		{"nine tenths below", []uint64{0, 0, 0, 0, 0}, []uint64{0, 0, 9, 1, 0}, time.Millisecond},
		{"eight tenths below", []uint64{0, 0, 0, 0, 0}, []uint64{0, 0, 8, 2, 0}, 10 * time.Millisecond},
		{"old counts left out", []uint64{0, 0, 100, 0, 0}, []uint64{0, 0, 100, 10, 0}, 10 * time.Millisecond},
		{"the open last bucket", []uint64{0, 0, 0, 0, 0}, []uint64{0, 0, 0, 0, 10}, time.Hour},
		{"the first bucket", []uint64{0, 0, 0, 0, 0}, []uint64{10, 0, 0, 0, 0}, 0},
	} {
		if got := p90(buckets, c.prev, c.counts); got != c.want {
			t.Errorf("%s: p90 = %v, want %v", c.name, got, c.want)
		}
	}
}

// runtimeDefault returns this process's default GOMAXPROCS, which must
// be 2 or more for the Governor to have anything to do.
func runtimeDefault(t *testing.T) int {
	t.Helper()
	runtime.SetDefaultGOMAXPROCS()
	def := runtime.GOMAXPROCS(0)
	if def < 2 {
		if os.Getenv("CI") == "true" {
			t.Fatalf("the runtime's default GOMAXPROCS is %d: this test needs 2 cores or more", def)
		}
		t.Skipf("the runtime's default GOMAXPROCS is %d: nothing to govern", def)
	}
	return def
}

// runGovernor runs a Governor on this process's runtime, with cpu as
// its clock, until the test ends.
func runGovernor(t *testing.T, cpu func() (time.Duration, error)) {
	g := New(Config{Runtime: GoRuntime{}, CPU: cpu, Tick: 50 * time.Millisecond, Hold: 250 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); g.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// queue starts eight goroutines that each compute for 200 µs at a time
// until the returned stop is called: on one P they use it all, and
// queue for it for about 1.4 ms at a time (which shows even when a
// loaded host gives the process little of a core).
func queue() (stop func()) {
	var done atomic.Bool
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for !done.Load() {
				_ = spin(200 * time.Microsecond)
				runtime.Gosched()
			}
		})
	}
	return func() { done.Store(true); wg.Wait() }
}

// TestRun drives the real runtime: idle, the process comes down to one
// P; with more CPU-bound goroutines than that, back up to the default;
// when Run ends, at the default and following the host.
func TestRun(t *testing.T) {
	def := runtimeDefault(t)
	defer runtime.SetDefaultGOMAXPROCS()
	ctx, cancel := context.WithCancel(context.Background())
	g := New(Config{Runtime: GoRuntime{}, CPU: ProcessCPU, Tick: 50 * time.Millisecond, Hold: 250 * time.Millisecond})
	done := make(chan struct{})
	go func() { defer close(done); g.Run(ctx) }()
	defer func() { cancel(); <-done }()

	waitProcs(t, 1, "idle")
	stop := queue()
	waitProcs(t, def, "busy")
	stop()
	waitProcs(t, 1, "idle again")

	cancel()
	<-done
	if got := runtime.GOMAXPROCS(0); got != def {
		t.Fatalf("after Run: GOMAXPROCS %d, want the default, %d", got, def)
	}
}

// TestRunOnWaits: with a CPU clock that never moves, only goroutines
// queueing for the one P (read from the runtime's latencies) bring the
// Ps back, and only the queue's end lets them go again.
func TestRunOnWaits(t *testing.T) {
	def := runtimeDefault(t)
	defer runtime.SetDefaultGOMAXPROCS()
	runGovernor(t, func() (time.Duration, error) { return 0, nil })
	waitProcs(t, 1, "idle")
	stop := queue()
	waitProcs(t, def, "queueing")
	stop()
	waitProcs(t, 1, "idle again")
}

// TestRunClockFails: a CPU clock that fails stops the Governor where it
// is (at the default), and Run returns.
func TestRunClockFails(t *testing.T) {
	rt := &fakeRuntime{def: 3, procs: 3}
	g := New(Config{Runtime: rt, CPU: func() (time.Duration, error) { return 0, errors.New("no clock") }})
	done := make(chan struct{})
	go func() { defer close(done); g.Run(context.Background()) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run kept going without a clock")
	}
	if len(rt.set) != 0 {
		t.Fatalf("set %v, want nothing", rt.set)
	}
}

// TestProcessCPU: the clock counts this process's work.
func TestProcessCPU(t *testing.T) {
	a, err := ProcessCPU()
	if err != nil {
		t.Skipf("no process CPU clock here: %v", err)
	}
	// Compute until the clock has counted 50 ms, or for at most 10 s of
	// wall time: on a loaded machine 50 ms of wall time may hold only a
	// few ms of this process's CPU.
	var b time.Duration
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		_ = spin(10 * time.Millisecond)
		if b, err = ProcessCPU(); err != nil {
			t.Fatal(err)
		}
		if b-a >= 50*time.Millisecond {
			return
		}
	}
	t.Fatalf("10 s of computing counted as %v", b-a)
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
