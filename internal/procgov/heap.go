package procgov

import (
	"context"
	"log/slog"
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
	Log  *slog.Logger
}

// HeapGovernor sets GOGC after each garbage collection from the heap
// that cycle found live.
type HeapGovernor struct {
	cfg     HeapConfig
	percent int
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

// Run sets GOGC to MaxPercent, then after every collection to what the
// live heap asks, until ctx ends; then it puts back the GOGC it found.
func (h *HeapGovernor) Run(ctx context.Context) {
	h.percent = h.cfg.MaxPercent
	before := h.cfg.Set(h.percent)
	defer h.cfg.Set(before)
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
// by more than a tenth (each change is a cheap call, but no need).
func (h *HeapGovernor) step() {
	p := h.PercentFor(h.cfg.Live())
	if p == h.percent || (p > h.percent*9/10 && p < h.percent*11/10 && p != h.cfg.MinPercent && p != h.cfg.MaxPercent) {
		return
	}
	h.percent = p
	h.cfg.Set(p)
	h.cfg.Log.Debug("gc_percent", "percent", p)
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
