package rest

import (
	"context"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/sandgate/sandgate/gateway"
)

// SessionPauser is implemented by session managers that can pause a
// session's processes in place and resume them (gateway.Manager.Pause,
// Unpause); the API answers POST /v1/sessions/{id}/pause and /resume
// with it.
type SessionPauser interface {
	Pause(ctx context.Context, p gateway.Principal, id string) (*gateway.PauseResult, error)
	Unpause(ctx context.Context, p gateway.Principal, id string) (*gateway.Session, error)
}

// pauseJSON is a pause's answer: the session (status paused) and what
// the pause did.
type pauseJSON struct {
	sessionJSON
	Pause pauseReportJSON `json:"pause"`
}

type pauseReportJSON struct {
	// Method is how the processes were parked: "freeze" (docs/pause.md).
	Method string `json:"method"`
	// ResidentBytes is the memory the paused session still holds (absent:
	// unknown).
	ResidentBytes *int64 `json:"residentBytes,omitempty"`
	// NotKept lists what the pause did not keep, one sentence each.
	NotKept []string `json:"notKept"`
	// KeptCommands are the commands under way that the pause handed to
	// the process API (an SSH exec, a REST command, under --checkpoint):
	// they run on as
	// background processes.
	KeptCommands []gateway.HandedOff `json:"keptCommands,omitempty"`
	// Ms is how long the pause took.
	Ms int64 `json:"ms"`
}

// pause answers POST /v1/sessions/{id}/pause: the session's processes
// stop where they are, connections to them close, and it answers with
// the session (status paused) and the pause's report. It counts as
// activity, like a GET.
func (a *api) pause(w http.ResponseWriter, r *http.Request) {
	pa, ok := a.cfg.Sessions.(SessionPauser)
	if !ok {
		WriteError(w, http.StatusBadRequest, "pause_unsupported", "this gateway cannot pause sessions")
		return
	}
	start := time.Now()
	res, err := pa.Pause(r.Context(), principal(r), chi.URLParam(r, "id"))
	if err != nil {
		WriteGatewayError(w, err)
		return
	}
	res.Session.Touch(time.Now())
	rep := pauseReportJSON{Method: res.Report.Method, NotKept: res.Report.NotKept, KeptCommands: res.Handed, Ms: time.Since(start).Milliseconds()}
	if res.Report.ResidentBytes >= 0 {
		rep.ResidentBytes = &res.Report.ResidentBytes
	}
	if rep.NotKept == nil {
		rep.NotKept = []string{}
	}
	_ = WriteJSON(w, http.StatusOK, pauseJSON{sessionJSON: a.render(res.Session, ""), Pause: rep})
}

// resume answers POST /v1/sessions/{id}/resume: a paused session's
// processes run again (a running one answers as it is), and it answers
// with the session.
func (a *api) resume(w http.ResponseWriter, r *http.Request) {
	pa, ok := a.cfg.Sessions.(SessionPauser)
	if !ok {
		WriteError(w, http.StatusBadRequest, "pause_unsupported", "this gateway cannot pause sessions")
		return
	}
	s, err := pa.Unpause(r.Context(), principal(r), chi.URLParam(r, "id"))
	if err != nil {
		WriteGatewayError(w, err)
		return
	}
	s.Touch(time.Now())
	_ = WriteJSON(w, http.StatusOK, a.render(s, ""))
}
