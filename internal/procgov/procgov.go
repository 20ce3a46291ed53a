// Package procgov sizes the gateway's GOMAXPROCS to its load, between
// one and the runtime's default (Governor), and its GOGC to its live
// heap (HeapGovernor, heap.go).
//
// With a P for every core, the runtime keeps the spare Ps busy: a
// goroutine made runnable while a P is idle (the SSH transport's read
// loop handing a packet to the copy into a command's stdin, the poller
// waking a reader) wakes another thread to run it, and sysmon hands a P
// whose thread has been in a system call past its tick to yet another.
// On a bulk transfer the threads then trade the work back and forth
// through futex wake-ups, each of which takes a core from the client,
// the sandboxed command or the other thread; on a small host that is
// where much of the transfer's time goes (bench/README.md has the
// numbers). One P is not a setting for a busy gateway, though: it would
// put every session's encryption on one core and make them queue for
// it. So the Governor watches the process's CPU time and how long
// runnable goroutines wait for a P, doubles the Ps (up to the runtime's
// default) when the ones it has were nearly all busy, or goroutines
// queued for them, for two ticks in a row, and takes one away after a
// Hold in which the process used less than one P fewer.
package procgov

import (
	"context"
	"errors"
	"log/slog"
	"runtime"
	"runtime/metrics"
	"time"
)

// Runtime is GOMAXPROCS as the Governor reads and changes it.
type Runtime interface {
	// Procs returns GOMAXPROCS.
	Procs() int
	// Set sets it to n. The runtime then stops following the host's CPU
	// count and the process's cgroup CPU limit.
	Set(n int)
	// Default sets it to the runtime's default and has the runtime
	// follow the host again.
	Default()
}

// GoRuntime is this process's runtime.
type GoRuntime struct{}

// Procs is runtime.GOMAXPROCS(0).
func (GoRuntime) Procs() int { return runtime.GOMAXPROCS(0) }

// Set is runtime.GOMAXPROCS(n).
func (GoRuntime) Set(n int) { runtime.GOMAXPROCS(n) }

// Default is runtime.SetDefaultGOMAXPROCS.
func (GoRuntime) Default() { runtime.SetDefaultGOMAXPROCS() }

// Config is a Governor's. Zero values get the defaults noted.
type Config struct {
	// Runtime is what the Governor changes (required; GoRuntime). It
	// must be at the runtime's default when the Governor starts.
	Runtime Runtime
	// CPU returns the process's CPU time so far, user and system
	// (ProcessCPU).
	CPU func() (time.Duration, error)
	// Tick is how often the Governor looks (default 50 ms).
	Tick time.Duration
	// IdleTick is how often it looks once the process has been idle
	// for a Hold (default 250 ms): an idle gateway then wakes four
	// times a second for it rather than twenty. The first tick that is
	// not idle brings Tick back.
	IdleTick time.Duration
	// Hold is how long the load must stay low before a P is taken away
	// (default 1 s).
	Hold time.Duration
	Log  *slog.Logger
}

// Sample is what the Governor sees of one tick.
type Sample struct {
	// Wall is the tick's length, CPU the process's CPU time in it.
	Wall, CPU time.Duration
	// Wait is how long goroutines waited for a P in the tick, runnable
	// but not running: the 90th percentile of the runtime's sampled
	// waits (/sched/latencies:seconds), 0 when it sampled fewer than
	// minWaits.
	Wait time.Duration
}

