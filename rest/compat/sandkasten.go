package compat

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/sandgate/sandgate/dataplane"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/rest"
)

// Sandkasten's API (seed 003), under /compat/sandkasten:
//
//	POST   /v1/sessions                 {"image","ttl_seconds"} -> session info (201)
//	GET    /v1/sessions                 -> [session info]
//	GET    /v1/sessions/{id}            -> session info
//	DELETE /v1/sessions/{id}            -> {"ok": true}
//	POST   /v1/sessions/{id}/exec       {"cmd","timeout_ms"} -> {"exit_code","cwd","output","truncated","duration_ms"}
//	POST   /v1/sessions/{id}/fs/write   {"path","content_base64"|"text"} -> {"ok": true}
//	GET    /v1/sessions/{id}/fs/read?path=P&max_bytes=N -> {"content_base64","truncated"}
//
// Sessions are native sessions; exec runs in the session's persistent
// shell "sandkasten" of the native shells engine, with stderr merged into
// stdout; the fs routes go through the native files engine (the sandbox's
// own SFTP server). Each exec, read and write extends the lease: the
// session then expires its ttl from now. The seed gives no HTTP error
// shape, so errors use the native envelope.

// Sandkasten's defaults, from the seed.
const (
	// sandkastenTTL is session_ttl_seconds, for a create without one.
	sandkastenTTL = 1800
	// sandkastenExecTimeout is an exec's timeout_ms when none is given.
	sandkastenExecTimeout = 30 * time.Second
	// sandkastenReadBytes is a read's max_bytes when none is given.
	sandkastenReadBytes = 1 << 20
	// sandkastenMaxReadBytes caps max_bytes (a larger one is lowered).
	sandkastenMaxReadBytes = 16 << 20
	// sandkastenMaxWriteBody bounds the body of fs/write (base64 of up to
	// ~24 MiB).
	sandkastenMaxWriteBody = 32 << 20
	// sandkastenShell names the persistent shell exec runs in.
	sandkastenShell = "sandkasten"
	// sandkastenWorkspace is where the seed's sandboxes keep their files;
	// the fs routes read a path under it as relative to the workspace.
	sandkastenWorkspace = "/workspace"
)

// sandkastenAPI serves Sandkasten's API.
type sandkastenAPI struct {
	d *Deps

	mu   sync.Mutex
	cwds map[string]string // session id -> its shell's directory after the last exec
}

func newSandkasten(d *Deps) *sandkastenAPI {
	return &sandkastenAPI{d: d, cwds: map[string]string{}}
}

func (x *sandkastenAPI) mount(r chi.Router) {
	r.Post("/v1/sessions", x.create)
	r.Get("/v1/sessions", x.list)
	r.Get("/v1/sessions/{id}", x.get)
	r.Delete("/v1/sessions/{id}", x.destroy)
	r.Post("/v1/sessions/{id}/exec", x.exec)
	r.Post("/v1/sessions/{id}/fs/write", x.write)
	r.Get("/v1/sessions/{id}/fs/read", x.read)
}

// sandkastenSession is the seed's session row, less its container id.
type sandkastenSession struct {
	ID     string `json:"id"`
	Image  string `json:"image"`
	Status string `json:"status"` // running | expired | destroyed | crashed
	// Cwd is the persistent shell's directory, once an exec has run.
	Cwd string `json:"cwd,omitempty"`
	// The times are absent only for a session that ended under an older
	// gateway, whose tombstone did not keep them.
	CreatedAt    time.Time `json:"created_at,omitzero"`
	ExpiresAt    time.Time `json:"expires_at,omitzero"`
	LastActivity time.Time `json:"last_activity,omitzero"`
}

type sandkastenCreateRequest struct {
	Image      *string `json:"image"`
	TTLSeconds *int    `json:"ttl_seconds"`
}

type sandkastenExecRequest struct {
	Cmd       *string `json:"cmd"`
	TimeoutMs *int64  `json:"timeout_ms"`
}

type sandkastenExecResult struct {
	ExitCode   int    `json:"exit_code"`
	Cwd        string `json:"cwd"`
	Output     string `json:"output"`
	Truncated  bool   `json:"truncated"`
	DurationMs int64  `json:"duration_ms"`
}

