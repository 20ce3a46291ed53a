package gateway

import "time"

// Metrics receives the manager's events (internal/metrics implements it);
// Config.Metrics nil counts nothing. Calls must be cheap and must not block.
type Metrics interface {
	// SessionCreated: a create made a session, in d, its sandbox from
	// source (SandboxWarm, SandboxCold or SandboxFork).
	SessionCreated(d time.Duration, source string)
	// SessionDeleted: Delete ended a session.
	SessionDeleted()
	// SessionExpired: the reaper ended a session (reason ttl or idle).
	SessionExpired(reason string)
	// TeardownRetried: Run retried the destroy of a sandbox whose
	// destroy had failed; ok is whether it worked this time.
	TeardownRetried(ok bool)
	// CommandDone: a command the history records ended (source ssh or rest).
	CommandDone(source string, d time.Duration)
}

type noMetrics struct{}

func (noMetrics) SessionCreated(time.Duration, string) {}
func (noMetrics) SessionDeleted()                      {}
func (noMetrics) SessionExpired(string)                {}
func (noMetrics) TeardownRetried(bool)                 {}
func (noMetrics) CommandDone(string, time.Duration)    {}

// Where a created session's sandbox came from (Metrics.SessionCreated).
const (
	SandboxWarm = "warm" // claimed from a warm pool
	SandboxCold = "cold" // built for the create
	SandboxFork = "fork" // restored from a running session's checkpoint
)

// Teardowns counts the sandbox releases in the background (Config.
// TeardownQueue): deferred, waiting for the creates to pause
// (teardown.go), and running.
func (m *Manager) Teardowns() (deferred, running int) {
	m.tdMu.Lock()
	deferred = len(m.tdQueue)
	m.tdMu.Unlock()
	return deferred, max(len(m.releasing)-deferred, 0)
}

// metrics is where m's events go; safe on a nil Manager (sessions made
// by hand in tests have none).
func (m *Manager) metrics() Metrics {
	if m == nil || m.cfg.Metrics == nil {
		return noMetrics{}
	}
	return m.cfg.Metrics
}

// SessionsByStatus counts the sessions the manager holds, by status.
func (m *Manager) SessionsByStatus() map[string]int {
	m.mu.Lock()
	all := make([]*Session, 0, len(m.sessions))
	for _, s := range m.sessions {
		all = append(all, s)
	}
	m.mu.Unlock()
	out := map[string]int{}
	for _, s := range all {
		out[s.Status()]++
	}
	return out
}
