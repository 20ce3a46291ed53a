package gateway

import (
	"fmt"
	"sort"
	"sync"
	"time"
)

// Default bounds of tombstones (Config.TombstoneTTL, Config.MaxTombstones).
const (
	DefaultTombstoneTTL  = 24 * time.Hour
	DefaultMaxTombstones = 10000
)

// ErrGone is what errors.Is finds in the error of a lookup of a session
// that ended (deleted or expired) less than the tombstone TTL ago. The
// error itself is a *GoneError, which tells when and why.
const ErrGone Sentinel = "session_gone"

// Reasons a session is gone (Tombstone.Reason).
const (
	GoneDeleted  = "deleted"      // deleted by its tenant
	GoneTTL      = "ttl_expired"  // its ttl ran out
	GoneIdle     = "idle_expired" // idle for longer than the idle timeout
	GoneFailed   = "failed"       // it had failed when it ended
	GoneShutdown = "shutdown"     // the gateway stopped without keeping sessions
)

// Tombstone is what remains of an ended session for the tombstone TTL: a
// lookup of its id by its tenant answers session_gone with it.
type Tombstone struct {
	ID     string    `json:"id"`
	Tenant string    `json:"tenant"`
	Reason string    `json:"reason"` // one of the Gone* reasons
	At     time.Time `json:"at"`     // when the session ended
	// ByTenant and ByMethod are the principal that deleted the session.
	ByTenant string `json:"byTenant,omitempty"`
	ByMethod string `json:"byMethod,omitempty"`
	// Failure is why the session had failed, when it had.
	Failure string `json:"failure,omitempty"`
	// Image, CreatedAt, ExpiresAt and LastActivityAt are the session's
	// as it ended, so that an API can still describe it (Sandkasten's
	// session rows, docs/compat.md). Tombstones stored before they were
	// kept have them zero.
	Image          string    `json:"image,omitempty"`
	CreatedAt      time.Time `json:"createdAt,omitzero"`
	ExpiresAt      time.Time `json:"expiresAt,omitzero"`
	LastActivityAt time.Time `json:"lastActivityAt,omitzero"`
}

// Message is the tombstone in words: what ended the session, and when.
func (t Tombstone) Message() string {
	at := t.At.UTC().Format(time.RFC3339)
	var how string
	switch {
	case t.ByTenant != "":
		how = fmt.Sprintf("deleted at %s by tenant %q (%s)", at, t.ByTenant, t.ByMethod)
	case t.Reason == GoneTTL:
		how = "expired at " + at + ": its ttl ran out"
	case t.Reason == GoneIdle:
		how = "expired at " + at + ": idle for longer than the idle timeout"
	case t.Reason == GoneShutdown:
		how = "deleted at " + at + " when the gateway shut down"
	default:
		how = "ended at " + at
	}
	if t.Failure != "" {
		how += "; it had failed: " + t.Failure
	}
	return fmt.Sprintf("session %s is gone (reason: %s): %s", t.ID, t.Reason, how)
}

// GoneError is the error of a lookup of a tombstoned session. errors.Is
// finds ErrGone in it, and ErrNotFound too (a gone session is a missing
// one to callers that do not tell them apart); errors.As to a *Error
// yields a KindGone error with code session_gone.
type GoneError struct{ Tombstone Tombstone }

func (e *GoneError) Error() string { return e.Tombstone.Message() }

// Is reports whether target is ErrGone or ErrNotFound.
func (e *GoneError) Is(target error) bool { return target == ErrGone || target == ErrNotFound }

// As lets errors.As find a *Error in e.
func (e *GoneError) As(target any) bool {
	p, ok := target.(**Error)
	if ok {
		*p = &Error{Kind: KindGone, Code: string(ErrGone), Message: e.Tombstone.Message()}
	}
	return ok
}

// TombstoneStore is a Store that keeps tombstones too, so they survive a
// restart. A Store without it keeps them in memory only.
type TombstoneStore interface {
	PutTombstone(t Tombstone) error
	DeleteTombstones(ids ...string) error
	Tombstones() ([]Tombstone, error)
}

// RecordBurier is a TombstoneStore that removes a session's record and
// keeps its tombstone in one write: both or neither.
type RecordBurier interface {
	TombstoneStore
	BuryRecord(t Tombstone) error
}

// tombstones are the manager's tombstones, oldest first in order.
type tombstones struct {
	mu    sync.Mutex
	byID  map[string]Tombstone
	order []string
}

func (m *Manager) tombs() *tombstones {
	m.tombOnce.Do(func() { m.tomb = &tombstones{byID: map[string]Tombstone{}} })
	return m.tomb
}

func (m *Manager) tombstoneTTL() time.Duration {
	if m.cfg.TombstoneTTL == 0 {
		return DefaultTombstoneTTL
	}
	return m.cfg.TombstoneTTL
}

func (m *Manager) maxTombstones() int {
	if m.cfg.MaxTombstones <= 0 {
		return DefaultMaxTombstones
	}
	return m.cfg.MaxTombstones
}

// bury records the tombstone of s, which ends now with reason (a Gone*
// reason); by is the principal that deleted it, if one did. It runs before
// the session's status changes, so it still sees a failure.
func (m *Manager) bury(s *Session, reason string, by *Principal) {
	m.keepTombstone(s, reason, by, false)
}

