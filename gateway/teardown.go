package gateway

import (
	"time"

	"github.com/sandgate/sandgate/sandbox"
)

// A deleted session's sandbox is released in the background (end, with a
// slot of Config.TeardownQueue). During a burst of creates that release
// waits: a teardown (the init's exit, namespaces, cgroups, the workspace's
// unmount and loop device, the directory) costs as much CPU as a couple of
// claims, and on a small host it would delay the creates and the warm
// pool's refill that the burst is waiting for (issue 41, row 11e). The
// session's processes end at once all the same (sandbox.Halter): only the
// release of what they leave is deferred. A sandbox that is no Halter is
// never deferred: its processes would run on until its release.
//
// A deferred release starts once no create has run for teardownQuiet, or
// teardownMaxDelay after its Delete, or at once when more than three
// quarters of the queue's slots are taken (the oldest first), or when
// Shutdown begins. DELETE's answer is unchanged, and a restart finishes
// what was left: the session's record is gone before its release is
// queued, and Restore removes any sandbox without one.
const (
	teardownQuiet    = 20 * time.Millisecond
	teardownMaxDelay = 2 * time.Second
)

// deferredRelease is a release waiting for the creates to pause.
type deferredRelease struct {
	run func()
	at  time.Time
}

// createActivity marks a create starting or ending now (creating counts
// those under way): the deferred releases wait while there are some.
func (m *Manager) createActivity(start bool) {
	if start {
		m.creating.Add(1)
	} else {
		m.creating.Add(-1)
	}
	m.lastCreate.Store(time.Now().UnixNano())
}

// deferRelease queues run, a sandbox's release holding a slot of
// m.releasing, behind the creates under way (runReleases).
func (m *Manager) deferRelease(run func()) {
	m.tdMu.Lock()
	m.tdQueue = append(m.tdQueue, deferredRelease{run, time.Now()})
	start := !m.tdRunning
	m.tdRunning = true
	m.tdMu.Unlock()
	if start {
		go m.runReleases()
	}
}

// kickReleases wakes runReleases (Shutdown: every deferred release starts).
func (m *Manager) kickReleases() {
	select {
	case m.tdKick <- struct{}{}:
	default:
	}
}

// runReleases starts the deferred releases as releaseWait allows, oldest
// first, each in its own goroutine, and returns once none is left.
func (m *Manager) runReleases() {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		m.mu.Lock()
		stopping := m.stopping
		m.mu.Unlock()
		m.tdMu.Lock()
		if len(m.tdQueue) == 0 {
			m.tdRunning = false
			m.tdMu.Unlock()
			return
		}
		wait := time.Duration(0)
		if !stopping {
			wait = m.releaseWait(time.Now(), m.tdQueue[0].at, len(m.tdQueue))
		}
		var next deferredRelease
		if wait <= 0 {
			next = m.tdQueue[0]
			m.tdQueue[0] = deferredRelease{}
			m.tdQueue = m.tdQueue[1:]
		}
		m.tdMu.Unlock()
		if wait <= 0 {
			go next.run()
			continue
		}
		t.Reset(wait)
		select {
		case <-t.C:
		case <-m.tdKick:
			if !t.Stop() {
				<-t.C
			}
		}
	}
}

// releaseWait is how long the oldest deferred release, queued at oldest,
// still waits at now, with queued of them waiting (≤ 0: it starts now).
func (m *Manager) releaseWait(now, oldest time.Time, queued int) time.Duration {
	if queued > cap(m.releasing)*3/4 {
		return 0
	}
	limit := oldest.Add(teardownMaxDelay).Sub(now)
	if limit <= 0 {
		return 0
	}
	if m.creating.Load() > 0 {
		return min(teardownQuiet, limit)
	}
	quiet := time.Unix(0, m.lastCreate.Load()).Add(teardownQuiet).Sub(now)
	return min(quiet, limit)
}

// halt ends the processes of sb at once, when its driver can apart from
// its release (sandbox.Halter), and reports whether it could: only then
// may the release wait.
func halt(sb sandbox.Sandbox) bool {
	h, ok := sb.(sandbox.Halter)
	if ok {
		h.Halt()
	}
	return ok
}
