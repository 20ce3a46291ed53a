package gateway

import (
	"context"
	"errors"

	"github.com/sandgate/sandgate/sandbox"
)

// A stopped session (StatusStopped) keeps its sandbox's files but has no
// process, and so no memory or CPU: Manager.Stop stops it, and the next
// process started through Session.Sandbox (an SSH exec or shell, a CONNECT
// tunnel's, a REST command or kernel call) resumes it first. It counts as
// live: it takes its place in the quotas, keeps accepting connections,
// and its TTL and idle limit still run.

// Stop stops p's session id: every process of it ends, its connections
// close, and its files stay (sandbox.Stopper). Stopping a stopped session
// does nothing. Another tenant's session is ErrNotFound; a failed one is
// session_not_running.
func (m *Manager) Stop(ctx context.Context, p Principal, id string) (*Session, error) {
	s, err := m.Get(ctx, p, id)
	if err != nil {
		return nil, err
	}
	s.life.Lock()
	defer s.life.Unlock()
	switch status := s.Status(); status {
	case StatusStopped:
		return s, nil
	case StatusRunning, StatusPaused: // the kill thaws a paused one
	default:
		if status == StatusFailed {
			return nil, errNotRunning()
		}
		return nil, ErrNotFound // ended since the lookup
	}
	st, ok := s.sandbox.(sandbox.Stopper)
	if !ok {
		return nil, Invalid("stop_unsupported", "this sandbox driver cannot stop sessions")
	}
	if !s.markStopped() {
		return nil, ErrNotFound
	}
	if err := st.Stop(context.WithoutCancel(ctx)); err != nil {
		// The sandbox is half stopped; the next process's resume builds
		// it again.
		m.log.Error("sandbox_stop_failed", "session", s.ID, "err", err)
		return nil, &Error{Kind: KindInternal, Code: "sandbox_failed", Message: "could not stop the sandbox", Err: err}
	}
	if err := m.putManaged(s); err != nil {
		return nil, err
	}
	m.log.InfoContext(ctx, "session_stopped", "session", s.ID, "tenant", p.Tenant)
	m.auditSession(ctx, s, "stopped", "", p.Tenant)
	return s, nil
}

// errNotRunning is the answer for a failed session.
func errNotRunning() error {
	return &Error{Kind: KindConflict, Code: "session_not_running", Message: "the session is not running; delete it"}
}

// markStopped makes a running session stopped: its connections close (the
// processes they serve are about to die) and its egress proxy, whose
// listener lives in the sandbox's network, stops. It reports false when
// the session is not running.
func (s *Session) markStopped() bool {
	s.mu.Lock()
	if s.status != StatusRunning && s.status != StatusPaused {
		s.mu.Unlock()
		return false
	}
	s.status = StatusStopped
	conns := s.conns
	s.conns = map[*connEntry]struct{}{}
	s.mu.Unlock()
	for e := range conns {
		if !e.notice && !e.pauseOnly { // a pause's notice says "paused": not this
			e.close()
		}
	}
	s.closeProxy()
	return true
}

// putManaged records s, unless it is no longer the manager's (a Delete or
// the reaper took it, and owns its record).
func (m *Manager) putManaged(s *Session) error {
	m.writeMu.Lock()
	defer m.writeMu.Unlock()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.sessions[s.ID] != s {
		return nil
	}
	if err := m.cfg.Store.Put(s.Snapshot()); err != nil {
		m.log.Error("store_failed", "session", s.ID, "err", err)
		return storeError(err)
	}
	return nil
}

// running waits until s is not stopped, resuming it if need be (and
// resume allows), and returns with s.life held to read (unlock releases
// it): s does not stop until the caller has started its process.
func (s *Session) running(ctx context.Context, resume bool) (unlock func(), err error) {
	for {
		s.life.RLock()
		status := s.Status()
		if status != StatusStopped && status != StatusPaused {
			return s.life.RUnlock, nil
		}
		s.life.RUnlock()
		if !resume || status == StatusStopped && s.resume == nil {
			return nil, sandbox.ErrStopped
		}
		s.life.Lock()
		switch s.Status() {
		case StatusStopped:
			err = s.resume(ctx)
		case StatusPaused:
			err = s.unpauseLocked(ctx)
		}
		s.life.Unlock()
		if err != nil {
			return nil, err
		}
	}
}

// resume starts stopped session s again: its sandbox (same files, new
// processes), then its egress proxy. s.life is held. It is the session's
// resume (hold).
func (m *Manager) resume(ctx context.Context, s *Session) error {
	st, ok := s.sandbox.(sandbox.Stopper)
	if !ok {
		return sandbox.ErrStopped
	}
	if err := st.Resume(ctx); err != nil {
		m.log.Error("sandbox_resume_failed", "session", s.ID, "err", err)
		if errors.Is(err, sandbox.ErrClosed) {
			return err
		}
		return &Error{Kind: KindUnavailable, Code: "sandbox_failed", Message: "could not start the stopped session again", Err: err}
	}
	s.mu.Lock()
	resumed := s.status == StatusStopped
	if resumed {
		s.status = StatusRunning
	}
	s.mu.Unlock()
	if !resumed { // ended meanwhile: Destroy ends the new processes
		return sandbox.ErrClosed
	}
	if s.needsProxy() {
		if err := m.openProxy(ctx, s); err != nil {
			m.log.Error("egress_proxy_failed", "session", s.ID, "err", err)
		}
	}
	if err := m.putManaged(s); err != nil {
		return err
	}
	m.log.InfoContext(ctx, "session_resumed", "session", s.ID, "tenant", s.Tenant)
	m.auditSession(ctx, s, "resumed", "", "")
	return nil
}

// storeError is the answer to a change the store could not record: the
// store's own refusal when it names one (a cluster store without etcd
// quorum answers cluster_unavailable, as for a create), store_failed
// otherwise.
func storeError(err error) error {
	if ge, ok := errors.AsType[*Error](err); ok {
		return ge
	}
	return &Error{Kind: KindUnavailable, Code: "store_failed", Message: "could not record the change", Err: err}
}
