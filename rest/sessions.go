package rest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sandbox"
	"github.com/sandgate/sandgate/workspace"
)

type createRequest struct {
	// Name names the session, unique among the tenant's live sessions.
	Name     *string        `json:"name"`
	TTL      *int           `json:"ttl"`
	Image    *string        `json:"image"`
	Metadata map[string]any `json:"metadata"`
	// Labels is another name for Metadata (the name seed 002 used).
	Labels       map[string]any           `json:"labels"`
	SSHPublicKey *string                  `json:"sshPublicKey"`
	Resources    *gateway.ResourceRequest `json:"resources"`
	// Egress is the allow-list of destinations (empty: no network).
	Egress gateway.EgressEntries `json:"egress"`
	// EgressMode is "deny" (the default: a connection outside Egress is
	// refused) or "ask" (it waits for approval: approvals.go).
	EgressMode *string `json:"egressMode"`
	// Secrets name operator secrets: "NAME" for the environment, or
	// {"name", "hosts", "header", "format"} for a header the egress proxy
	// sets on requests to those hosts.
	Secrets []gateway.SecretRef `json:"secrets"`
	// Workspace names a workspace (POST /v1/workspaces) to mount at
	// /workspace; FromSnapshot starts from a snapshot's files instead.
	Workspace    *string `json:"workspace"`
	FromSnapshot *string `json:"fromSnapshot"`
}

type sessionJSON struct {
	SessionID string `json:"sessionId"`
	gateway.View
	SSH sshJSON `json:"ssh"`
	// WorkspaceSync is the object-store sync of a named workspace.
	WorkspaceSync *workspace.SyncState `json:"workspaceSync,omitempty"`
	// Isolation and Unenforced say what the sandbox does not enforce
	// (Config.Isolation, Config.Unenforced).
	Isolation  string   `json:"isolation,omitempty"`
	Unenforced []string `json:"unenforced,omitempty"`
}

type sshJSON struct {
	Username       string   `json:"username"`
	Password       string   `json:"password,omitempty"`
	HostKeys       []string `json:"hostKeys"`
	KnownHostsLine string   `json:"knownHostsLine"`
	ConnectPath    string   `json:"connectPath"`
}

type listJSON struct {
	Sessions []sessionJSON `json:"sessions"`
	Total    int           `json:"total"`
	Limit    int           `json:"limit"`
	Offset   int           `json:"offset"`
}

func (a *api) render(s *gateway.Session, password string) sessionJSON {
	snap := s.Snapshot()
	known := ""
	if len(a.cfg.HostKeys) > 0 {
		known = "* " + a.cfg.HostKeys[0]
	}
	var sync *workspace.SyncState
	if a.cfg.Workspaces != nil {
		sync = a.cfg.Workspaces.SessionSync(snap.ID)
	}
	return sessionJSON{
		SessionID: snap.ID, View: snap.View, WorkspaceSync: sync,
		Isolation: a.cfg.Isolation, Unenforced: a.cfg.Unenforced,
		SSH: sshJSON{
			Username: a.cfg.SSHUsername, Password: password,
			HostKeys: a.cfg.HostKeys, KnownHostsLine: known,
			ConnectPath: "/v1/sessions/" + snap.ID,
		},
	}
}

