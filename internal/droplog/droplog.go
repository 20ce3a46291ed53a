// Package droplog logs the drops of a bound in bursts (gateway process):
// the first drop at once, then, at the end of each window that saw more,
// one line with their true count, so a burst of 248 drops is never logged
// as its first one alone.
package droplog

import (
	"sync"
	"time"
)

// DefaultWindow is the least time between two lines of one Counter.
const DefaultWindow = 10 * time.Second

// Counter counts drops and calls its emit function with the number to
// report: once at the first drop, then at the end of every window in
// which more came.
type Counter struct {
	window time.Duration
	emit   func(dropped int)

	mu      sync.Mutex
	pending int         // drops since the last line
	timer   *time.Timer // the open window; nil when none is
	stopped bool
}

// New returns a Counter that calls emit, outside its lock, with the drops
// to report; window <= 0 is DefaultWindow.
func New(window time.Duration, emit func(dropped int)) *Counter {
	if window <= 0 {
		window = DefaultWindow
	}
	return &Counter{window: window, emit: emit}
}

// Drop counts n drops (n > 0): the first of a quiet spell is reported at
// once, the rest at the end of the window.
func (c *Counter) Drop(n int) {
	if n <= 0 {
		return
	}
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return
	}
	if c.timer != nil {
		c.pending += n
		c.mu.Unlock()
		return
	}
	c.timer = time.AfterFunc(c.window, c.flush)
	c.mu.Unlock()
	c.emit(n)
}

// flush ends a window: it reports the drops counted in it, and opens
// another if there were any.
func (c *Counter) flush() {
	c.mu.Lock()
	n := c.pending
	c.pending = 0
	if n == 0 || c.stopped {
		c.timer = nil
		c.mu.Unlock()
		return
	}
	c.timer = time.AfterFunc(c.window, c.flush)
	c.mu.Unlock()
	c.emit(n)
}

// Stop reports the drops still pending and ends the Counter: later drops
// are not reported.
func (c *Counter) Stop() {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return
	}
	c.stopped = true
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
	n := c.pending
	c.pending = 0
	c.mu.Unlock()
	if n > 0 {
		c.emit(n)
	}
}