const (
	// upAt: ticks in which the process used this share of its Ps'
	// capacity or more are busy (a P is a core's worth of Go code;
	// system calls made off a P count too, so use can pass it).
	upAt = 0.9
	// upWait: so are ticks in which goroutines waited this long for a
	// P (in effect more than 0.92 ms: the runtime's buckets are a
	// quarter of an octave wide). A bulk transfer on one P, the read
	// loop and the copy taking turns, has its 90th percentile at
	// 10-50 µs, now and then near 0.8 ms when the host gives the thread
	// no core; three transfers at once on one P, 1-4 ms in most ticks.
	upWait = time.Millisecond
	// minWaits: fewer sampled waits in a tick say nothing of its Wait
	// (the runtime times one scheduling in eight).
	minWaits = 8
	// upTicks busy ticks in a row double the Ps (up to the default):
	// one alone is a burst (a key exchange, a command starting).
	upTicks = 2
	// downAt: a Hold in which the process used less than this share of
	// one P fewer, on average, and had no busy tick, takes one away.
	// With two Ps a bulk transfer uses 0.85-1 cores, much of it the
	// cost of the second P, and 0.7-0.8 with one.
	downAt = 1.0
	// idleAt: ticks in which the process used less than this share of
	// one core, with no measured wait for a P, are idle.
	idleAt = 0.02
	// maxHold bounds how far Hold grows (as a multiple of Config.Hold)
	// when a P taken away is soon needed back.
	maxHold = 16
)

// Governor changes GOMAXPROCS as the process's load asks.
type Governor struct {
	cfg Config
	// max is the runtime's default as last seen; atMax: the runtime is
	// at its default and follows the host (procs is then re-read every
	// tick).
	max   int
	atMax bool
	procs int
	busy  int // busy ticks in a row

	// The window over which a step down is judged: CPU and wall time
	// since the last change or the last judgement, and whether a tick
	// in it was busy.
	winCPU, winWall time.Duration
	winBusy         bool

	// hold is Config.Hold, doubled each time a P taken away is needed
	// back within two holds (up to maxHold times Config.Hold), and back
	// to Config.Hold when one is needed back after maxHold of those.
	hold time.Duration
	// now is the sum of the ticks' lengths; down is now at the last step
	// down (negative: none yet).
	now, down time.Duration
	// idle is how long the process has been idle (idleAt), in ticks in
	// a row.
	idle time.Duration
}