func (a *api) create(w http.ResponseWriter, r *http.Request) {
	var req createRequest
	if status, code, msg := DecodeJSON(w, r, &req); status != 0 {
		WriteError(w, status, code, msg)
		return
	}
	var cp gateway.CreateParams
	if req.TTL != nil {
		if *req.TTL < gateway.MinTTL || *req.TTL > gateway.MaxTTL {
			WriteError(w, http.StatusBadRequest, "invalid_ttl",
				fmt.Sprintf("ttl must be between %d and %d seconds, got %d", gateway.MinTTL, gateway.MaxTTL, *req.TTL))
			return
		}
		cp.TTL = *req.TTL
	}
	if req.Image != nil {
		cp.Image = *req.Image
	}
	if req.Name != nil {
		if *req.Name == "" {
			WriteError(w, http.StatusBadRequest, "invalid_name", "name must not be empty; leave it out for no name")
			return
		}
		cp.Name = *req.Name
	}
	if req.SSHPublicKey != nil {
		cp.SSHPublicKey = *req.SSHPublicKey
	}
	cp.Metadata = req.Metadata
	if req.Labels != nil {
		if req.Metadata != nil {
			WriteError(w, http.StatusBadRequest, "invalid_field", `give "metadata" or "labels", not both: labels is another name for metadata`)
			return
		}
		cp.Metadata = req.Labels
	}
	cp.Resources = req.Resources
	cp.Egress, cp.Secrets = req.Egress, req.Secrets
	if req.EgressMode != nil {
		if *req.EgressMode == "" {
			WriteError(w, http.StatusBadRequest, "invalid_egress_mode", `egressMode must be "deny" or "ask"`)
			return
		}
		cp.EgressMode = *req.EgressMode
	}
	for _, f := range []struct {
		v   *string
		dst *string
		n   string
	}{{req.Workspace, &cp.Workspace.Name, "workspace"}, {req.FromSnapshot, &cp.Workspace.FromSnapshot, "fromSnapshot"}} {
		if f.v != nil {
			if *f.v == "" {
				WriteError(w, http.StatusBadRequest, "invalid_field", f.n+" must not be empty; leave it out for a fresh workspace")
				return
			}
			*f.dst = *f.v
		}
	}
	if keys, ok := r.Header[idempotencyKeyHeader]; ok {
		if len(keys) != 1 || keys[0] == "" {
			WriteError(w, http.StatusBadRequest, "invalid_idempotency_key", "send one non-empty Idempotency-Key header")
			return
		}
		cp.IdempotencyKey = keys[0]
	}
	p := principal(r)
	if r.Context().Err() != nil { // the client is gone: make nothing nobody will hear of
		a.cfg.Log.InfoContext(r.Context(), "session_create_abandoned", "tenant", p.Tenant)
		return
	}
	// The steps of a create show whether it found a warm sandbox, and so
	// how busy the gateway's other tenants are: only the total is shown,
	// unless the operator asks for the steps (serve --server-timing).
	tr, ctx := sandbox.NewTrace(), r.Context()
	if a.cfg.ServerTiming {
		ctx = sandbox.WithTrace(ctx, tr)
	}
	s, pw, err := a.cfg.Sessions.Create(ctx, p, cp)
	if err != nil {
		WriteGatewayError(w, err)
		return
	}
	w.Header().Set("Location", "/v1/sessions/"+s.ID)
	auditSessionOf(r, s.ID)
	if pw == "" { // an earlier create with this Idempotency-Key made it
		s.Touch(time.Now())
		w.Header().Set("Idempotent-Replayed", "true")
		_ = WriteJSON(w, http.StatusOK, a.render(s, ""))
		return
	}
	w.Header().Set("Server-Timing", serverTiming(tr))
	// Nobody else can learn this session's password: if the answer cannot
	// be delivered, the session would hold a quota slot for nothing.
	err = r.Context().Err()
	if err == nil {
		err = FlushJSON(w, http.StatusCreated, a.render(s, pw))
	}
	if err != nil {
		Rollback(r, a.cfg.Sessions, a.cfg.Log, p, s.ID, err)
	}
}

// idempotencyKeyHeader is the canonical name of the Idempotency-Key header.
const idempotencyKeyHeader = "Idempotency-Key"

// Rollback deletes the session id that a create (r's) made for p through
// sessions but could not tell the client about.
func Rollback(r *http.Request, sessions Sessions, log *slog.Logger, p gateway.Principal, id string, cause error) {
	ctx := context.WithoutCancel(r.Context())
	if err := sessions.Delete(ctx, p, id); err != nil && !errors.Is(err, gateway.ErrNotFound) {
		log.ErrorContext(r.Context(), "session_create_rollback_failed", "session", id, "tenant", p.Tenant, "cause", cause, "err", err)
		return
	}
	log.WarnContext(r.Context(), "session_create_rolled_back", "session", id, "tenant", p.Tenant, "cause", cause)
}

