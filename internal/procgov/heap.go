package procgov

import (
	"context"
	"log/slog"
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
)

// HeapConfig configures a HeapGovernor.
//
// x/crypto/ssh and pkg/sftp copy every packet they receive into a fresh
// buffer, so a transfer makes as much garbage as it moves. A lazy
// collector (GOGC 400) saves 10-20% of the gateway's CPU on uploads
// while the live heap is small, but lets the garbage grow to four times
// the live heap: 60 stalled link downloads (40 MB live) took the
// gateway's RSS to 300 MB. The HeapGovernor keeps GOGC at MaxPercent
// while that costs at most Slack of garbage, and lowers it (down to
// MinPercent) as the live heap grows, so the garbage the collector lets
// build up stays near Slack.
//
// GOGC alone leaves the peak to timing: the GOGC a cycle's goal is
// computed with is the one set after the cycle before, for that cycle's
// live heap, and the governor only hears of a cycle when the collector's
// sweep reaches its sentinel (armCycleSignal), which may be late in the
// next one. A live heap that jumps between two cycles (60 link downloads
// that start at once: 4 MB live, then 45 MB) met GOGC 400 and a goal of
// five times 45 MB until the governor caught up: 274 MB of RSS once,
// against 170 MB usually. So the governor also sets the runtime's soft
// memory limit (debug.SetMemoryLimit) after a cycle (one whose live heap
// moved by more than a sixteenth, or whose GOGC changed), to the memory
// outside the heap plus the goal the new GOGC gives and a quarter of it
// more, or Slack more if that is more: never the binding goal while the
// live heap holds, so that a small heap's transfers run as they did
// (bench rows 3a-3d: the same CPU per run as without it), an absolute
// ceiling when it jumps, which a governor that is late only makes lower
// (the collector then runs sooner, its CPU capped by the runtime's
// limiter). A GOMEMLIMIT of the environment stays the ceiling.
type HeapConfig struct {
	// MaxPercent is GOGC while the live heap is small (default 400).
	MaxPercent int
	// MinPercent is the lowest GOGC it sets (default 100, the runtime's
	// default: past Slack, the garbage grows as the live heap does).
	MinPercent int
	// Slack is the garbage the collector may let build up between
	// cycles, as far as the two percentages allow (default 64 MiB).
	Slack uint64
	// Set sets GOGC and returns the previous value (debug.SetGCPercent).
	Set func(int) int
	// Live returns the live heap as the last cycle marked it.
	Live func() uint64
	// SetLimit sets the soft memory limit and returns the previous one
	// (debug.SetMemoryLimit; a negative value only reads it).
	SetLimit func(int64) int64
	// NonHeap returns the runtime's memory outside the heap that counts
	// towards the limit (MemoryOutsideHeap).
	NonHeap func() uint64
	Log     *slog.Logger
}

// HeapGovernor sets GOGC after each garbage collection from the heap
// that cycle found live.
type HeapGovernor struct {
	cfg     HeapConfig
	percent int
	ceiling int64  // the limit found at Run (GOMEMLIMIT; math.MaxInt64: none)
	limit   int64  // the limit last set
	limLive uint64 // the live heap it was set for
	limPct  int    // and the GOGC
}

