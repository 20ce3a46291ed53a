package gateway

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"

	"github.com/sandgate/sandgate/egress"
)

// Approvals: a session created with egressMode "ask" parks a connection
// to a host:port outside its egress list (within the operator's
// --egress-allow) until someone decides it through the API, or until
// --egress-ask-timeout, which is a denial (egress/ask.go). A decision
// remembered adds the host:port to the session's egress list (allow) or
// to its deny list (deny): later connections are decided by them without
// asking. Both are kept in the session's record.

// The egress modes of a create.
const (
	EgressModeDeny = "deny" // a connection outside the list is refused (the default)
	EgressModeAsk  = "ask"  // it is parked for approval
)

// checkEgressMode checks a create's egressMode: "" for deny.
func (m *Manager) checkEgressMode(mode string) (string, error) {
	switch mode {
	case "", EgressModeDeny:
		return "", nil
	case EgressModeAsk:
		if m.cfg.Egress == nil {
			return "", Invalid("egress_unavailable", "this gateway has no egress proxy: sessions have no network, and nothing to ask for")
		}
		return EgressModeAsk, nil
	}
	return "", Invalid("invalid_egress_mode", fmt.Sprintf("egressMode %.64q: want %q or %q", mode, EgressModeDeny, EgressModeAsk))
}

// askState is the session's egress mode and deny list.
func (s *Session) askState() (string, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.egressMode, slices.Clone(s.egressDeny)
}

// EgressPending returns the session's connections waiting for approval,
// oldest first, and a channel closed at their next change (nil when the
// session has no egress proxy now: a stopped session's connections are
// closed).
func (s *Session) EgressPending() ([]egress.Pending, <-chan struct{}) {
	ps := s.egressProxy()
	if ps == nil {
		return nil, nil
	}
	changed := ps.PendingChanged()
	return ps.Pending(), changed
}

// The bounds of the streams of pending connections (GET
// .../egress/pending?follow=true) open at once: each holds a connection
// and a goroutine of the gateway. Per session and per tenant past them:
// 429 too_many_followers; on the gateway: 503 followers_gateway_limit.
const (
	MaxEgressFollowers          = 8
	MaxEgressFollowersPerTenant = 64
	MaxEgressFollowersTotal     = 1024
)

// followers counts the streams of pending connections per tenant and in
// all.
type followers struct {
	mu       sync.Mutex
	byTenant map[string]int
	total    int
}

// FollowEgress counts a new stream of s's pending connections against
// the session's, its tenant's and the gateway's bounds: release ends it;
// an error past one.
func (m *Manager) FollowEgress(s *Session) (release func(), err error) {
	f := &m.followers
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.byTenant[s.Tenant] >= MaxEgressFollowersPerTenant:
		return nil, &Error{Kind: KindQuota, Code: "too_many_followers",
			Message: fmt.Sprintf("at most %d streams of pending connections are open at once in all of a tenant's sessions; close one", MaxEgressFollowersPerTenant)}
	case f.total >= MaxEgressFollowersTotal:
		return nil, &Error{Kind: KindUnavailable, Code: "followers_gateway_limit",
			Message: fmt.Sprintf("this gateway has %d streams of pending connections open, as many as it may; try again later", MaxEgressFollowersTotal)}
	}
	rs, err := s.FollowEgress()
	if err != nil {
		return nil, err
	}
	if f.byTenant == nil {
		f.byTenant = make(map[string]int)
	}
	f.byTenant[s.Tenant]++
	f.total++
	var once sync.Once
	return func() {
		once.Do(func() {
			rs()
			f.mu.Lock()
			defer f.mu.Unlock()
			f.total--
			if f.byTenant[s.Tenant]--; f.byTenant[s.Tenant] <= 0 {
				delete(f.byTenant, s.Tenant)
			}
		})
	}, nil
}

// FollowEgress counts a new stream of the session's pending connections
// against MaxEgressFollowers only (Manager.FollowEgress counts the
// tenant's and the gateway's as well): release ends it; an error past it.
func (s *Session) FollowEgress() (release func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.followers >= MaxEgressFollowers {
		return nil, &Error{Kind: KindQuota, Code: "too_many_followers",
			Message: fmt.Sprintf("at most %d streams of a session's pending connections are open at once; close one", MaxEgressFollowers)}
	}
	s.followers++
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			s.followers--
			s.mu.Unlock()
		})
	}, nil
}

// errPendingNotFound answers a decision on a connection that is not
// waiting (decided, timed out, or its client gone).
var errPendingNotFound = &Error{Kind: KindNotFound, Code: "pending_not_found",
	Message: "no connection of this session waits for approval with this id (it was decided, timed out, or its client left)"}

// DecideEgress answers p's session id's parked connection pendingID:
// allowed or denied; with remember, the session's egress list (allow) or
// deny list (deny) keeps the connection's host:port, and every other
// connection parked for it gets the same answer.
func (m *Manager) DecideEgress(ctx context.Context, p Principal, id, pendingID string, allow, remember bool) (egress.Pending, error) {
	s, err := m.Get(ctx, p, id)
	if err != nil {
		return egress.Pending{}, err
	}
	ps := s.egressProxy()
	if ps == nil {
		return egress.Pending{}, errPendingNotFound
	}
	pd, ok := ps.PendingByID(pendingID)
	if !ok {
		return egress.Pending{}, errPendingNotFound
	}
	if remember {
		if err := m.rememberEgress(s, ps, pd, allow); err != nil {
			return pd, err
		}
	}
	if !ps.Decide(pendingID, allow, remember) {
		return pd, errPendingNotFound
	}
	m.log.Info("egress_decided", "session", s.ID, "tenant", p.Tenant, "pending", pendingID, "host", s.redact(pd.Host), "port", pd.Port,
		"allow", allow, "remember", remember)
	return pd, nil
}

// rememberEgress adds pd's host:port to s's egress list (allow) or deny
// list, in force at once and written to the store before it returns.
func (m *Manager) rememberEgress(s *Session, ps *egress.Session, pd egress.Pending, allow bool) error {
	entry := net.JoinHostPort(pd.Host, strconv.Itoa(int(pd.Port)))
	s.life.RLock()
	defer s.life.RUnlock()
	m.writeMu.Lock()
	defer m.writeMu.Unlock()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.sessions[s.ID] != s || !s.Live() {
		return ErrNotFound
	}
	s.mu.Lock()
	oldAllow, oldDeny := s.egressAllow, s.egressDeny
	s.mu.Unlock()
	newAllow, newDeny := oldAllow, oldDeny
	if allow {
		l, err := m.checkEgress(append(slices.Clone(oldAllow), entry))
		if err != nil {
			return err
		}
		newAllow = l.Entries()
	} else if !slices.Contains(oldDeny, entry) {
		if len(oldDeny) >= MaxEgressEntries {
			return Invalid("invalid_egress", fmt.Sprintf("the session's deny list has %d entries; at most %d", len(oldDeny), MaxEgressEntries))
		}
		newDeny = append(slices.Clone(oldDeny), entry)
	}
	set := func(a, d []string) {
		s.mu.Lock()
		s.egressAllow, s.egressDeny = a, d
		s.mu.Unlock()
		ps.SetPolicy(m.policy(s))
	}
	set(newAllow, newDeny)
	if err := m.cfg.Store.Put(s.Snapshot()); err != nil {
		set(oldAllow, oldDeny)
		_ = m.cfg.Store.Put(s.Snapshot())
		m.log.Error("store_failed", "session", s.ID, "err", err)
		return storeError(err)
	}
	return nil
}