// DecodeJSON reads a bounded JSON object body into v, rejecting unknown
// fields and trailing data. The body is JSON whatever Content-Type says
// (curl -d sends a form type). It returns a status, code and message on error.
func DecodeJSON(w http.ResponseWriter, r *http.Request, v any) (int, string, string) {
	var raw bytes.Buffer // at most MaxBodyBytes+1: the reader below stops there
	body := http.MaxBytesReader(w, r.Body, MaxBodyBytes)
	dec := json.NewDecoder(io.TeeReader(body, &raw))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if errors.Is(err, io.EOF) {
		return 0, "", "" // an empty body means all defaults
	}
	if err == nil {
		if dec.More() {
			return http.StatusBadRequest, "invalid_json", "body must hold a single JSON object"
		}
		if _, err := dec.Token(); err != io.EOF {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				return http.StatusRequestEntityTooLarge, "body_too_large", fmt.Sprintf("body exceeds %d bytes", MaxBodyBytes)
			}
			return http.StatusBadRequest, "invalid_json", "body must hold a single JSON object"
		}
		if bytes.Equal(bytes.TrimSpace(raw.Bytes()), []byte("null")) {
			return http.StatusBadRequest, "invalid_json", "body must be a JSON object"
		}
		if k := inexactKey(raw.Bytes(), v); k != "" {
			return http.StatusBadRequest, "unknown_field", "unknown field " + strconv.Quote(k)
		}
		return 0, "", ""
	}
	var mbe *http.MaxBytesError
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &mbe):
		return http.StatusRequestEntityTooLarge, "body_too_large", fmt.Sprintf("body exceeds %d bytes", MaxBodyBytes)
	case errors.As(err, &te):
		field := te.Field
		if field == "" {
			return http.StatusBadRequest, "invalid_json", "body must be a JSON object"
		}
		return http.StatusBadRequest, "invalid_field", fmt.Sprintf("field %q must be %s", field, JSONKind(te.Type.Kind().String()))
	case errors.As(err, &se), errors.Is(err, io.ErrUnexpectedEOF):
		return http.StatusBadRequest, "invalid_json", "body is not valid JSON"
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		field := strings.TrimPrefix(err.Error(), "json: unknown field ")
		return http.StatusBadRequest, "unknown_field", "unknown field " + field
	}
	return http.StatusBadRequest, "invalid_json", "body is not valid JSON"
}

// inexactKey returns the first top-level key of the JSON object data that
// is not exactly one of the json names of v's struct fields, or "".
// encoding/json matches names without regard to case; the API does not.
func inexactKey(data []byte, v any) string {
	var obj map[string]json.RawMessage
	if json.Unmarshal(data, &obj) != nil {
		return ""
	}
	t := reflect.TypeOf(v).Elem()
	names := map[string]bool{}
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		names[name] = true
	}
	for _, k := range slices.Sorted(maps.Keys(obj)) {
		if !names[k] {
			return k
		}
	}
	return ""
}

// JSONKind names, for a client, the JSON type of a Go kind ("an integer")
// a field must have.
func JSONKind(goKind string) string {
	switch goKind {
	case "int", "int64":
		return "an integer"
	case "string":
		return "a string"
	case "float64":
		return "a number"
	case "map":
		return "an object"
	}
	return "of another type"
}

func (a *api) list(w http.ResponseWriter, r *http.Request) {
	limit, err := queryInt(r, "limit", 50, 1, 100)
	if err != nil {
		WriteError(w, http.StatusBadRequest, "invalid_limit", err.Error())
		return
	}
	offset, err := queryInt(r, "offset", 0, 0, 1<<31-1)
	if err != nil {
		WriteError(w, http.StatusBadRequest, "invalid_offset", err.Error())
		return
	}
	name, named := r.URL.Query()["name"]
	if named && (len(name) != 1 || name[0] == "") {
		WriteError(w, http.StatusBadRequest, "invalid_name", "name must be given once, not empty")
		return
	}
	var ss []*gateway.Session
	var total int
	if named {
		ss, total = ListNamed(r.Context(), a.cfg.Sessions, principal(r), name[0], limit, offset)
	} else {
		ss, total = a.cfg.Sessions.List(r.Context(), principal(r), limit, offset)
	}
	out := listJSON{Sessions: make([]sessionJSON, 0, len(ss)), Total: total, Limit: limit, Offset: offset}
	for _, s := range ss {
		out.Sessions = append(out.Sessions, a.render(s, ""))
	}
	_ = WriteJSON(w, http.StatusOK, out)
}

// filteredSessions is a Sessions that filters its listings itself
// (gateway.Manager).
type filteredSessions interface {
	ListFiltered(ctx context.Context, p gateway.Principal, f gateway.ListFilter, limit, offset int) ([]*gateway.Session, int)
}

