package sandbox

import (
	"context"
	"sync"
	"time"
)

// Trace times the steps of one create: the gateway and the driver mark
// each step as it ends, on the monotonic clock. It travels in the
// create's context (WithTrace), so there is one per create and no global
// state; a nil *Trace (a context without one) marks nothing.
//
// The REST API shows it as the Server-Timing header of POST /v1/sessions,
// and bench row 5b reads that header.
type Trace struct {
	mu    sync.Mutex
	start time.Time
	last  time.Time
	steps []Step
}

// Step is one timed step of a create.
type Step struct {
	Name string
	Dur  time.Duration
}

// NewTrace returns a trace whose first step starts now.
func NewTrace() *Trace {
	now := time.Now()
	return &Trace{start: now, last: now}
}

// Mark ends the step name now: its duration is the time since the
// previous Mark (or since NewTrace).
func (t *Trace) Mark(name string) {
	if t == nil {
		return
	}
	now := time.Now()
	t.mu.Lock()
	t.steps = append(t.steps, Step{Name: name, Dur: now.Sub(t.last)})
	t.last = now
	t.mu.Unlock()
}

// Add records a step timed elsewhere (concurrently with others, or by the
// sandbox's init): it does not move the clock of Mark.
func (t *Trace) Add(name string, d time.Duration) {
	if t == nil {
		return
	}
	t.mu.Lock()
	t.steps = append(t.steps, Step{Name: name, Dur: d})
	t.mu.Unlock()
}

// Steps returns the steps recorded so far, in the order they were
// recorded, and the time since NewTrace.
func (t *Trace) Steps() ([]Step, time.Duration) {
	if t == nil {
		return nil, 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]Step(nil), t.steps...), time.Since(t.start)
}

type traceKey struct{}

// WithTrace returns ctx carrying t.
func WithTrace(ctx context.Context, t *Trace) context.Context {
	return context.WithValue(ctx, traceKey{}, t)
}

// TraceOf returns the trace ctx carries, or nil.
func TraceOf(ctx context.Context) *Trace {
	t, _ := ctx.Value(traceKey{}).(*Trace)
	return t
}
