// Package procgov sizes the gateway's GOMAXPROCS to its load, between
// one and the runtime's default.
//
// With a P for every core, a goroutine that readies another (the SSH
// transport's read loop handing a packet to the copy into a command's
// stdin, the poller waking a reader) makes the runtime wake a second
// thread to run it, and the two threads then trade the work back and
// forth through futex wake-ups, each of which takes a core from the
// client, the sandboxed command or the other thread. On a small host
// that is where much of a bulk transfer's time goes: 1 GiB up an exec
// channel on 2 cores took 0.92-1.06 s of the gateway's CPU with two Ps
// and 0.55-0.75 s with one (bench/README.md). One P is not a setting for
// a busy gateway, though: it would put every session's encryption on one
// core and make them queue for it. So the Governor watches the
// process's CPU time and how long runnable goroutines wait for a P, adds
// Ps as soon as the ones it has are nearly all busy or goroutines queue
// for them, and takes one away once the process has needed well under
// what it has for a while.
package procgov

import (
	"context"
	"errors"
	"log/slog"
	"runtime/metrics"
	"time"
)

// Config is a Governor's. Zero values get the defaults noted.
type Config struct {
	// Max is the most Ps (required): the runtime's default, from
	// runtime.GOMAXPROCS(0) before anything set it.
	Max int
	// Set sets GOMAXPROCS (runtime.GOMAXPROCS).
	Set func(n int)
	// CPU returns the process's CPU time so far, user and system
	// (ProcessCPU).
	CPU func() (time.Duration, error)
	// Tick is how often the Governor looks (default 50 ms).
	Tick time.Duration
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
	// P. A bulk transfer on one P, the read loop and the copy taking
	// turns, has its 90th percentile at 10-50 µs, now and then near
	// 0.8 ms when the host gives the thread no core; three transfers at
	// once on one P, 1-4 ms in most ticks.
	upWait = time.Millisecond
	// minWaits: fewer sampled waits in a tick say nothing of its Wait.
	minWaits = 8
	// upTicks busy ticks in a row double the Ps (up to Max): one alone
	// is a burst (a key exchange, a command starting).
	upTicks = 2
	// downAt: a Hold in which the process used less than this share of
	// one P fewer, on average, with no busy tick at its end, takes one
	// away. With two Ps a bulk transfer uses 0.85-1 cores, most of it
	// the cost of the second P, and 0.7-0.8 with one.
	downAt = 1.0
	// maxHold bounds how far Hold grows (as a multiple of Config.Hold)
	// when a P taken away is soon needed back.
	maxHold = 16
)

// Governor changes GOMAXPROCS as the process's load asks.
type Governor struct {
	cfg   Config
	procs int
	busy  int // busy ticks in a row

	// The window over which the step down is judged: CPU and wall time
	// since the last change or the last judgement.
	winCPU, winWall time.Duration

	// hold is Config.Hold, doubled each time a P taken away is needed
	// back within two holds (up to maxHold times Config.Hold), and back
	// to Config.Hold when one is needed back after maxHold of those.
	hold time.Duration
	// now is the sum of the ticks' lengths; down is now at the last step
	// down (negative: none yet).
	now, down time.Duration
}

// New returns a Governor that starts at cfg.Max Ps.
func New(cfg Config) *Governor {
	if cfg.Tick <= 0 {
		cfg.Tick = 50 * time.Millisecond
	}
	if cfg.Hold <= 0 {
		cfg.Hold = time.Second
	}
	cfg.Max = max(cfg.Max, 1)
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Governor{cfg: cfg, procs: cfg.Max, hold: cfg.Hold, down: -1}
}

// Observe takes one tick's sample and sets GOMAXPROCS if it calls for a
// change. It returns the Ps in force afterwards.
func (g *Governor) Observe(s Sample) int {
	if s.Wall <= 0 {
		return g.procs
	}
	g.now += s.Wall
	cores := float64(s.CPU) / float64(s.Wall)
	if cores >= upAt*float64(g.procs) || s.Wait >= upWait {
		g.busy++
	} else {
		g.busy = 0
	}
	if g.busy >= upTicks && g.procs < g.cfg.Max {
		if g.down >= 0 {
			switch since := g.now - g.down; {
			case since >= maxHold*g.cfg.Hold:
				g.hold = g.cfg.Hold
			case since < 2*g.hold:
				g.hold = min(2*g.hold, maxHold*g.cfg.Hold)
			}
		}
		g.set(min(g.cfg.Max, g.procs*2), cores, s.Wait)
		return g.procs
	}
	if g.procs == 1 {
		return g.procs
	}
	g.winCPU += s.CPU
	g.winWall += s.Wall
	if g.winWall < g.hold {
		return g.procs
	}
	used := float64(g.winCPU) / float64(g.winWall)
	if g.busy == 0 && used < downAt*float64(g.procs-1) {
		g.set(g.procs-1, used, s.Wait)
		g.down = g.now
	}
	g.winCPU, g.winWall = 0, 0
	return g.procs
}

func (g *Governor) set(n int, cores float64, wait time.Duration) {
	g.cfg.Log.Debug("gomaxprocs", "from", g.procs, "to", n, "cores_used", cores, "wait_p90", wait, "hold", g.hold)
	g.procs = n
	g.busy = 0
	g.winCPU, g.winWall = 0, 0
	g.cfg.Set(n)
}

// Run looks every Tick until ctx is done, then sets GOMAXPROCS back to
// Max. A failing CPU clock, or a runtime without the scheduler's
// latencies, stops it there too.
func (g *Governor) Run(ctx context.Context) {
	defer func() {
		if g.procs != g.cfg.Max {
			g.set(g.cfg.Max, 0, 0)
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
	t := time.NewTicker(g.cfg.Tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			cpu, err := g.cfg.CPU()
			if err != nil {
				g.cfg.Log.Warn("gomaxprocs_governor_off", "err", err)
				return
			}
			g.Observe(Sample{Wall: now.Sub(last), CPU: cpu - lastCPU, Wait: waits.next()})
			lastCPU, last = cpu, now
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

// next returns the 90th percentile of the waits sampled since the last
// call (the upper bound of its bucket), or 0 when fewer than minWaits
// were.
func (m *waitMeter) next() time.Duration {
	metrics.Read(m.sample)
	h := m.sample[0].Value.Float64Histogram()
	var total uint64
	for i, c := range h.Counts {
		total += c - m.prev[i]
	}
	var p90 time.Duration
	if total >= minWaits {
		var seen uint64
		for i, c := range h.Counts {
			seen += c - m.prev[i]
			if seen*10 >= total*9 {
				p90 = time.Duration(min(h.Buckets[i+1], 3600) * float64(time.Second))
				break
			}
		}
	}
	copy(m.prev, h.Counts)
	return p90
}