// ListNamed lists p's session of sessions called name: 0 or 1 of them.
func ListNamed(ctx context.Context, sessions Sessions, p gateway.Principal, name string, limit, offset int) ([]*gateway.Session, int) {
	if fs, ok := sessions.(filteredSessions); ok {
		return fs.ListFiltered(ctx, p, gateway.ListFilter{Name: name}, limit, offset)
	}
	all, _ := sessions.List(ctx, p, 1<<31-1, 0)
	named := gateway.SelectNamed(all, name)
	if offset >= len(named) {
		return []*gateway.Session{}, len(named)
	}
	return named[offset:min(offset+limit, len(named))], len(named)
}

// queryInt reads the integer query parameter name, def when it is absent.
// A parameter given empty (?offset=) or more than once is an error.
func queryInt(r *http.Request, name string, def, lo, hi int) (int, error) {
	vs, ok := r.URL.Query()[name]
	if !ok {
		return def, nil
	}
	if len(vs) != 1 {
		return 0, fmt.Errorf("%s must be given once", name)
	}
	n, err := strconv.Atoi(vs[0])
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("%s must be an integer between %d and %d", name, lo, hi)
	}
	return n, nil
}

func (a *api) get(w http.ResponseWriter, r *http.Request) {
	s, err := a.cfg.Sessions.Get(r.Context(), principal(r), chi.URLParam(r, "id"))
	if err != nil {
		WriteGatewayError(w, err)
		return
	}
	s.Touch(time.Now())
	_ = WriteJSON(w, http.StatusOK, a.render(s, ""))
}

type updateRequest struct {
	TTL    *int                   `json:"ttl"`
	Egress *gateway.EgressEntries `json:"egress"`
}

// update applies a PATCH: {"ttl": N} makes the session expire N seconds
// from now; {"egress": [...]} replaces its egress allow-list. It counts as
// activity, like a GET.
func (a *api) update(w http.ResponseWriter, r *http.Request) {
	var req updateRequest
	if status, code, msg := DecodeJSON(w, r, &req); status != 0 {
		WriteError(w, status, code, msg)
		return
	}
	s, err := a.cfg.Sessions.Update(r.Context(), principal(r), chi.URLParam(r, "id"), gateway.UpdateParams{TTL: req.TTL, Egress: (*[]string)(req.Egress)})
	if err != nil {
		WriteGatewayError(w, err)
		return
	}
	s.Touch(time.Now())
	_ = WriteJSON(w, http.StatusOK, a.render(s, ""))
}

func (a *api) delete(w http.ResponseWriter, r *http.Request) {
	keep, ok := keepWorkspace(w, r)
	if !ok {
		return
	}
	discard, ok := boolQuery(w, r, "discard", false)
	if !ok {
		return
	}
	p, id := principal(r), chi.URLParam(r, "id")
	if res, ok := a.cfg.Sessions.(sessionResolver); ok {
		id = res.Resolve(r.Context(), p, id) // a name: the trail and the workspace take the id
		auditSessionOf(r, id)
	}
	ws := a.cfg.Workspaces
	if ws != nil {
		// Only the caller's own session is saved or marked.
		if _, err := a.cfg.Sessions.Get(r.Context(), p, id); err != nil {
			WriteGatewayError(w, err)
			return
		}
		switch {
		case !keep: // its workspace goes when it ends
			ws.DropOnEnd(id, true)
		case discard: // it ends without saving
			ws.DiscardOnEnd(id, true)
		default:
			// Saved before it ends: a workspace that cannot be saved
			// keeps the session, and so its files (workspace_sync_failed).
			if err := ws.FinalSync(r.Context(), id); err != nil {
				WriteGatewayError(w, err)
				return
			}
		}
	}
	if err := a.cfg.Sessions.Delete(r.Context(), p, id); err != nil {
		if ws != nil {
			ws.DropOnEnd(id, false)
			ws.DiscardOnEnd(id, false)
		}
		WriteGatewayError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// serverTiming renders a create's trace as a Server-Timing header: each
// step in milliseconds, in the order recorded, then the total (a trace
// the create did not carry: the total alone). Steps named *_bg ran beside
// others; init.* are the sandbox init's own, beside the gateway's steps
// from init_fork to init_handshake.
func serverTiming(tr *sandbox.Trace) string {
	steps, total := tr.Steps()
	var b strings.Builder
	for _, st := range steps {
		fmt.Fprintf(&b, "%s;dur=%.3f, ", st.Name, float64(st.Dur.Microseconds())/1000)
	}
	fmt.Fprintf(&b, "total;dur=%.3f", float64(total.Microseconds())/1000)
	return b.String()
}
