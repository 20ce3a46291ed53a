package rest

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/workspace"
)

// Workspaces is what the API needs of the workspace engine
// (workspace.Service): named workspaces, snapshots, and the sync state a
// session shows.
type Workspaces interface {
	CreateWorkspace(ctx context.Context, tenant, name string) (workspace.Info, error)
	ListWorkspaces(ctx context.Context, tenant string) ([]workspace.Info, error)
	DeleteWorkspace(ctx context.Context, tenant, name string) error
	Snapshot(ctx context.Context, tenant, session string, sb sandbox.Sandbox, stopped bool) (workspace.SnapshotInfo, error)
	SessionSync(session string) *workspace.SyncState
	// FinalSync saves a session's named workspace before a DELETE ends
	// it (workspace_sync_failed: not saved; the session must stay), and
	// DiscardOnEnd makes it end without saving (discard=true).
	FinalSync(ctx context.Context, session string) error
	DiscardOnEnd(session string, discard bool)
	DropOnEnd(session string, drop bool)
	ListSnapshots(ctx context.Context, tenant, session string) ([]workspace.SnapshotEntry, error)
	DeleteSnapshot(ctx context.Context, tenant, id string) error
}

// ArtifactPresigner is implemented by workspace engines with an object
// store (workspace.Service): Agent Sandbox's download_url is then a
// presigned URL of the store.
type ArtifactPresigner interface {
	PresignArtifact(ctx context.Context, sb sandbox.Sandbox, rel string, ttl time.Duration) (string, error)
}

func (a *api) workspacesOrFail(w http.ResponseWriter) Workspaces {
	if a.cfg.Workspaces == nil {
		WriteError(w, http.StatusBadRequest, "workspaces_unavailable", "this gateway keeps no workspaces")
	}
	return a.cfg.Workspaces
}

type workspaceRequest struct {
	Name string `json:"name"`
}

// createWorkspace answers POST /v1/workspaces {"name"}.
func (a *api) createWorkspace(w http.ResponseWriter, r *http.Request) {
	ws := a.workspacesOrFail(w)
	if ws == nil {
		return
	}
	var req workspaceRequest
	if status, code, msg := DecodeJSON(w, r, &req); status != 0 {
		WriteError(w, status, code, msg)
		return
	}
	in, err := ws.CreateWorkspace(r.Context(), principal(r).Tenant, req.Name)
	if err != nil {
		WriteGatewayError(w, err)
		return
	}
	w.Header().Set("Location", "/v1/workspaces/"+in.Name)
	_ = WriteJSON(w, http.StatusCreated, in)
}

// listWorkspaces answers GET /v1/workspaces: the caller's workspaces.
func (a *api) listWorkspaces(w http.ResponseWriter, r *http.Request) {
	ws := a.workspacesOrFail(w)
	if ws == nil {
		return
	}
	all, err := ws.ListWorkspaces(r.Context(), principal(r).Tenant)
	if err != nil {
		WriteGatewayError(w, err)
		return
	}
	_ = WriteJSON(w, http.StatusOK, map[string]any{"workspaces": all})
}

// deleteWorkspace answers DELETE /v1/workspaces/{name}.
func (a *api) deleteWorkspace(w http.ResponseWriter, r *http.Request) {
	ws := a.workspacesOrFail(w)
	if ws == nil {
		return
	}
	if err := ws.DeleteWorkspace(r.Context(), principal(r).Tenant, chi.URLParam(r, "name")); err != nil {
		WriteGatewayError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// createSnapshot answers POST /v1/sessions/{id}/snapshots: a consistent
// copy of the session's workspace, its processes frozen for the instant
// the copy needs.
func (a *api) createSnapshot(w http.ResponseWriter, r *http.Request) {
	ws := a.workspacesOrFail(w)
	if ws == nil {
		return
	}
	p := principal(r)
	s, err := a.cfg.Sessions.Get(r.Context(), p, chi.URLParam(r, "id"))
	if err != nil {
		WriteGatewayError(w, err)
		return
	}
	sb := s.Sandbox()
	if !s.Live() || sb == nil {
		WriteError(w, http.StatusConflict, "session_not_running", "the session is not running; a failed session has no workspace to snapshot")
		return
	}
	info, err := ws.Snapshot(r.Context(), p.Tenant, s.ID, sb, s.Status() == gateway.StatusStopped)
	if err != nil {
		WriteGatewayError(w, err)
		return
	}
	_ = WriteJSON(w, http.StatusCreated, info)
}

// keepWorkspace reads DELETE /v1/sessions/{id}'s keepWorkspace query
// parameter (default true); ok is false once it answered an error.
func keepWorkspace(w http.ResponseWriter, r *http.Request) (keep, ok bool) {
	return boolQuery(w, r, "keepWorkspace", true)
}

// boolQuery reads query parameter name, true or false, given at most
// once (def when absent); ok is false once it answered an error.
func boolQuery(w http.ResponseWriter, r *http.Request, name string, def bool) (v, ok bool) {
	vs, set := r.URL.Query()[name]
	if !set {
		return def, true
	}
	v, err := strconv.ParseBool(vs[0])
	if len(vs) != 1 || err != nil {
		WriteError(w, http.StatusBadRequest, "invalid_field", name+" is true or false")
		return false, false
	}
	return v, true
}

// listSnapshots answers GET /v1/snapshots[?session=ID]: the caller's
// snapshots, newest first.
func (a *api) listSnapshots(w http.ResponseWriter, r *http.Request) {
	ws := a.workspacesOrFail(w)
	if ws == nil {
		return
	}
	q := r.URL.Query()
	if v, set := q["session"]; set && (len(v) != 1 || v[0] == "" || len(v[0]) > 128) {
		WriteError(w, http.StatusBadRequest, "invalid_session", "session is given once, as a session id (at most 128 characters)")
		return
	}
	all, err := ws.ListSnapshots(r.Context(), principal(r).Tenant, q.Get("session"))
	if err != nil {
		WriteGatewayError(w, err)
		return
	}
	_ = WriteJSON(w, http.StatusOK, map[string]any{"snapshots": all})
}

// deleteSnapshot answers DELETE /v1/snapshots/{id}.
func (a *api) deleteSnapshot(w http.ResponseWriter, r *http.Request) {
	ws := a.workspacesOrFail(w)
	if ws == nil {
		return
	}
	if err := ws.DeleteSnapshot(r.Context(), principal(r).Tenant, chi.URLParam(r, "id")); err != nil {
		WriteGatewayError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