// keepTombstone records the tombstone of s (bury); with record (end), a
// store that is a RecordBurier also removes the session's record in the
// same commit (one fsync for a DELETE, not two). It reports whether the
// record was removed; false: end removes it on its own.
func (m *Manager) keepTombstone(s *Session, reason string, by *Principal, record bool) bool {
	if m.tombstoneTTL() < 0 {
		return false
	}
	t := Tombstone{ID: s.ID, Tenant: s.Tenant, Reason: reason, At: m.cfg.Now().UTC(),
		Image: s.Image, CreatedAt: s.CreatedAt, LastActivityAt: s.LastActivity()}
	if by != nil {
		t.ByTenant, t.ByMethod = by.Tenant, by.Method
	}
	s.mu.Lock()
	t.ExpiresAt = s.expiresAt
	if s.status == StatusFailed {
		t.Failure = s.statusReason
		if by == nil { // expired after it failed: the failure is the news
			t.Reason = GoneFailed
		}
	}
	s.mu.Unlock()
	ts := m.tombs()
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if _, dup := ts.byID[t.ID]; !dup {
		ts.order = append(ts.order, t.ID)
	}
	ts.byID[t.ID] = t
	done := false
	if rb, ok := m.cfg.Store.(RecordBurier); ok && record {
		// Neither written on an error: end removes the record on its own.
		if err := rb.BuryRecord(t); err != nil {
			m.log.Error("store_failed", "session", t.ID, "err", err)
		} else {
			done = true
		}
	} else if st, ok := m.cfg.Store.(TombstoneStore); ok {
		if err := st.PutTombstone(t); err != nil {
			m.log.Error("store_failed", "session", t.ID, "err", err)
		}
	}
	m.trimLocked(ts, false)
	return done
}

// gone returns the GoneError of p's session id if it has a live
// tombstone, or nil. Another tenant's tombstone is nil, as if none were.
func (m *Manager) gone(p Principal, id string) error {
	ts := m.tombs()
	ts.mu.Lock()
	t, ok := ts.byID[id]
	ts.mu.Unlock()
	if !ok || t.Tenant != p.Tenant || !m.cfg.Now().Before(t.At.Add(m.tombstoneTTL())) {
		return nil
	}
	return &GoneError{Tombstone: t}
}

// notFound is the error of a lookup of p's session id that the manager
// does not hold: gone if it has a tombstone, ErrNotFound otherwise.
func (m *Manager) notFound(p Principal, id string) error {
	if err := m.gone(p, id); err != nil {
		return err
	}
	return ErrNotFound
}

// PruneTombstones drops the tombstones older than the tombstone TTL (Run
// calls it).
func (m *Manager) PruneTombstones() {
	ts := m.tombs()
	ts.mu.Lock()
	defer ts.mu.Unlock()
	m.trimLocked(ts, true)
}

// trimLocked drops the oldest tombstones beyond the bound and, with
// expired, those older than the TTL, from memory and the store.
func (m *Manager) trimLocked(ts *tombstones, expired bool) {
	now, ttl, max := m.cfg.Now(), m.tombstoneTTL(), m.maxTombstones()
	var drop []string
	for len(ts.order) > 0 {
		id := ts.order[0]
		t, ok := ts.byID[id]
		if ok && len(ts.byID) <= max && (!expired || now.Before(t.At.Add(ttl))) {
			break
		}
		ts.order = ts.order[1:]
		if ok {
			delete(ts.byID, id)
			drop = append(drop, id)
		}
	}
	if len(drop) == 0 {
		return
	}
	if st, ok := m.cfg.Store.(TombstoneStore); ok {
		if err := st.DeleteTombstones(drop...); err != nil {
			m.log.Error("store_failed", "tombstones", len(drop), "err", err)
		}
	}
}

// restoreTombstones loads the stored tombstones (Restore calls it).
func (m *Manager) restoreTombstones() error {
	st, ok := m.cfg.Store.(TombstoneStore)
	if !ok {
		return nil
	}
	all, err := st.Tombstones()
	if err != nil {
		return fmt.Errorf("load tombstones: %w", err)
	}
	sort.Slice(all, func(i, j int) bool {
		if !all[i].At.Equal(all[j].At) {
			return all[i].At.Before(all[j].At)
		}
		return all[i].ID < all[j].ID
	})
	ts := m.tombs()
	ts.mu.Lock()
	defer ts.mu.Unlock()
	for _, t := range all {
		if _, dup := ts.byID[t.ID]; !dup {
			ts.order = append(ts.order, t.ID)
		}
		ts.byID[t.ID] = t
	}
	// order must stay oldest first: merge what was already there.
	sort.SliceStable(ts.order, func(i, j int) bool { return ts.byID[ts.order[i]].At.Before(ts.byID[ts.order[j]].At) })
	m.trimLocked(ts, true)
	return nil
}

// MemStore keeps tombstones in memory.

func (m *MemStore) PutTombstone(t Tombstone) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.tombs == nil {
		m.tombs = map[string]Tombstone{}
	}
	m.tombs[t.ID] = t
	return nil
}

func (m *MemStore) DeleteTombstones(ids ...string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, id := range ids {
		delete(m.tombs, id)
	}
	return nil
}

func (m *MemStore) Tombstones() ([]Tombstone, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Tombstone, 0, len(m.tombs))
	for _, t := range m.tombs {
		out = append(out, t)
	}
	return out, nil
}