type sandkastenWriteRequest struct {
	Path          *string `json:"path"`
	ContentBase64 *string `json:"content_base64"`
	// Text is the content as text, instead of content_base64 (the SDK's
	// write takes a string or bytes).
	Text *string `json:"text"`
}

type sandkastenReadResult struct {
	ContentBase64 string `json:"content_base64"`
	Truncated     bool   `json:"truncated"`
}

type sandkastenOK struct {
	OK bool `json:"ok"`
}

// sandkastenStatus maps a native status to the seed's.
func sandkastenStatus(native string) string {
	switch native {
	case gateway.StatusDeleted:
		return "destroyed"
	case gateway.StatusFailed:
		return "crashed"
	}
	return native // running, expired
}

func (x *sandkastenAPI) render(s *gateway.Session) sandkastenSession {
	snap := s.Snapshot()
	x.mu.Lock()
	cwd := x.cwds[s.ID]
	x.mu.Unlock()
	return sandkastenSession{
		ID: snap.ID, Image: snap.Image, Status: sandkastenStatus(snap.Status), Cwd: cwd,
		CreatedAt: snap.CreatedAt, ExpiresAt: snap.ExpiresAt, LastActivity: snap.LastActivityAt,
	}
}

// create serves POST /v1/sessions.
func (x *sandkastenAPI) create(w http.ResponseWriter, r *http.Request) {
	var req sandkastenCreateRequest
	if status, code, msg := rest.DecodeJSON(w, r, &req); status != 0 {
		rest.WriteError(w, status, code, msg)
		return
	}
	cp := gateway.CreateParams{TTL: sandkastenTTL}
	if req.TTLSeconds != nil && *req.TTLSeconds != 0 {
		cp.TTL = *req.TTLSeconds
	}
	if req.Image != nil {
		cp.Image = *req.Image
	}
	p := principal(r)
	if r.Context().Err() != nil {
		return
	}
	s, _, err := x.d.Sessions.Create(r.Context(), p, cp)
	if err != nil {
		writeCompatError(w, err)
		return
	}
	x.d.Log.InfoContext(r.Context(), "compat_session_created", "api", "sandkasten", "session", s.ID, "tenant", p.Tenant)
	err = r.Context().Err()
	if err == nil {
		err = rest.FlushJSON(w, http.StatusCreated, x.render(s))
	}
	if err != nil {
		rest.Rollback(r, x.d.Sessions, x.d.Log, p, s.ID, err)
	}
}

// list serves GET /v1/sessions: all the caller's sessions, as an array.
func (x *sandkastenAPI) list(w http.ResponseWriter, r *http.Request) {
	const page = 100
	p := principal(r)
	out := []sandkastenSession{}
	for offset := 0; ; offset += page {
		ss, total := x.d.Sessions.List(r.Context(), p, page, offset)
		for _, s := range ss {
			out = append(out, x.render(s))
		}
		if len(ss) == 0 || offset+len(ss) >= total {
			break
		}
	}
	_ = rest.WriteJSON(w, http.StatusOK, out)
}

// get serves GET /v1/sessions/{id}. A session that ended (the gateway's
// tombstone of it still there: serve --tombstone-ttl) is the seed's row
// of it, status expired, destroyed or crashed, as the seed's store keeps
// it; only one the gateway knows nothing of is 404.
func (x *sandkastenAPI) get(w http.ResponseWriter, r *http.Request) {
	s, err := x.d.Sessions.Get(r.Context(), principal(r), chi.URLParam(r, "id"))
	if t, ok := tombstoneOf(err); ok {
		_ = rest.WriteJSON(w, http.StatusOK, renderGone(t))
		return
	}
	if err != nil {
		writeCompatError(w, err)
		return
	}
	_ = rest.WriteJSON(w, http.StatusOK, x.render(s))
}

// destroy serves DELETE /v1/sessions/{id}. Destroying a session that has
// ended already (expired, destroyed) succeeds, as the seed's destroy of a
// row that is no longer running does: the SDK's `finally: destroy()`
// after a session expired is no error.
func (x *sandkastenAPI) destroy(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	if err := x.d.Sessions.Delete(r.Context(), principal(r), id); err != nil {
		if _, gone := tombstoneOf(err); !gone {
			writeCompatError(w, err)
			return
		}
	}
	x.forget(id)
	_ = rest.WriteJSON(w, http.StatusOK, sandkastenOK{OK: true})
}

