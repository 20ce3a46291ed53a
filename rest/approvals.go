package rest

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/sandgate/sandgate/egress"
	"github.com/sandgate/sandgate/gateway"
)

// Approvals (egressMode "ask"): GET /v1/sessions/{id}/egress/pending lists
// the connections parked for a decision, or follows them as server-sent
// events; POST /v1/sessions/{id}/egress/pending/{pendingId} decides one.

// EgressDecider is what the approvals API needs of the session manager
// beside Sessions (gateway.Manager has it).
type EgressDecider interface {
	DecideEgress(ctx context.Context, p gateway.Principal, id, pendingID string, allow, remember bool) (egress.Pending, error)
}

// EgressFollowers bounds the streams of pending connections per session,
// per tenant and on the gateway (gateway.Manager has it).
type EgressFollowers interface {
	FollowEgress(s *gateway.Session) (release func(), err error)
}

// pendingJSON is one parked connection.
type pendingJSON struct {
	ID    string    `json:"id"`
	Host  string    `json:"host"`
	Port  int       `json:"port"`
	Since time.Time `json:"since"`
	// Via is "proxy" (HTTP(S)_PROXY) or "transparent" (any TCP).
	Via string `json:"via"`
	// UserAgent is a proxy request's User-Agent, the only hint of the
	// process that asked: its pid is not known (egress.Pending).
	UserAgent string `json:"userAgent,omitempty"`
}

func pendingOf(p egress.Pending) pendingJSON {
	return pendingJSON{ID: p.ID, Host: p.Host, Port: int(p.Port), Since: p.Since.UTC(), Via: p.Via, UserAgent: p.UserAgent}
}

// pendingHeartbeat is how often a follower gets a comment line, so that
// proxies keep the stream open and a gone client is noticed.
const pendingHeartbeat = 15 * time.Second

// sessionPending serves GET /v1/sessions/{id}/egress/pending: the parked
// connections, oldest first; with ?follow=true (or Accept:
// text/event-stream) a stream of server-sent events instead: "pending"
// (a connection parked, including those parked already) and "resolved"
// (one no longer waits: decided, timed out or its client gone), until
// the session ends or the client leaves.
func (a *api) sessionPending(w http.ResponseWriter, r *http.Request) {
	follow, ok := boolQuery(w, r, "follow", strings.Contains(r.Header.Get("Accept"), "text/event-stream"))
	if !ok {
		return
	}
	p, id := principal(r), chi.URLParam(r, "id")
	s, err := a.cfg.Sessions.Get(r.Context(), p, id)
	if err != nil {
		WriteGatewayError(w, err)
		return
	}
	if !follow {
		list, _ := s.EgressPending()
		out := struct {
			Pending []pendingJSON `json:"pending"`
		}{Pending: make([]pendingJSON, 0, len(list))}
		for _, pd := range list {
			out.Pending = append(out.Pending, pendingOf(pd))
		}
		_ = WriteJSON(w, http.StatusOK, out)
		return
	}
	followFn := s.FollowEgress // the session's bound only
	if f, ok := a.cfg.Sessions.(EgressFollowers); ok {
		followFn = func() (func(), error) { return f.FollowEgress(s) }
	}
	release, err := followFn()
	if err != nil {
		WriteGatewayError(w, err)
		return
	}
	defer release()
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	if rc.Flush() != nil {
		return
	}
	var buf bytes.Buffer
	event := func(name string, v any) {
		b, _ := json.Marshal(v)
		buf.WriteString("event: " + name + "\ndata: ")
		buf.Write(b)
		buf.WriteString("\n\n")
	}
	send := func() bool {
		if buf.Len() == 0 {
			return true
		}
		_, err := w.Write(buf.Bytes())
		buf.Reset()
		return err == nil && rc.Flush() == nil
	}
	seen := map[string]egress.Pending{}
	beat := time.NewTicker(pendingHeartbeat)
	defer beat.Stop()
	for {
		list, changed := s.EgressPending()
		now := map[string]bool{}
		for _, pd := range list {
			now[pd.ID] = true
			if _, ok := seen[pd.ID]; !ok {
				seen[pd.ID] = pd
				event("pending", pendingOf(pd))
			}
		}
		for id, pd := range seen {
			if !now[id] {
				delete(seen, id)
				event("resolved", struct {
					ID   string `json:"id"`
					Host string `json:"host"`
					Port int    `json:"port"`
				}{id, pd.Host, int(pd.Port)})
			}
		}
		if !send() {
			return
		}
		if changed == nil { // no proxy now (stopped): look again at each beat
			changed = make(chan struct{})
		}
		select {
		case <-r.Context().Done():
			return
		case <-changed:
		case <-beat.C:
			if _, err := a.cfg.Sessions.Get(r.Context(), p, id); err != nil {
				buf.WriteString("event: end\ndata: {}\n\n")
				send()
				return
			}
			buf.WriteString(": keep-alive\n\n")
		}
	}
}

type decideRequest struct {
	Decision string `json:"decision"`
	Remember bool   `json:"remember"`
}

// decidePending serves POST /v1/sessions/{id}/egress/pending/{pendingId}:
// {"decision": "allow"|"deny", "remember": bool}.
func (a *api) decidePending(w http.ResponseWriter, r *http.Request) {
	var req decideRequest
	if status, code, msg := DecodeJSON(w, r, &req); status != 0 {
		WriteError(w, status, code, msg)
		return
	}
	if req.Decision != "allow" && req.Decision != "deny" {
		WriteError(w, http.StatusBadRequest, "invalid_decision", `decision must be "allow" or "deny"`)
		return
	}
	d, ok := a.cfg.Sessions.(EgressDecider)
	if !ok {
		WriteError(w, http.StatusNotImplemented, "approvals_unsupported", "this gateway cannot decide egress approvals")
		return
	}
	pd, err := d.DecideEgress(r.Context(), principal(r), chi.URLParam(r, "id"), chi.URLParam(r, "pendingId"), req.Decision == "allow", req.Remember)
	if err != nil {
		WriteGatewayError(w, err)
		return
	}
	_ = WriteJSON(w, http.StatusOK, struct {
		pendingJSON
		Decision string `json:"decision"`
		Remember bool   `json:"remember"`
	}{pendingOf(pd), req.Decision, req.Remember})
}
