package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// errStalled is the cause a plain http:// exchange's context ends with
// when its stall watchdog closed it.
var errStalled = errors.New("no byte moved either way")

// clientConnKey is the context key of the accepted connection a request
// came on (http.Server.ConnContext).
type clientConnKey struct{}

// stallWatch closes a plain http:// exchange in which no byte moved
// either way (request body, response headers, response body) for limit,
// as the idle watchdog closes a CONNECT tunnel: an upstream that never
// answers, or stops mid-body, a sandbox that stops sending its body or
// reading the answer, hold the exchange's descriptors no longer.
type stallWatch struct {
	last    atomic.Int64 // unix nanoseconds: when a byte last moved
	limit   time.Duration
	onStall func()

	mu      sync.Mutex
	timer   *time.Timer
	stopped bool
}

// watchStall starts a watchdog that calls onStall once, when nothing was
// touched for limit.
func watchStall(limit time.Duration, onStall func()) *stallWatch {
	w := &stallWatch{limit: limit, onStall: onStall}
	w.touch()
	w.mu.Lock()
	w.timer = time.AfterFunc(limit, w.check)
	w.mu.Unlock()
	return w
}

// touch notes that bytes moved.
func (w *stallWatch) touch() { w.last.Store(time.Now().UnixNano()) }

func (w *stallWatch) check() {
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		return
	}
	if idle := time.Since(time.Unix(0, w.last.Load())); idle < w.limit {
		w.timer.Reset(w.limit - idle)
		w.mu.Unlock()
		return
	}
	w.stopped = true
	w.mu.Unlock()
	w.onStall()
}

// stop turns the watchdog off.
func (w *stallWatch) stop() {
	w.mu.Lock()
	w.stopped = true
	w.timer.Stop()
	w.mu.Unlock()
}

// plainStall puts a plain http:// exchange of r under a stall watchdog of
// the session's IdleTimeout. It returns the context to forward the request
// on, the watchdog (touch it as bytes move; mark responded once the
// upstream's answer started) and a stop to defer. On a stall the context
// ends with errStalled, blocked reads of the sandbox's request end, and,
// once the answer has started, the sandbox's connection is closed (which
// ends a write to a sandbox that reads nothing).
func (s *Session) plainStall(r *http.Request, rec *record, target string) (context.Context, *plainExchange, func()) {
	ctx, cancel := context.WithCancelCause(r.Context())
	conn, _ := r.Context().Value(clientConnKey{}).(net.Conn)
	x := &plainExchange{}
	limit := s.p.cfg.IdleTimeout
	x.w = watchStall(limit, func() {
		rec.fail(fmt.Sprintf("closed: no byte moved for %v", limit))
		s.log.Info("egress: plain http exchange stalled", "target", target, "idle", limit)
		cancel(errStalled)
		if conn != nil {
			conn.SetReadDeadline(time.Now())
			if x.responded.Load() {
				conn.Close()
			}
		}
	})
	return ctx, x, func() { x.w.stop(); cancel(nil) }
}

// plainExchange is a plain http:// exchange's watchdog and whether its
// answer started.
type plainExchange struct {
	w         *stallWatch
	responded atomic.Bool
}
