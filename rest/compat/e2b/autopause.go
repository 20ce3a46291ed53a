package e2b

import (
	"context"
	"sync"
	"time"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/rest/compat/e2b/e2bmeta"
)

// A sandbox created with autoPause pauses at its timeout instead of
// ending, as E2B's do: its session gets sandgate's longest TTL (it ends
// then, paused or not), and a timer here stops it at the E2B timeout.
// Setting the timeout, connecting or resuming sets the timer again (and
// the TTL to the longest again). The timers live in this gateway's memory:
// after a restart such a sandbox runs until its TTL, unpaused, unless a
// call sets its timeout again.

// autoPauses are the pending pauses, by session id.
type autoPauses struct {
	mu sync.Mutex
	m  map[string]*autoPause
}

// autoPause is one sandbox's pending pause.
type autoPause struct {
	timer      *time.Timer
	at         time.Time
	unregister func() // from the session's end (gateway.Session.AddConn)
}

// schedule makes s pause in d, in place of any pause pending. A session
// that ends or stops first takes its pause with it.
func (a *api) schedulePause(s *gateway.Session, d time.Duration) {
	ps := &a.pauses
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if old := ps.m[s.ID]; old != nil {
		old.timer.Stop()
		old.unregister()
		delete(ps.m, s.ID)
	}
	p := &autoPause{at: time.Now().Add(d)}
	unregister, ok := s.AddConn(func() { a.cancelPause(s.ID, p) })
	if !ok {
		return // ended
	}
	p.unregister = unregister
	p.timer = time.AfterFunc(d, func() { a.autoPause(s, p) })
	if ps.m == nil {
		ps.m = map[string]*autoPause{}
	}
	ps.m[s.ID] = p
}

// cancelPause drops session id's pending pause p (nil: whichever).
func (a *api) cancelPause(id string, p *autoPause) {
	ps := &a.pauses
	ps.mu.Lock()
	defer ps.mu.Unlock()
	cur := ps.m[id]
	if cur == nil || p != nil && cur != p {
		return
	}
	cur.timer.Stop()
	cur.unregister()
	delete(ps.m, id)
}

// pauseAt is when session id pauses, if it has a pause pending.
func (a *api) pauseAt(id string) (time.Time, bool) {
	ps := &a.pauses
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if p := ps.m[id]; p != nil {
		return p.at, true
	}
	return time.Time{}, false
}

// resumeCheck is how often pauseOnResume looks at a stopped autoPause
// sandbox while a sandbox URL call runs.
const resumeCheck = 100 * time.Millisecond

// pauseOnResume schedules stopped autoPause sandbox s's pause, at its
// create's timeout, once a sandbox URL call (ctx) resumes it: an envd
// process, a kernel, a file call with Resume starts it again as a
// connect would, and it must pause again as after a connect.
func (a *api) pauseOnResume(ctx context.Context, s *gateway.Session, rec e2bmeta.Record) {
	t := time.NewTicker(resumeCheck)
	defer t.Stop()
	for isPaused(s.Status()) {
		select {
		case <-ctx.Done():
			if isPaused(s.Status()) {
				return
			}
		case <-t.C:
		}
	}
	if !s.Live() {
		return
	}
	if _, ok := a.pauseAt(s.ID); ok {
		return // a connect or a timeout set it meanwhile
	}
	timeout := rec.Timeout
	if timeout <= 0 {
		timeout = defaultTimeout
	}
	a.schedulePause(s, time.Duration(min(timeout, gateway.MaxTTL))*time.Second)
}

// autoPause stops s, its timeout reached (p's timer).
func (a *api) autoPause(s *gateway.Session, p *autoPause) {
	ps := &a.pauses
	ps.mu.Lock()
	if ps.m[s.ID] != p {
		ps.mu.Unlock()
		return // set again, or cancelled, meanwhile
	}
	delete(ps.m, s.ID)
	ps.mu.Unlock()
	p.unregister()
	ctx := context.Background()
	if err := a.park(ctx, gateway.Principal{Tenant: s.Tenant, Method: "e2b_auto_pause"}, s.ID); err != nil {
		a.d.Log.Info("e2b_auto_pause_failed", "session", s.ID, "err", err)
		return
	}
	a.d.Log.Info("e2b_sandbox_auto_paused", "session", s.ID, "tenant", s.Tenant)
}
