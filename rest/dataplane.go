package rest

import (
	"context"
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/sandgate/sandgate/dataplane"
	"github.com/sandgate/sandgate/gateway"
)

// DataPlane bounds the REST data plane: commands, files and processes run
// in a session's sandbox over plain HTTP (dataplane.Bounds).
type DataPlane = dataplane.Bounds

// Defaults of the bounds on commands' memory (dataplane.Bounds).
const (
	DefaultCommandMemory          = dataplane.DefaultCommandMemory
	DefaultCommandMemoryPerTenant = dataplane.DefaultCommandMemoryPerTenant
	DefaultCommandQueue           = dataplane.DefaultCommandQueue
	// DefaultUploadStall is DataPlane.UploadStall's default.
	DefaultUploadStall = dataplane.DefaultUploadStall
)

// dataSession finds the running session of the request's {id} for a
// data-plane call, answering 404 (not the caller's) or 409 (not running)
// itself; the call counts as activity until it returns (Session.Hold).
func (a *api) dataSession(w http.ResponseWriter, r *http.Request) (*gateway.Session, bool) {
	s, err := a.cfg.Sessions.Get(r.Context(), principal(r), chi.URLParam(r, "id"))
	if err != nil {
		WriteGatewayError(w, err)
		return nil, false
	}
	if !s.Live() {
		WriteError(w, http.StatusConflict, "session_not_running", "the session is not running; delete it")
		return nil, false
	}
	context.AfterFunc(r.Context(), s.Hold())    // the server cancels it when the handler returns
	if err := s.Wake(r.Context()); err != nil { // a paused session resumes on its next call
		WriteGatewayError(w, err)
		return nil, false
	}
	return s, true
}