// tombstoneOf is the tombstone in err, the session manager's answer for a
// session that ended a short while ago.
func tombstoneOf(err error) (gateway.Tombstone, bool) {
	var ge *gateway.GoneError
	if errors.As(err, &ge) {
		return ge.Tombstone, true
	}
	return gateway.Tombstone{}, false
}

// goneStatus is the seed's status of a session that ended: expired (its
// ttl, or sandgate's idle timeout, ran out), crashed (it had failed) or
// destroyed (deleted, or ended with a gateway that kept no sessions).
func goneStatus(t gateway.Tombstone) string {
	switch t.Reason {
	case gateway.GoneTTL, gateway.GoneIdle:
		return "expired"
	case gateway.GoneFailed:
		return "crashed"
	}
	return "destroyed"
}

// renderGone is the seed's row of a session that ended, from its
// tombstone; an expired session's expires_at is when it expired.
func renderGone(t gateway.Tombstone) sandkastenSession {
	out := sandkastenSession{ID: t.ID, Image: t.Image, Status: goneStatus(t),
		CreatedAt: t.CreatedAt, ExpiresAt: t.ExpiresAt, LastActivity: t.LastActivityAt}
	if out.Status == "expired" {
		out.ExpiresAt = t.At
	}
	return out
}

// session is Deps.session for the routes that work in a session (exec,
// fs): one that ended answers 410 with its state as the code
// (session_expired, session_destroyed, session_crashed), not 404.
func (x *sandkastenAPI) session(w http.ResponseWriter, r *http.Request) (*gateway.Session, bool) {
	s, err := x.d.Sessions.Get(r.Context(), principal(r), chi.URLParam(r, "id"))
	if t, ok := tombstoneOf(err); ok {
		rest.WriteError(w, http.StatusGone, "session_"+goneStatus(t), t.Message())
		return nil, false
	}
	if err != nil {
		writeCompatError(w, err)
		return nil, false
	}
	if !s.Live() {
		// A failed session not yet tombstoned reads as crashed (render):
		// it answers as one, as its tombstone will.
		if snap := s.Snapshot(); snap.Status == gateway.StatusFailed {
			msg := "the session crashed"
			if snap.StatusReason != "" {
				msg += ": " + snap.StatusReason
			}
			rest.WriteError(w, http.StatusGone, "session_crashed", msg)
			return nil, false
		}
		rest.WriteError(w, http.StatusConflict, "session_not_running", "the session is not running; delete it")
		return nil, false
	}
	if err := holdSession(r.Context(), s); err != nil {
		writeCompatError(w, err)
		return nil, false
	}
	return s, true
}

// setCwd records the session's shell directory; the record goes when the
// session ends, however it ends.
func (x *sandkastenAPI) setCwd(s *gateway.Session, cwd string) {
	x.mu.Lock()
	_, known := x.cwds[s.ID]
	x.cwds[s.ID] = cwd
	x.mu.Unlock()
	if known {
		return
	}
	if _, ok := s.AddConn(func() { x.forget(s.ID) }); !ok {
		x.forget(s.ID)
	}
}

func (x *sandkastenAPI) forget(id string) {
	x.mu.Lock()
	delete(x.cwds, id)
	x.mu.Unlock()
}

// extendLease makes the session expire its ttl from now, as the seed's
// exec, read and write do; it does so even when the client has gone, the
// operation having run.
func (x *sandkastenAPI) extendLease(r *http.Request, s *gateway.Session) {
	ttl := s.Snapshot().TTL
	ctx := context.WithoutCancel(r.Context())
	if _, err := x.d.Sessions.Update(ctx, principal(r), s.ID, gateway.UpdateParams{TTL: &ttl}); err != nil {
		x.d.Log.WarnContext(r.Context(), "compat_lease_not_extended", "api", "sandkasten", "session", s.ID, "err", err)
	}
}

