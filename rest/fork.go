package rest

import (
	"context"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sandbox"
)

// SessionForker is implemented by session managers that can fork a
// running session, processes and memory included (gateway.Manager.Fork);
// the API answers POST /v1/sessions/{id}/fork with it.
type SessionForker interface {
	Fork(ctx context.Context, p gateway.Principal, id string, count int) ([]gateway.ForkedSession, error)
}

// forkRequest is POST /v1/sessions/{id}/fork's body.
type forkRequest struct {
	// Count is how many sessions to make (default 1, at most
	// gateway.MaxForkCount).
	Count *int `json:"count"`
}

// forkJSON is a fork's answer: each new session as a create answers it,
// with its password.
type forkJSON struct {
	Sessions []sessionJSON `json:"sessions"`
}

// fork answers POST /v1/sessions/{id}/fork: count new sessions, each a
// copy of the running session (processes, memory, workspace) as it was
// at one instant (docs/fork.md).
func (a *api) fork(w http.ResponseWriter, r *http.Request) {
	fk, ok := a.cfg.Sessions.(SessionForker)
	if !ok {
		WriteError(w, http.StatusBadRequest, "fork_unsupported", "this gateway cannot fork sessions")
		return
	}
	var req forkRequest
	if r.ContentLength != 0 {
		if status, code, msg := DecodeJSON(w, r, &req); status != 0 {
			WriteError(w, status, code, msg)
			return
		}
	}
	count := 1
	if req.Count != nil {
		count = *req.Count
	}
	p := principal(r)
	// The steps of a fork (checkpoint, restores, images removed), as a
	// create's, only when the operator asks for them (serve --server-timing).
	tr, ctx := sandbox.NewTrace(), r.Context()
	if a.cfg.ServerTiming {
		ctx = sandbox.WithTrace(ctx, tr)
	}
	forks, err := fk.Fork(ctx, p, chi.URLParam(r, "id"), count)
	if err != nil {
		WriteGatewayError(w, err)
		return
	}
	w.Header().Set("Server-Timing", serverTiming(tr))
	out := forkJSON{Sessions: make([]sessionJSON, 0, len(forks))}
	for _, f := range forks {
		// The fork's Python kernels, persistent shells and background
		// processes are its source's, taken back as after a restart.
		a.dp.Kernels.Fork(f.From, f.Session.ID, f.Session)
		a.dp.Shells.Fork(f.From, f.Session.ID, f.Session)
		if err := a.dp.Processes.Fork(a.processConfig(), f.From, f.Session); err != nil {
			a.cfg.Log.WarnContext(r.Context(), "process_fork_failed", "session", f.Session.ID, "from", f.From, "err", err)
		}
		f.Session.Touch(time.Now())
		out.Sessions = append(out.Sessions, a.render(f.Session, f.Password))
	}
	// Nobody else can learn the forks' passwords: if the answer cannot
	// be delivered, they would hold quota slots for nothing.
	err = r.Context().Err()
	if err == nil {
		err = FlushJSON(w, http.StatusCreated, out)
	}
	if err != nil {
		for _, f := range forks {
			Rollback(r, a.cfg.Sessions, a.cfg.Log, p, f.Session.ID, err)
		}
	}
}
