package gateway

import (
	"context"
	"fmt"
	"sync"

	"github.com/sandgate/sandgate/egress"
	"github.com/sandgate/sandgate/sandbox"
)

// Restore loads the stored sessions after a restart: each live one whose
// sandbox still runs is re-attached; one whose sandbox is gone is marked
// failed with a reason; every sandbox without a live session is removed.
func (m *Manager) Restore(ctx context.Context) error {
	recs, err := m.cfg.Store.All()
	if err != nil {
		return fmt.Errorf("load sessions: %w", err)
	}
	if err := m.restoreTombstones(); err != nil {
		return err
	}
	ra, _ := m.driver.(sandbox.Reattacher)
	var present []string
	if ra != nil {
		if present, err = ra.List(ctx); err != nil {
			return fmt.Errorf("list sandboxes: %w", err)
		}
	}
	keep := map[string]bool{}
	var changed []Record
	restored, failed := 0, 0
	for _, r := range recs {
		s := sessionFromRecord(r)
		m.own(s)
		if live(r.Status) {
			reason := "the sandbox driver cannot re-attach sandboxes after a restart"
			if ra != nil {
				sb, err := ra.Adopt(ctx, r.ID)
				if err == nil {
					s.sandbox = sb
					keep[r.ID] = true
					restored++
					if m.restoreStopped(ctx, s) || m.restorePaused(ctx, s) {
						changed = append(changed, s.Snapshot())
					}
					m.restoreEgress(ctx, s)
					m.restoreWorkspace(ctx, s)
					m.watch(s)
				} else {
					reason = "sandbox lost across the gateway restart"
					m.log.Warn("sandbox_adopt_failed", "session", r.ID, "err", err)
				}
			}
			if s.sandbox == nil {
				m.releaseImage(s)
				s.status, s.statusReason = StatusFailed, reason
				changed = append(changed, s.Snapshot())
				failed++
				m.log.Warn("session_failed", "session", r.ID, "tenant", r.Tenant, "reason", reason)
				m.auditSession(ctx, s, "failed", reason, "")
			}
		}
		m.mu.Lock()
		m.sessions[s.ID] = s
		m.mu.Unlock()
	}
	if err := m.cfg.Store.Put(changed...); err != nil {
		return fmt.Errorf("record failed sessions: %w", err)
	}
	removed := 0
	for _, id := range present {
		if keep[id] {
			continue
		}
		if err := ra.Remove(ctx, id); err != nil {
			m.log.Error("sandbox_remove_failed", "sandbox", id, "err", err)
			continue
		}
		if m.cfg.ImageSource != nil {
			m.cfg.ImageSource.Release(id)
		}
		removed++
	}
	m.log.Info("sessions_restored", "restored", restored, "failed", failed, "orphans_removed", removed)
	return nil
}

// Shutdown is called when the gateway stops. With keep, sandboxes and
// records stay for the next process (activity times are saved first);
// otherwise every session ends and its sandbox is destroyed.
func (m *Manager) Shutdown(ctx context.Context, keep bool) {
	if keep {
		m.saveActivity()
	}
	m.mu.Lock()
	m.stopping = true
	all := m.sessions
	m.sessions = map[string]*Session{}
	m.mu.Unlock()
	m.kickReleases()   // the deferred ones start now
	if m.pool != nil { // warm sandboxes are no one's: none is kept
		m.pool.close(ctx)
	}
	m.imagePools.close(ctx)
	var wg sync.WaitGroup
	for _, s := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !keep {
				_ = m.end(ctx, s, GoneShutdown, nil, StatusDeleted, "gateway shut down")
				return
			}
			s.closeProxy()
			if d, ok := s.sandbox.(sandbox.Detacher); ok {
				if err := d.Detach(ctx); err != nil {
					m.log.Error("sandbox_detach_failed", "session", s.ID, "err", err)
				}
			}
		}()
	}
	wg.Wait()
	m.released.Wait()   // sandboxes being released in the background
	m.retryDestroy(ctx) // deleted sessions end for good, whatever keep says
	if keep && len(all) > 0 {
		running := 0
		for _, s := range all {
			if _, ok := s.sandbox.(sandbox.Detacher); ok && s.Live() {
				running++
			}
		}
		m.log.Warn("sessions_kept", "count", len(all), "running", running,
			"hint", fmt.Sprintf("%d sessions are kept for the next sandgate serve on this data dir (%d sandboxes keep running, workspaces mounted); "+
				"to release them, start it again and delete them (sandgate session rm ID), or start and stop it once with --keep-sandboxes-on-exit=false", len(all), running))
	}
}

// restoreEgress gives a re-attached session its egress CA and proxy back.
// A failure leaves the session without egress (new connections through
// the old address are refused by the sandbox's kernel) and is logged.
func (m *Manager) restoreEgress(ctx context.Context, s *Session) {
	if len(s.egressCAPEM) > 0 {
		ca, err := egress.ParseCA(s.egressCAPEM, s.egressCAKey)
		if err != nil {
			m.log.Error("egress_restore_failed", "session", s.ID, "err", err)
			return
		}
		s.egressCA = ca
	}
	if !s.needsProxy() || s.Status() == StatusStopped || s.checkpointPaused() { // it opens when the session resumes
		return
	}
	if err := m.openProxy(ctx, s); err != nil {
		m.log.Error("egress_restore_failed", "session", s.ID, "err", err)
	}
}

// restoreStopped makes the status of re-attached session s and its
// sandbox agree: a stopped session's sandbox is stopped (workdir adopts
// its sandboxes without processes, and says so by being running), and a
// session whose stop a crash interrupted is stopped. It reports whether
// the status changed.
func (m *Manager) restoreStopped(ctx context.Context, s *Session) bool {
	st, ok := s.sandbox.(sandbox.Stopper)
	if !ok {
		return false
	}
	switch {
	case s.status == StatusStopped && !st.Stopped():
		if err := st.Stop(ctx); err != nil {
			m.log.Error("sandbox_stop_failed", "session", s.ID, "err", err)
		}
	case s.status == StatusRunning && st.Stopped():
		s.status = StatusStopped
		m.log.Warn("session_stopped", "session", s.ID, "reason", "its sandbox was stopped when the gateway went down")
		return true
	}
	return false
}
