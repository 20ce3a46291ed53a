package egress

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"
)

// Approvals ("ask" mode). A session whose Policy has Ask set parks a
// connection to a host:port outside its allow-list, instead of refusing
// it, until someone decides (Decide), up to Config.AskTimeout; a timeout
// is a denial. Only hosts inside the operator's ceiling (Policy.AskWithin)
// are parked, and never one the session's deny list (Policy.Deny) holds.
//
// A parked connection is an accepted connection: it counts against the
// connection bounds (per session, per tenant, gateway-wide; limits.go)
// all the while, so parking cannot hold more descriptors than they allow.
// The parked connections are bounded besides, per session
// (Config.MaxPending), per tenant (Config.MaxPendingPerTenant: one
// tenant's sessions cannot take every place the gateway has) and on the
// gateway (Config.MaxPendingTotal).
//
// The resolver (answerDNS) in ask mode answers a name outside the list
// too, when the operator's ceiling allows it on some port: a raw TCP
// client looks the name up before it connects, so NXDOMAIN would end it
// before there is a connection to park. The answer is an address of
// NamePrefix like any (it stands for the name in this session only; no
// query ever leaves the gateway, so resolving reveals nothing outside),
// counted against the names' bounds (names.go: past them SERVFAIL). The
// decision is taken at connect, by name and port: a denied name resolves
// and then fails there (a reset; 403 through the proxy). A name remembered
// as denied for one port still resolves, as others may be asked for.

// The defaults of the approvals' bounds.
const (
	DefaultAskTimeout          = 60 * time.Second
	DefaultMaxPending          = 64
	DefaultMaxPendingPerTenant = 256
	DefaultMaxPendingTotal     = 1024
)

// The results of an approval, as the audit trail records them.
const (
	AskApproved = "approved"
	AskDenied   = "denied"
	AskTimeout  = "timeout"
)

// The stable codes of a refusal past the approvals' bounds: the proxy
// answers them in the X-Sandgate-Code header of its 429 or 503.
const (
	CodeAskPendingSession = "ask_pending_limit"
	CodeAskPendingTenant  = "ask_pending_tenant_limit"
	CodeAskPendingGateway = "ask_pending_gateway_limit"
)

// Pending is a connection waiting for a decision.
type Pending struct {
	ID    string
	Host  string
	Port  uint16
	Since time.Time
	// Via is how the sandbox asked: "proxy" (CONNECT or an http:// URI
	// through HTTP(S)_PROXY) or "transparent" (any TCP connection).
	Via string
	// UserAgent is the User-Agent of a proxy request, "" when none (a
	// transparent connection's first bytes are not read before it is
	// decided). The process that asked is not known: a connection reaches
	// the gateway from the sandbox's network namespace, and nothing maps
	// its peer to a pid without walking the sandbox's descriptors.
	UserAgent string
}

type parked struct {
	Pending
	decided chan bool // the decision, sent once by whoever took it out of the map
}

// asks is a session's parked connections.
type asks struct {
	mu      sync.Mutex
	m       map[string]*parked
	changed chan struct{} // closed and replaced on every change
}

func (a *asks) notifyLocked() {
	if a.changed != nil {
		close(a.changed)
	}
	a.changed = make(chan struct{})
}

