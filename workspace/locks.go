package workspace

import (
	"context"
	"errors"
	"io/fs"
	"time"
)

// Locks makes "one live session holds a named workspace" hold across the
// gateways of a cluster that share one object store. Without Locks (one
// gateway) the Service's own holders are the only ones.
type Locks interface {
	// Acquire reserves tenant's workspace name for session; another
	// session holding it, on any gateway, is workspace_busy.
	Acquire(ctx context.Context, tenant, name, session string) error
	// Release lets go of session's reservation, if it still has it.
	Release(ctx context.Context, tenant, name, session string) error
	// Tidy goes through this gateway's reservations: one keep wants (or
	// whose session is live) is renewed to hold for this gateway's
	// current run, any other is let go.
	Tidy(ctx context.Context, keep func(tenant, name, session string) bool) error
	// Holder is the session holding tenant's workspace name ("": none).
	Holder(ctx context.Context, tenant, name string) (string, error)
}

// release is a reservation let go once its workspace's last sync is in
// the object store, so that another gateway never starts from less.
type release struct{ tenant, name, session string }

// SetLocks makes the Service reserve named workspaces through l too
// (cluster mode). Call it before the Service is used, and before Run: it
// renews the reservations of workspaces an earlier run left queued for
// the pusher (released once pushed), and lets go of the others that no
// live session holds. Failing, Run tries again.
func (s *Service) SetLocks(l Locks) {
	s.locks = l
	s.tidy(context.Background())
}

// tidy has the Locks renew what this gateway still needs reserved and let
// go of the rest (Locks.Tidy); a failure is retried by tidyLoop.
func (s *Service) tidy(ctx context.Context) bool {
	if s.locks == nil {
		return true
	}
	s.mu.Lock()
	s.tidyDue = false
	s.mu.Unlock()
	if err := s.locks.Tidy(ctx, s.keepClaim); err != nil {
		s.cfg.Log.Warn("workspace_claims_tidy_failed", "err", err)
		s.retryTidy()
		return false
	}
	return true
}

// retryTidy marks a reservation as not let go (or not renewed): tidyLoop
// tries again.
func (s *Service) retryTidy() {
	s.mu.Lock()
	s.tidyDue = true
	s.mu.Unlock()
	select {
	case s.tidyWake <- struct{}{}:
	default:
	}
}

// keepClaim says whether session's reservation of tenant's workspace name
// is still needed here: the session holds it on this gateway, or the
// workspace's last sync waits for the pusher (the reservation is then let
// go once it is pushed).
func (s *Service) keepClaim(tenant, name, session string) bool {
	key := workspaceKey(tenant, name)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.claims[session]; ok || s.holders[key] == session {
		return true
	}
	if _, queued := s.queue[key]; !queued {
		return s.releases[key].session == session // let go when pushed
	}
	if _, ok := s.releases[key]; !ok {
		s.releases[key] = release{tenant, name, session}
	}
	return true
}

// tidyLoop retries a failed release (or renewal), with backoff, and goes
// through the reservations each interval anyway, until ctx is done.
func (s *Service) tidyLoop(ctx context.Context, interval time.Duration) {
	backoff := time.Duration(0)
	for {
		wait := interval
		s.mu.Lock()
		due := s.tidyDue
		s.mu.Unlock()
		if due {
			backoff = min(max(2*backoff, minBackoff), maxBackoff)
			wait = backoff
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-s.tidyWake:
			t.Stop()
			continue // the backoff is waited out from the top
		case <-t.C:
		}
		if s.tidy(ctx) {
			backoff = 0
		}
	}
}

// acquire reserves ref's workspace cluster-wide for session, after the
// local reservation; a refusal undoes the local one.
func (s *Service) acquire(ctx context.Context, tenant, name, key, session string) error {
	if s.locks == nil {
		return nil
	}
	if err := s.locks.Acquire(ctx, tenant, name, session); err != nil {
		s.mu.Lock()
		if s.holders[key] == session {
			delete(s.holders, key)
		}
		s.mu.Unlock()
		return err
	}
	s.mu.Lock()
	s.claims[session] = release{tenant, name, session}
	if s.releases[key].session == session {
		delete(s.releases, key) // a restored session holds it again
	}
	s.mu.Unlock()
	return nil
}

// releaseWhenPushed lets go of session's reservation of key now, or,
// when the key still waits for the pusher, once it has been pushed.
func (s *Service) releaseWhenPushed(ctx context.Context, key string, r release) {
	if s.locks == nil {
		return
	}
	s.mu.Lock()
	_, queued := s.queue[key]
	if queued {
		s.releases[key] = r
	}
	s.mu.Unlock()
	if !queued {
		s.release(ctx, r)
	}
}

// pushed is called by the pusher once key is in the object store (or
// deleted there): a reservation waiting for it is let go.
func (s *Service) pushed(ctx context.Context, key string) {
	s.mu.Lock()
	r, ok := s.releases[key]
	_, queued := s.queue[key]
	if ok && !queued {
		delete(s.releases, key)
	}
	s.mu.Unlock()
	if ok && !queued && s.locks != nil {
		s.release(context.WithoutCancel(ctx), r)
	}
}

// release lets go of r; a failure is retried (tidyLoop), else the
// reservation would hold while this gateway runs.
func (s *Service) release(ctx context.Context, r release) {
	if err := s.locks.Release(ctx, r.tenant, r.name, r.session); err != nil {
		s.retryTidy()
	}
}

// heldElsewhere is the session another gateway's reservation of key
// names ("": none, or no Locks).
func (s *Service) heldElsewhere(ctx context.Context, tenant, name string) (string, error) {
	if s.locks == nil {
		return "", nil
	}
	return s.locks.Holder(ctx, tenant, name)
}

// pendingPush says whether key waits for the pusher: this gateway's copy
// is then newer than the object store's.
func (s *Service) pendingPush(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.queue[key]
	return ok
}

// readRemoteDoc reads key from the object store for readDoc, when it is
// the truth: gateways sharing it change its docs, so a local copy may be
// stale. It answers ok false when the local copy is to be read instead
// (key waits for the pusher, or the object store cannot be reached).
func (s *Service) readRemoteDoc(ctx context.Context, key string) (b []byte, ok bool, err error) {
	if s.cfg.Remote == nil || s.pendingPush(key) {
		return nil, false, nil
	}
	b, err = readAll(ctx, s.cfg.Remote, key)
	switch {
	case err == nil:
		return b, true, nil
	case errors.Is(err, fs.ErrNotExist):
		// Deleted (or never pushed and lost): the local copy goes too.
		if !s.pendingPush(key) {
			_ = s.local.Delete(ctx, key)
		}
		return nil, true, err
	default:
		s.cfg.Log.Warn("workspace_remote_read_failed", "key", key, "err", err)
		return nil, false, nil
	}
}

// stillHeld says whether session's reservation of a's workspace is still
// its own: a session whose create lost the workspace to another gateway
// must not write its copy over the winner's. Without Locks, or when the
// answer cannot be had, it is.
func (s *Service) stillHeld(ctx context.Context, session string, a *attachment) bool {
	if s.locks == nil {
		return true
	}
	h, err := s.locks.Holder(ctx, a.tenant, a.name)
	return err != nil || h == "" || h == session
}
