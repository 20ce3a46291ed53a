package rest

import (
	"context"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/sandgate/sandgate/gateway"
)

// SessionStopper is implemented by session managers that can stop a
// session, keeping its files (gateway.Manager.Stop); the API answers
// POST /v1/sessions/{id}/stop with it.
type SessionStopper interface {
	Stop(ctx context.Context, p gateway.Principal, id string) (*gateway.Session, error)
}

// stop answers POST /v1/sessions/{id}/stop: the session's processes end,
// its files stay, and it answers with the session (status stopped). It
// counts as activity, like a GET.
func (a *api) stop(w http.ResponseWriter, r *http.Request) {
	st, ok := a.cfg.Sessions.(SessionStopper)
	if !ok {
		WriteError(w, http.StatusBadRequest, "stop_unsupported", "this gateway cannot stop sessions")
		return
	}
	s, err := st.Stop(r.Context(), principal(r), chi.URLParam(r, "id"))
	if err != nil {
		WriteGatewayError(w, err)
		return
	}
	s.Touch(time.Now())
	_ = WriteJSON(w, http.StatusOK, a.render(s, ""))
}