// exec serves POST /v1/sessions/{id}/exec: cmd runs in the session's
// persistent shell, so cd, variables and functions persist; its stderr is
// merged into its stdout, in order, as the seed's PTY merges them. A
// timed-out command has exit code 124 and kills the shell; the next exec
// starts a new one from the state saved after the last command.
func (x *sandkastenAPI) exec(w http.ResponseWriter, r *http.Request) {
	s, ok := x.session(w, r)
	if !ok {
		return
	}
	var req sandkastenExecRequest
	if status, code, msg := rest.DecodeJSON(w, r, &req); status != 0 {
		rest.WriteError(w, status, code, msg)
		return
	}
	if req.Cmd == nil || strings.TrimSpace(*req.Cmd) == "" {
		rest.WriteError(w, http.StatusBadRequest, "invalid_command", "cmd is required")
		return
	}
	if strings.ContainsRune(*req.Cmd, 0) {
		rest.WriteError(w, http.StatusBadRequest, "invalid_command", "cmd may not hold NUL characters")
		return
	}
	timeout := sandkastenExecTimeout
	if req.TimeoutMs != nil && *req.TimeoutMs != 0 {
		if *req.TimeoutMs < 0 {
			rest.WriteError(w, http.StatusBadRequest, "invalid_timeout", "timeout_ms must not be negative")
			return
		}
		timeout = x.d.Plane.Bounds.MaxTimeout // at most; compared in ms, as the conversion wraps
		if *req.TimeoutMs < timeout.Milliseconds() {
			timeout = time.Duration(*req.TimeoutMs) * time.Millisecond
		}
	}
	dreq := dataplane.Request{
		// The braces keep the command in the shell itself (cd persists)
		// and send its stderr where its stdout goes.
		Command: "{ " + *req.Cmd + "\n} 2>&1",
		Timeout: timeout, MaxOutputBytes: min(rest.DefaultCommandOutput, x.d.Plane.Bounds.MaxOutputBytes),
	}
	release, err := x.d.Plane.Budget.Acquire(r.Context(), s.Tenant, dataplane.CommandCost(dreq.MaxOutputBytes, false))
	if err != nil {
		if r.Context().Err() == nil {
			rest.WriteGatewayError(w, err) // the budget's errors say 429 or 503
		}
		return
	}
	defer release()
	res, err := x.d.Plane.Shells.Run(r.Context(), s.ID, s, sandkastenShell, dreq)
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			x.d.Log.WarnContext(r.Context(), "compat_exec_failed", "api", "sandkasten", "session", s.ID, "err", err)
		}
		rest.WriteGatewayError(w, dataplane.Failure(err, "the command could not be started"))
		return
	}
	x.extendLease(r, s)
	if res.Cwd != "" {
		x.setCwd(s, res.Cwd)
	}
	out := sandkastenExecResult{Cwd: res.Cwd, Output: outputText(res.Stdout) + outputText(res.Stderr),
		Truncated: res.Truncated(), DurationMs: res.Duration.Milliseconds()}
	switch {
	case res.ExitCode != nil:
		out.ExitCode = *res.ExitCode
	default: // the shell was killed by a signal: its status as the shell shows it
		out.ExitCode = 128 + signalNumber(res.ExitSignal)
	}
	_ = rest.WriteJSON(w, http.StatusOK, out)
}

// sandkastenPath checks a path given to the fs routes: the seed's
// /workspace/... is read as relative to the session's workspace (which
// the linux driver mounts at /workspace, and the workdir driver serves as
// its root), other paths as the native files routes read them.
func sandkastenPath(p string) (string, error) {
	c, err := dataplane.CheckPath(p)
	if err != nil {
		return "", err
	}
	switch {
	case c == sandkastenWorkspace:
		return ".", nil
	case strings.HasPrefix(c, sandkastenWorkspace+"/"):
		return strings.TrimPrefix(c, sandkastenWorkspace+"/"), nil
	}
	return c, nil
}

