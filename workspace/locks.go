package workspace

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"sync"
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

// claims says who holds a named workspace: the sessions of this gateway
// (holders), and, with Locks (a cluster), the reservations made through
// them, each let go once the workspace's last sync is in the object
// store. It asks the push queue whether a workspace waits for the pusher
// (queued), while holding its own lock.
type claims struct {
	log    *slog.Logger
	queued func(key string) bool

	mu       sync.Mutex
	locks    Locks              // cluster-wide reservations, or nil; set before use
	holders  map[string]string  // doc key of a named workspace -> session holding it
	reserved map[string]release // session -> its reservation through locks
	releases map[string]release // doc key -> reservation let go once it is pushed
	tidyDue  bool               // a release (or renewal) through locks failed
	tidyWake chan struct{}      // tidyDue was set
}

func newClaims(log *slog.Logger, queued func(string) bool) *claims {
	return &claims{log: log, queued: queued, holders: map[string]string{}, reserved: map[string]release{},
		releases: map[string]release{}, tidyWake: make(chan struct{}, 1)}
}

// SetLocks makes the Service reserve named workspaces through l too
// (cluster mode). Call it before the Service is used, and before Run: it
// renews the reservations of workspaces an earlier run left queued for
// the pusher (released once pushed), and lets go of the others that no
// live session holds. Failing, Run tries again.
func (s *Service) SetLocks(l Locks) {
	s.claims.locks = l
	s.tidy(context.Background())
}

// clustered says whether named workspaces are reserved across a cluster.
func (c *claims) clustered() bool { return c.locks != nil }

// holder is the session of this gateway holding key ("": none).
func (c *claims) holder(key string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.holders[key]
}

// hold makes session key's holder here, unless another session holds it.
func (c *claims) hold(key, session string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if h := c.holders[key]; h != "" && h != session {
		return false
	}
	c.holders[key] = session
	return true
}

// heldBy lists the keys session holds here.
func (c *claims) heldBy(session string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var held []string
	for k, h := range c.holders {
		if h == session {
			held = append(held, k)
		}
	}
	return held
}

// letGo ends session's hold of the keys held (those it still holds), and
// takes its reservation through Locks, which the caller lets go.
func (c *claims) letGo(session string, held []string) (release, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range held {
		if c.holders[k] == session {
			delete(c.holders, k)
		}
	}
	r, claimed := c.reserved[session]
	delete(c.reserved, session)
	return r, claimed
}

// tidy has the Locks renew what this gateway still needs reserved and let
// go of the rest (Locks.Tidy); a failure is retried by tidyLoop.
func (c *claims) tidy(ctx context.Context) bool {
	if c.locks == nil {
		return true
	}
	c.mu.Lock()
	c.tidyDue = false
	c.mu.Unlock()
	if err := c.locks.Tidy(ctx, c.keepClaim); err != nil {
		c.log.Warn("workspace_claims_tidy_failed", "err", err)
		c.retryTidy()
		return false
	}
	return true
}

// retryTidy marks a reservation as not let go (or not renewed): tidyLoop
// tries again.
func (c *claims) retryTidy() {
	c.mu.Lock()
	c.tidyDue = true
	c.mu.Unlock()
	select {
	case c.tidyWake <- struct{}{}:
	default:
	}
}

// keepClaim says whether session's reservation of tenant's workspace name
// is still needed here: the session holds it on this gateway, or the
// workspace's last sync waits for the pusher (the reservation is then let
// go once it is pushed).
func (c *claims) keepClaim(tenant, name, session string) bool {
	key := workspaceKey(tenant, name)
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.reserved[session]; ok || c.holders[key] == session {
		return true
	}
	if !c.queued(key) {
		return c.releases[key].session == session // let go when pushed
	}
	if _, ok := c.releases[key]; !ok {
		c.releases[key] = release{tenant, name, session}
	}
	return true
}

// tidyLoop retries a failed release (or renewal), with backoff, and goes
// through the reservations each interval anyway, until ctx is done.
func (c *claims) tidyLoop(ctx context.Context, interval time.Duration) {
	backoff := time.Duration(0)
	for {
		wait := interval
		c.mu.Lock()
		due := c.tidyDue
		c.mu.Unlock()
		if due {
			backoff = min(max(2*backoff, minBackoff), maxBackoff)
			wait = backoff
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-c.tidyWake:
			t.Stop()
			continue // the backoff is waited out from the top
		case <-t.C:
		}
		if c.tidy(ctx) {
			backoff = 0
		}
	}
}

// acquire reserves ref's workspace cluster-wide for session, after the
// local reservation; a refusal undoes the local one.
func (c *claims) acquire(ctx context.Context, tenant, name, key, session string) error {
	if c.locks == nil {
		return nil
	}
	if err := c.locks.Acquire(ctx, tenant, name, session); err != nil {
		c.mu.Lock()
		if c.holders[key] == session {
			delete(c.holders, key)
		}
		c.mu.Unlock()
		return err
	}
	c.mu.Lock()
	c.reserved[session] = release{tenant, name, session}
	if c.releases[key].session == session {
		delete(c.releases, key) // a restored session holds it again
	}
	c.mu.Unlock()
	return nil
}

// releaseWhenPushed lets go of session's reservation of key now, or,
// when the key still waits for the pusher, once it has been pushed.
func (c *claims) releaseWhenPushed(ctx context.Context, key string, r release) {
	if c.locks == nil {
		return
	}
	c.mu.Lock()
	queued := c.queued(key)
	if queued {
		c.releases[key] = r
	}
	c.mu.Unlock()
	if !queued {
		c.release(ctx, r)
	}
}

// pushed is called by the pusher once key is in the object store (or
// deleted there): a reservation waiting for it is let go.
func (c *claims) pushed(ctx context.Context, key string) {
	c.mu.Lock()
	r, ok := c.releases[key]
	queued := c.queued(key)
	if ok && !queued {
		delete(c.releases, key)
	}
	c.mu.Unlock()
	if ok && !queued && c.locks != nil {
		c.release(context.WithoutCancel(ctx), r)
	}
}

// release lets go of r; a failure is retried (tidyLoop), else the
// reservation would hold while this gateway runs.
func (c *claims) release(ctx context.Context, r release) {
	if err := c.locks.Release(ctx, r.tenant, r.name, r.session); err != nil {
		c.retryTidy()
	}
}

// heldElsewhere is the session another gateway's reservation of key
// names ("": none, or no Locks).
func (c *claims) heldElsewhere(ctx context.Context, tenant, name string) (string, error) {
	if c.locks == nil {
		return "", nil
	}
	return c.locks.Holder(ctx, tenant, name)
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
func (c *claims) stillHeld(ctx context.Context, session string, a *attachment) bool {
	if c.locks == nil {
		return true
	}
	h, err := c.locks.Holder(ctx, a.tenant, a.name)
	return err != nil || h == "" || h == session
}
