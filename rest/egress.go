package rest

import (
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/sandgate/sandgate/gateway"
)

// The page size of GET /v1/sessions/{id}/egress.
const (
	defaultEgressLimit = 100
	maxEgressLimit     = gateway.MaxEgressDecisions
)

// egressDecisionJSON is one decision of GET /v1/sessions/{id}/egress.
type egressDecisionJSON struct {
	Seq        int64     `json:"seq"`
	Kind       string    `json:"kind"`
	Host       string    `json:"host"`
	Port       int       `json:"port"`
	Address    string    `json:"address,omitempty"`
	Allowed    bool      `json:"allowed"`
	Reason     string    `json:"reason,omitempty"`
	BytesIn    int64     `json:"bytesIn"`
	BytesOut   int64     `json:"bytesOut"`
	Start      time.Time `json:"start"`
	DurationMs int64     `json:"durationMs"`
}

// sessionEgress serves GET /v1/sessions/{id}/egress: the session's latest
// egress decisions (at most gateway.MaxEgressDecisions are kept), newest
// first, paged by the seq of the last one seen. Reading them is not
// activity.
func (a *api) sessionEgress(w http.ResponseWriter, r *http.Request) {
	s, err := a.cfg.Sessions.Get(r.Context(), principal(r), chi.URLParam(r, "id"))
	if err != nil {
		WriteGatewayError(w, err)
		return
	}
	limit, err := queryInt(r, "limit", defaultEgressLimit, 1, maxEgressLimit)
	if err != nil {
		WriteError(w, http.StatusBadRequest, "invalid_limit", err.Error())
		return
	}
	var before int64
	if q := r.URL.Query(); q.Has("cursor") {
		before, err = strconv.ParseInt(q.Get("cursor"), 10, 64)
		if err != nil || before < 1 {
			WriteError(w, http.StatusBadRequest, "invalid_cursor", "cursor must be the nextCursor of an earlier page")
			return
		}
	}
	ds, more := s.EgressDecisions(before, limit)
	out := struct {
		Decisions  []egressDecisionJSON `json:"decisions"`
		NextCursor string               `json:"nextCursor,omitempty"`
	}{Decisions: make([]egressDecisionJSON, 0, len(ds))}
	for _, d := range ds {
		out.Decisions = append(out.Decisions, egressDecisionJSON{Seq: d.Seq, Kind: d.Kind, Host: d.Host, Port: d.Port,
			Address: d.Addr, Allowed: d.Allowed, Reason: d.Reason, BytesIn: d.BytesIn, BytesOut: d.BytesOut,
			Start: d.Start.UTC(), DurationMs: d.Duration.Milliseconds()})
	}
	if more {
		out.NextCursor = strconv.FormatInt(ds[len(ds)-1].Seq, 10)
	}
	_ = WriteJSON(w, http.StatusOK, out)
}