// write serves POST /v1/sessions/{id}/fs/write: the file is written
// atomically, its parent directories made.
func (x *sandkastenAPI) write(w http.ResponseWriter, r *http.Request) {
	s, ok := x.session(w, r)
	if !ok {
		return
	}
	var req sandkastenWriteRequest
	if status, code, msg := decodeBigJSON(w, r, &req, sandkastenMaxWriteBody); status != 0 {
		rest.WriteError(w, status, code, msg)
		return
	}
	if req.Path == nil {
		rest.WriteError(w, http.StatusBadRequest, "invalid_path", "path is required")
		return
	}
	p, err := sandkastenPath(*req.Path)
	if err != nil {
		x.d.fileError(w, r, err)
		return
	}
	var data []byte
	switch {
	case (req.ContentBase64 == nil) == (req.Text == nil):
		rest.WriteError(w, http.StatusBadRequest, "invalid_content", "give either content_base64 or text")
		return
	case req.Text != nil:
		data = []byte(*req.Text)
	default:
		if data, err = base64.StdEncoding.DecodeString(*req.ContentBase64); err != nil {
			rest.WriteError(w, http.StatusBadRequest, "invalid_content", "content_base64 is not valid base64")
			return
		}
	}
	fsys, ok := x.d.openFS(w, r, s)
	if !ok {
		return
	}
	defer fsys.Close()
	_, _, err = fsys.Write(p, bytes.NewReader(data), dataplane.WriteOptions{Mkdirs: true, MaxBytes: x.d.Plane.Bounds.MaxFileBytes})
	x.extendLease(r, s)
	if err != nil {
		x.d.fileError(w, r, err)
		return
	}
	_ = rest.WriteJSON(w, http.StatusOK, sandkastenOK{OK: true})
}

// read serves GET /v1/sessions/{id}/fs/read?path=P&max_bytes=N: the
// file's first max_bytes bytes (default 1 MiB), base64.
func (x *sandkastenAPI) read(w http.ResponseWriter, r *http.Request) {
	s, ok := x.session(w, r)
	if !ok {
		return
	}
	p, err := sandkastenPath(r.URL.Query().Get("path"))
	if err != nil {
		x.d.fileError(w, r, err)
		return
	}
	maxBytes := int64(sandkastenReadBytes)
	if v := r.URL.Query().Get("max_bytes"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			rest.WriteError(w, http.StatusBadRequest, "invalid_parameter", fmt.Sprintf("max_bytes must be a non-negative integer, got %q", v))
			return
		}
		if n > 0 {
			maxBytes = min(n, sandkastenMaxReadBytes)
		}
	}
	fsys, ok := x.d.openFS(w, r, s)
	if !ok {
		return
	}
	defer fsys.Close()
	data, truncated, err := readHead(fsys, p, maxBytes)
	x.extendLease(r, s)
	if err != nil {
		x.d.fileError(w, r, err)
		return
	}
	_ = rest.WriteJSON(w, http.StatusOK, sandkastenReadResult{
		ContentBase64: base64.StdEncoding.EncodeToString(data), Truncated: truncated})
}

// readHead reads at most max bytes of the regular file p, reporting
// whether it holds more.
func readHead(fsys *dataplane.FS, p string, max int64) ([]byte, bool, error) {
	f, _, err := fsys.Open(p)
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, false, fmt.Errorf("read %s: %w", p, err)
	}
	if int64(len(data)) > max {
		return data[:max], true, nil
	}
	return data, false, nil
}

// decodeBigJSON reads a JSON object body of up to limit bytes into v,
// refusing unknown fields and trailing data, for the bodies that carry
// file contents (decodeJSON bounds bodies to rest.MaxBodyBytes).
func decodeBigJSON(w http.ResponseWriter, r *http.Request, v any, limit int64) (int, string, string) {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, limit))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if _, terr := dec.Token(); terr != io.EOF {
			err = terr
			if err == nil {
				err = errors.New("trailing data")
			}
		}
	}
	var mbe *http.MaxBytesError
	var te *json.UnmarshalTypeError
	switch {
	case err == nil:
		return 0, "", ""
	case errors.Is(err, io.EOF):
		return http.StatusBadRequest, "invalid_json", "body must be a JSON object"
	case errors.As(err, &mbe):
		return http.StatusRequestEntityTooLarge, "body_too_large", fmt.Sprintf("body exceeds %d bytes", limit)
	case errors.As(err, &te) && te.Field != "":
		return http.StatusBadRequest, "invalid_field", fmt.Sprintf("field %q must be %s", te.Field, rest.JSONKind(te.Type.Kind().String()))
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return http.StatusBadRequest, "unknown_field", "unknown field " + strings.TrimPrefix(err.Error(), "json: unknown field ")
	}
	return http.StatusBadRequest, "invalid_json", "body is not valid JSON"
}
