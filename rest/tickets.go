package rest

import (
	"crypto/rand"
	"encoding/base64"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/sandgate/sandgate/gateway"
)

// Tickets: a browser cannot set Authorization on a WebSocket, so POST
// /v1/sessions/{id}/tickets hands out a short-lived, one-use ticket that
// GET /v1/sessions/{id}/ssh and /terminal accept in place of the bearer
// token, as ?ticket=. A ticket is bound to its principal and its session,
// and is kept in this gateway's memory only: it is redeemed on the
// gateway that issued it.

const (
	// TicketTTL is how long a ticket may wait to be used.
	TicketTTL = 30 * time.Second
	// MaxTickets bounds the tickets waiting to be used, gateway-wide.
	MaxTickets = 10000
	// MaxTicketsPerTenant bounds one tenant's.
	MaxTicketsPerTenant = 100
)

type ticket struct {
	p       gateway.Principal
	session string
	expires time.Time
}

// tickets are the issued tickets not used yet.
type tickets struct {
	mu sync.Mutex
	m  map[string]ticket
}

// issue returns a new ticket for p and session, or "" when too many wait.
func (ts *tickets) issue(p gateway.Principal, session string, now time.Time) string {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.m == nil {
		ts.m = map[string]ticket{}
	}
	mine := 0
	for k, t := range ts.m {
		if !now.Before(t.expires) {
			delete(ts.m, k)
		} else if t.p.Tenant == p.Tenant {
			mine++
		}
	}
	if len(ts.m) >= MaxTickets || mine >= MaxTicketsPerTenant {
		return ""
	}
	var b [24]byte
	_, _ = rand.Read(b[:])
	k := "tk_" + base64.RawURLEncoding.EncodeToString(b[:])
	ts.m[k] = ticket{p: p, session: session, expires: now.Add(TicketTTL)}
	return k
}

// redeem takes ticket k, once: its principal and session.
func (ts *tickets) redeem(k string, now time.Time) (ticket, bool) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	t, ok := ts.m[k]
	delete(ts.m, k)
	return t, ok && now.Before(t.expires)
}

// createTicket serves POST /v1/sessions/{id}/tickets.
func (a *api) createTicket(w http.ResponseWriter, r *http.Request) {
	p := principal(r)
	s, err := a.cfg.Sessions.Get(r.Context(), p, chi.URLParam(r, "id"))
	if err != nil {
		WriteGatewayError(w, err)
		return
	}
	now := time.Now()
	k := a.tickets.issue(p, s.ID, now)
	if k == "" {
		w.Header().Set("Retry-After", "30")
		WriteError(w, http.StatusTooManyRequests, "too_many_tickets", "too many unused tickets: use or let expire some")
		return
	}
	_ = WriteJSON(w, http.StatusCreated, map[string]any{
		"ticket":     k,
		"sessionId":  s.ID,
		"expiresAt":  now.Add(TicketTTL).UTC().Format(time.RFC3339),
		"ttlSeconds": int(TicketTTL / time.Second),
	})
}

// ticketPrincipal returns the principal of r's ?ticket= when r is a
// WebSocket to a session's ssh or terminal with no bearer token, and the
// ticket is valid for that session (its id, as the ticket's answer gave
// it). ok false: r has no ticket. A ticket that is not valid is an error.
func (a *api) ticketPrincipal(r *http.Request) (p gateway.Principal, ok bool, valid bool) {
	k := r.URL.Query().Get("ticket")
	if k == "" || r.Method != http.MethodGet || gateway.BearerToken(r) != "" {
		return gateway.Principal{}, false, false
	}
	rest, found := strings.CutPrefix(r.URL.Path, "/v1/sessions/")
	id, kind, _ := strings.Cut(rest, "/")
	if !found || (kind != "ssh" && kind != "terminal") {
		return gateway.Principal{}, false, false
	}
	t, live := a.tickets.redeem(k, time.Now())
	if !live || t.session != id {
		return gateway.Principal{}, true, false
	}
	return t.p, true, true
}
