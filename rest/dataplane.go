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
//
// A paused session resumes first. A pause while the call runs ends
// pauseContext(r) (Session.AddPausedCall), with gateway.ErrPaused as its
// cause: streams and waits that watch it end, saying session_paused
// (docs/pause.md), instead of waiting on a frozen sandbox until the next
// resume. r's own context is left alone: what the call started (a
// command, a cell) goes on when the session resumes.
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
	context.AfterFunc(r.Context(), s.Hold()) // the server cancels it when the handler returns
	// Registered before the wake: a pause after it ends the call's
	// pauseContext, one before it is undone by the wake.
	callCtx, remove, ok := s.AddPausedCall(r.Context())
	if !ok {
		remove()
		WriteError(w, http.StatusConflict, "session_not_running", "the session is not running; delete it")
		return nil, false
	}
	context.AfterFunc(r.Context(), remove)
	if err := s.Wake(r.Context()); err != nil { // a paused session resumes on its next call
		WriteGatewayError(w, err)
		return nil, false
	}
	// Seen by every later r.Context() of the handler (r is changed in
	// place): pauseContext finds it there.
	*r = *r.WithContext(context.WithValue(r.Context(), pauseCtxKey{}, callCtx))
	return s, true
}

type pauseCtxKey struct{}

// pauseContext is r's context, ended also by a pause of its session when
// dataSession found it (else r's context).
func pauseContext(r *http.Request) context.Context {
	if ctx, ok := r.Context().Value(pauseCtxKey{}).(context.Context); ok {
		return ctx
	}
	return r.Context()
}

// pausedAnswer answers 409 session_paused when a pause of its session
// ended the call r (pauseContext), and reports whether it did.
func pausedAnswer(w http.ResponseWriter, r *http.Request) bool {
	if !gateway.PausedCause(pauseContext(r)) {
		return false
	}
	WriteGatewayError(w, gateway.ErrPaused)
	return true
}