// Pending returns the session's parked connections, oldest first.
func (s *Session) Pending() []Pending {
	s.asks.mu.Lock()
	defer s.asks.mu.Unlock()
	out := make([]Pending, 0, len(s.asks.m))
	for _, p := range s.asks.m {
		out = append(out, p.Pending)
	}
	slices.SortFunc(out, func(a, b Pending) int {
		if c := a.Since.Compare(b.Since); c != 0 {
			return c
		}
		return compareStrings(a.ID, b.ID)
	})
	return out
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// PendingChanged returns a channel closed at the next change of Pending
// (a connection parked or decided).
func (s *Session) PendingChanged() <-chan struct{} {
	s.asks.mu.Lock()
	defer s.asks.mu.Unlock()
	if s.asks.changed == nil {
		s.asks.changed = make(chan struct{})
	}
	return s.asks.changed
}

// PendingByID returns the parked connection id.
func (s *Session) PendingByID(id string) (Pending, bool) {
	s.asks.mu.Lock()
	defer s.asks.mu.Unlock()
	p, ok := s.asks.m[id]
	if !ok {
		return Pending{}, false
	}
	return p.Pending, true
}

// Decide answers the parked connection id; false when there is none (it
// was decided, timed out or gave up meanwhile). With all, every other
// connection parked for the same host:port gets the same answer (a
// decision the session remembers).
func (s *Session) Decide(id string, allow, all bool) bool {
	s.asks.mu.Lock()
	p, ok := s.asks.m[id]
	if !ok {
		s.asks.mu.Unlock()
		return false
	}
	take := []*parked{p}
	if all {
		for _, q := range s.asks.m {
			if q != p && q.Host == p.Host && q.Port == p.Port {
				take = append(take, q)
			}
		}
	}
	for _, q := range take {
		delete(s.asks.m, q.ID)
	}
	s.releasePending(len(take))
	s.asks.notifyLocked()
	s.asks.mu.Unlock()
	for _, q := range take {
		q.decided <- allow // buffered: the waiter reads it
	}
	return true
}

// park adds a pending connection, within the bounds.
func (s *Session) park(host string, port uint16, via, ua string) (*parked, *denial) {
	var b [8]byte
	rand.Read(b[:])
	p := &parked{Pending: Pending{ID: hex.EncodeToString(b[:]), Host: host, Port: port, Since: time.Now().UTC(), Via: via, UserAgent: ua},
		decided: make(chan bool, 1)}
	s.asks.mu.Lock()
	defer s.asks.mu.Unlock()
	select {
	case <-s.done:
		return nil, denied(http.StatusServiceUnavailable, "session closed")
	default:
	}
	if len(s.asks.m) >= s.p.cfg.MaxPending {
		return nil, &denial{Status: http.StatusTooManyRequests, Code: CodeAskPendingSession,
			Reason: fmt.Sprintf("too many connections waiting for approval (at most %d per session; serve --egress-ask-max-pending)", s.p.cfg.MaxPending)}
	}
	if d := s.takePending(); d != nil {
		return nil, d
	}
	if s.asks.m == nil {
		s.asks.m = make(map[string]*parked)
	}
	s.asks.m[p.ID] = p
	s.asks.notifyLocked()
	return p, nil
}

// unpark takes p out when nobody decided it; false when a decision was
// taken (and sent on p.decided).
func (s *Session) unpark(p *parked) bool {
	s.asks.mu.Lock()
	defer s.asks.mu.Unlock()
	if s.asks.m[p.ID] != p {
		return false
	}
	delete(s.asks.m, p.ID)
	s.releasePending(1)
	s.asks.notifyLocked()
	return true
}

// takePending counts a parked connection of s's tenant against the
// tenant's and the gateway's bounds: the denial past one, nil when
// counted.
func (s *Session) takePending() *denial {
	p := s.p
	p.tmu.Lock()
	defer p.tmu.Unlock()
	if p.pendingTenants[s.tenant] >= p.cfg.MaxPendingPerTenant {
		return &denial{Status: http.StatusTooManyRequests, Code: CodeAskPendingTenant,
			Reason: fmt.Sprintf("too many connections of this tenant's sessions waiting for approval (at most %d; serve --egress-ask-max-pending-per-tenant)", p.cfg.MaxPendingPerTenant)}
	}
	if p.pending.Load() >= int64(p.cfg.MaxPendingTotal) {
		return &denial{Status: http.StatusServiceUnavailable, Code: CodeAskPendingGateway,
			Reason: fmt.Sprintf("too many connections waiting for approval on this gateway (at most %d; serve --egress-ask-max-pending-total); try again later", p.cfg.MaxPendingTotal)}
	}
	p.pending.Add(1)
	p.pendingTenants[s.tenant]++
	return nil
}

// releasePending uncounts n parked connections of s's tenant.
func (s *Session) releasePending(n int) {
	p := s.p
	p.tmu.Lock()
	defer p.tmu.Unlock()
	p.pending.Add(-int64(n))
	if p.pendingTenants[s.tenant] -= n; p.pendingTenants[s.tenant] <= 0 {
		delete(p.pendingTenants, s.tenant)
	}
}

// ask is the approval of a connection to host:port, which pol's
// allow-list does not allow: nil when approved; otherwise the denial to
// answer. In ask mode it parks the connection until a decision, the ask
// timeout, ctx's end (the client gone) or the session's; each ending but
// the last two is recorded as a decision (kind "ask") with its result.
func (s *Session) ask(ctx context.Context, pol *Policy, host string, port uint16, via, ua string) *denial {
	switch {
	case !pol.Ask:
		return denied(http.StatusForbidden, "not in this session's egress list")
	case pol.Deny.Allows(host, port):
		return denied(http.StatusForbidden, "denied for this session (a remembered decision)")
	case !pol.AskWithin.Allows(host, port):
		return denied(http.StatusForbidden, "not in this session's egress list, and outside what this gateway allows (serve --egress-allow): not asked")
	}
	p, d := s.park(host, port, via, ua)
	if d != nil {
		return d
	}
	s.log.Info("egress: waiting for approval", "pending", p.ID, "host", host, "port", port, "via", via)
	t := time.NewTimer(s.p.cfg.AskTimeout)
	defer t.Stop()
	var (
		result string
		allow  bool
	)
	select {
	case allow = <-p.decided:
	case <-t.C:
		result = AskTimeout
	case <-ctx.Done():
		result = "gone"
	case <-s.done:
		result = "closed"
	}
	if result != "" && !s.unpark(p) {
		// A decision was taken just as the wait ended: it stands.
		allow, result = <-p.decided, ""
	}
	if result == "" {
		result = AskDenied
		if allow {
			result = AskApproved
		}
	}
	reason := ""
	switch result {
	case AskDenied:
		reason = "denied through the approvals API"
	case AskTimeout:
		reason = fmt.Sprintf("no decision within %v (serve --egress-ask-timeout): a timeout is a denial", s.p.cfg.AskTimeout)
	case "gone":
		return denied(http.StatusBadGateway, "the client left while waiting for approval")
	case "closed":
		return denied(http.StatusServiceUnavailable, "session closed")
	}
	rec := newRecord("ask")
	rec.start = p.Since
	rec.setTarget(host, port)
	rec.approval = result
	if allow {
		rec.allow()
	} else {
		rec.deny(reason)
	}
	s.logRecord(rec)
	if allow {
		return nil
	}
	return denied(http.StatusForbidden, "%s", reason)
}

// Allows reports whether b allows host (a hostname or an IP literal) on
// port.
func (b Bounds) Allows(host string, port uint16) bool {
	l, err := ParseList([]string{hostPort(host, port)})
	return err == nil && !l.Empty() && len(b.Outside(l)) == 0
}

// AllowsName reports whether b allows the hostname name on some port.
func (b Bounds) AllowsName(name string) bool {
	e, err := parseEntry(name, false)
	if err != nil || e.kind != kindHost {
		return false
	}
	for _, pat := range b.patterns {
		port := pat.port
		if port == 0 {
			port = 443
		}
		if pat.covers(e, port) {
			return true
		}
	}
	return false
}