// New returns a Governor; the runtime is at its default.
func New(cfg Config) *Governor {
	if cfg.Tick <= 0 {
		cfg.Tick = 50 * time.Millisecond
	}
	if cfg.Hold <= 0 {
		cfg.Hold = time.Second
	}
	if cfg.IdleTick <= 0 {
		cfg.IdleTick = max(cfg.Tick, 250*time.Millisecond)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	g := &Governor{cfg: cfg, atMax: true, hold: cfg.Hold, down: -1}
	g.max = max(cfg.Runtime.Procs(), 1)
	g.procs = g.max
	return g
}

// Observe takes one tick's sample and changes GOMAXPROCS if it calls
// for a change. It returns the Ps in force afterwards.
func (g *Governor) Observe(s Sample) int {
	if g.atMax {
		g.max = max(g.cfg.Runtime.Procs(), 1)
		g.procs = g.max
	}
	if s.Wall <= 0 {
		return g.procs
	}
	g.now += s.Wall
	cores := float64(s.CPU) / float64(s.Wall)
	if cores < idleAt && s.Wait == 0 {
		g.idle += s.Wall
	} else {
		g.idle = 0
	}
	if cores >= upAt*float64(g.procs) || s.Wait >= upWait {
		g.busy++
	} else {
		g.busy = 0
	}
	if g.busy >= upTicks && g.procs < g.max {
		if g.down >= 0 {
			switch since := g.now - g.down; {
			case since >= maxHold*g.cfg.Hold:
				g.hold = g.cfg.Hold
			case since < 2*g.hold:
				g.hold = min(2*g.hold, maxHold*g.cfg.Hold)
			}
		}
		g.set(g.procs*2, cores, s.Wait)
		return g.procs
	}
	if g.procs == 1 {
		return g.procs
	}
	g.winCPU += s.CPU
	g.winWall += s.Wall
	g.winBusy = g.winBusy || g.busy > 0
	if g.winWall < g.hold {
		return g.procs
	}
	used := float64(g.winCPU) / float64(g.winWall)
	if !g.winBusy && used < downAt*float64(g.procs-1) {
		g.set(g.procs-1, used, s.Wait)
		g.down = g.now
	}
	g.winCPU, g.winWall, g.winBusy = 0, 0, false
	return g.procs
}

// Next is how long to wait before the next tick: IdleTick once the
// process has been idle for a Hold, Tick otherwise.
func (g *Governor) Next() time.Duration {
	if g.idle >= g.cfg.Hold {
		return g.cfg.IdleTick
	}
	return g.cfg.Tick
}

// set changes GOMAXPROCS to n, or to the runtime's default when n
// reaches it.
func (g *Governor) set(n int, cores float64, wait time.Duration) {
	from := g.procs
	if n >= g.max {
		g.cfg.Runtime.Default()
		g.max = max(g.cfg.Runtime.Procs(), 1)
		g.procs, g.atMax = g.max, true
	} else {
		g.cfg.Runtime.Set(n)
		g.procs, g.atMax = n, false
	}
	g.cfg.Log.Debug("gomaxprocs", "from", from, "to", g.procs, "cores_used", cores, "wait_p90", wait, "hold", g.hold)
	g.busy = 0
	g.winCPU, g.winWall, g.winBusy = 0, 0, false
}

// Run looks every Tick (IdleTick while idle: Next) until ctx is done,
// then puts GOMAXPROCS back to the runtime's default. A failing CPU
// clock, or a runtime without the scheduler's latencies, stops it there
// too.
func (g *Governor) Run(ctx context.Context) {
	defer func() {
		if !g.atMax {
			g.set(g.max, 0, 0)
		}
	}()
	waits, err := newWaitMeter()
	if err != nil {
		g.cfg.Log.Warn("gomaxprocs_governor_off", "err", err)
		return
	}
	lastCPU, err := g.cfg.CPU()
	if err != nil {
		g.cfg.Log.Warn("gomaxprocs_governor_off", "err", err)
		return
	}
	last := time.Now()
	t := time.NewTimer(g.Next())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			cpu, err := g.cfg.CPU()
			now := time.Now()
			if err != nil {
				g.cfg.Log.Warn("gomaxprocs_governor_off", "err", err)
				return
			}
			g.Observe(Sample{Wall: now.Sub(last), CPU: cpu - lastCPU, Wait: waits.next()})
			lastCPU, last = cpu, now
			t.Reset(g.Next())
		}
	}
}

// waitMeter reads the runtime's histogram of scheduling latencies and
// summarises what was added to it since the last read.
type waitMeter struct {
	sample []metrics.Sample
	prev   []uint64
}

const latencies = "/sched/latencies:seconds"

var errNoLatencies = errors.New("the runtime does not report " + latencies)

func newWaitMeter() (*waitMeter, error) {
	m := &waitMeter{sample: []metrics.Sample{{Name: latencies}}}
	metrics.Read(m.sample)
	if m.sample[0].Value.Kind() != metrics.KindFloat64Histogram {
		return nil, errNoLatencies
	}
	m.prev = append([]uint64(nil), m.sample[0].Value.Float64Histogram().Counts...)
	return m, nil
}

// next returns p90 of the waits timed since the last call.
func (m *waitMeter) next() time.Duration {
	metrics.Read(m.sample)
	h := m.sample[0].Value.Float64Histogram()
	d := p90(h.Buckets, m.prev, h.Counts)
	copy(m.prev, h.Counts)
	return d
}

// p90 returns the 90th percentile of a histogram's growth from prev to
// counts (bucket i holds [buckets[i], buckets[i+1])): the upper bound
// of the bucket it falls in, at most an hour; 0 when fewer than
// minWaits were added.
func p90(buckets []float64, prev, counts []uint64) time.Duration {
	var total uint64
	for i, c := range counts {
		total += c - prev[i]
	}
	if total < minWaits {
		return 0
	}
	var seen uint64
	for i, c := range counts {
		seen += c - prev[i]
		if seen*10 >= total*9 {
			return time.Duration(max(0, min(buckets[i+1], 3600)) * float64(time.Second))
		}
	}
	return 0
}