// NewHeap returns a HeapGovernor with cfg's defaults filled in.
func NewHeap(cfg HeapConfig) *HeapGovernor {
	if cfg.MaxPercent <= 0 {
		cfg.MaxPercent = 400
	}
	if cfg.MinPercent <= 0 {
		cfg.MinPercent = 100
	}
	cfg.MinPercent = min(cfg.MinPercent, cfg.MaxPercent)
	if cfg.Slack == 0 {
		cfg.Slack = 64 << 20
	}
	if cfg.Set == nil {
		cfg.Set = debug.SetGCPercent
	}
	if cfg.Live == nil {
		cfg.Live = liveHeap
	}
	if cfg.SetLimit == nil {
		cfg.SetLimit = debug.SetMemoryLimit
	}
	if cfg.NonHeap == nil {
		cfg.NonHeap = MemoryOutsideHeap
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &HeapGovernor{cfg: cfg}
}

// PercentFor is the GOGC for a live heap of live bytes: Slack as a share
// of it, between MinPercent and MaxPercent.
func (h *HeapGovernor) PercentFor(live uint64) int {
	if live == 0 {
		return h.cfg.MaxPercent
	}
	p := h.cfg.Slack * 100 / live
	return int(min(max(p, uint64(h.cfg.MinPercent)), uint64(h.cfg.MaxPercent)))
}

// LimitFor is the memory limit for a live heap of live bytes under
// GOGC percent, with nonHeap bytes outside the heap: the heap goal that
// percent gives, a quarter of it or slack more (the larger), and
// nonHeap; at most ceiling.
func LimitFor(live uint64, percent int, slack, nonHeap uint64, ceiling int64) int64 {
	goal := live + live*uint64(percent)/100
	l := nonHeap + goal + max(goal/4, slack)
	if l >= uint64(ceiling) {
		return ceiling
	}
	return int64(l)
}

// Run sets GOGC to MaxPercent, then after every collection GOGC and the
// memory limit to what the live heap asks, until ctx ends; then it puts
// back the GOGC and the limit it found.
func (h *HeapGovernor) Run(ctx context.Context) {
	h.percent = h.cfg.MaxPercent
	before := h.cfg.Set(h.percent)
	defer h.cfg.Set(before)
	h.ceiling = h.cfg.SetLimit(-1)
	h.limit = h.ceiling
	defer func() {
		if h.limit != h.ceiling {
			h.cfg.SetLimit(h.ceiling)
		}
	}()
	cycles := make(chan struct{}, 1)
	stop := make(chan struct{})
	defer close(stop)
	armCycleSignal(cycles, stop)
	for {
		select {
		case <-ctx.Done():
			return
		case <-cycles:
			h.step()
		}
	}
}

// step sets GOGC for the live heap the last cycle found, when it moved
// by more than a tenth (each change is a cheap call, but no need), and
// the memory limit for it (LimitFor), when the live heap moved by more
// than a sixteenth since the last or GOGC changed.
func (h *HeapGovernor) step() {
	live := h.cfg.Live()
	p := h.PercentFor(live)
	if p != h.percent && (p <= h.percent*9/10 || p >= h.percent*11/10 || p == h.cfg.MinPercent || p == h.cfg.MaxPercent) {
		h.percent = p
		h.cfg.Set(p)
		h.cfg.Log.Debug("gc_percent", "percent", p)
	}
	if live == 0 {
		return // no cycle has marked anything yet
	}
	d := max(live, h.limLive) - min(live, h.limLive)
	if h.limLive != 0 && h.limPct == h.percent && d <= h.limLive/16 {
		return
	}
	h.limLive, h.limPct = live, h.percent
	if l := LimitFor(live, h.percent, h.cfg.Slack, h.cfg.NonHeap(), h.ceiling); l != h.limit {
		h.limit = l
		h.cfg.SetLimit(l)
	}
}

// cycleSentinel is garbage the collector finds in each cycle: its
// cleanup signals the cycle and makes the next one.
type cycleSentinel struct{ _ [16]byte }

// armCycleSignal makes a sentinel whose cleanup, run after the
// collection that frees it, sends on cycles (without blocking) and arms
// the next one, until stop is closed.
func armCycleSignal(cycles chan<- struct{}, stop <-chan struct{}) {
	s := new(cycleSentinel)
	runtime.AddCleanup(s, func(struct{}) {
		select {
		case <-stop:
			return
		default:
		}
		select {
		case cycles <- struct{}{}:
		default:
		}
		armCycleSignal(cycles, stop)
	}, struct{}{})
}

// MemoryOutsideHeap is the runtime's memory that counts towards its
// memory limit and is no heap span's: goroutine stacks, the runtime's
// metadata, profiling buckets and the like (/memory/classes/total less
// the heap's objects, unused and free bytes and what was released).
func MemoryOutsideHeap() uint64 {
	s := []metrics.Sample{
		{Name: "/memory/classes/total:bytes"},
		{Name: "/memory/classes/heap/released:bytes"},
		{Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/memory/classes/heap/unused:bytes"},
		{Name: "/memory/classes/heap/free:bytes"},
	}
	metrics.Read(s)
	var v [5]uint64
	for i := range s {
		if s[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		v[i] = s[i].Value.Uint64()
	}
	heap := v[1] + v[2] + v[3] + v[4]
	if heap > v[0] {
		return 0
	}
	return v[0] - heap
}

// noLimit is the runtime's memory limit when none is set.
const noLimit = math.MaxInt64

// liveHeap is the heap the last collection marked live
// (/gc/heap/live:bytes).
func liveHeap() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}
