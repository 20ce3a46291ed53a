package compat

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/sandgate/sandgate/dataplane"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/rest"
)

// The session-based-sandbox API (seed 000), under /compat/sbs:
//
//	POST   /sessions               -> {"session_id"}             (200)
//	POST   /sessions/{id}/step     -> {"output","error","exit_code"}
//	DELETE /sessions/{id}          -> 204, no body
//
// A session is a native session (default image, default TTL); a step is a
// one-shot command of the native command engine (dataplane.Run): bash
// steps run payload.cmd, python steps run python3 -c payload.code, each a
// fresh process in the workspace, bounded by DataPlane.StepTimeout. Errors
// have FastAPI's shapes: {"detail": [...]} with 422 for a body that does
// not validate, {"detail": "..."} otherwise.

// sbsAPI serves the session-based-sandbox API.
type sbsAPI struct {
	d *Deps
}

func newSBS(d *Deps) *sbsAPI { return &sbsAPI{d: d} }

func (x *sbsAPI) mount(r chi.Router) {
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		writeDetail(w, http.StatusNotFound, "Not Found")
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		writeDetail(w, http.StatusMethodNotAllowed, "Method Not Allowed")
	})
	r.Post("/sessions", x.create)
	r.Post("/sessions/{id}/step", x.step)
	r.Delete("/sessions/{id}", x.delete)
}

// sbsNotFound is the detail of a 404 for a session that does not exist
// (any more), or is another tenant's.
const sbsNotFound = "Session not found"

// sbsCreated is the answer of POST /sessions.
type sbsCreated struct {
	SessionID string `json:"session_id"`
}

// sbsStep is a validated step: the body of POST /sessions/{id}/step.
type sbsStep struct {
	SandboxID string
	Type      string // "bash" or "python"
	// Source is payload.cmd (bash) or payload.code (python).
	Source string
}

// sbsStepResult is the answer of a step.
type sbsStepResult struct {
	Output   string `json:"output"`
	Error    string `json:"error"`
	ExitCode int    `json:"exit_code"`
}

// validationIssue is one entry of FastAPI's 422 {"detail": [...]}, as
// pydantic 2 reports it.
type validationIssue struct {
	Type  string         `json:"type"`
	Loc   []any          `json:"loc"`
	Msg   string         `json:"msg"`
	Input any            `json:"input"`
	Ctx   map[string]any `json:"ctx,omitempty"`
}

// writeDetail writes FastAPI's error shape {"detail": detail}.
// acquireDetail charges a call keeping maxOutput bytes per stream to the
// command memory budget, as /v1 commands are; past it, it answers in the
// seeds' {"detail"} shape (429 past the tenant's share, 503 past the
// gateway's) and reports false.
func (d Deps) acquireDetail(w http.ResponseWriter, r *http.Request, tenant string, maxOutput int64, what string) (func(), bool) {
	release, err := d.Plane.Budget.Acquire(r.Context(), tenant, dataplane.CommandCost(maxOutput, false))
	if err == nil {
		return release, true
	}
	if r.Context().Err() == nil {
		status := http.StatusServiceUnavailable // past the gateway's budget
		if errors.Is(err, dataplane.ErrTenantBudget) {
			status = http.StatusTooManyRequests
		}
		w.Header().Set("Retry-After", "1")
		writeDetail(w, status, "too many "+what+" run at once; retry when some end")
	}
	return nil, false
}

func writeDetail(w http.ResponseWriter, status int, detail any) {
	_ = writeBareJSON(w, status, map[string]any{"detail": detail})
}

// writeGatewayDetail answers a session manager's error: not_found as the
// seed's 404, anything else (quota, unavailable...) with the native
// envelope, which the seed has no shape for.
func writeGatewayDetail(w http.ResponseWriter, err error) {
	if isNotFound(err) {
		writeDetail(w, http.StatusNotFound, sbsNotFound)
		return
	}
	rest.WriteGatewayError(w, err)
}

// create serves POST /sessions. The body, {} or none, is not read beyond
// its bound: the seed's create takes no parameters.
func (x *sbsAPI) create(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, http.MaxBytesReader(w, r.Body, rest.MaxBodyBytes))
	p := principal(r)
	if r.Context().Err() != nil {
		return
	}
	s, _, err := x.d.Sessions.Create(r.Context(), p, gateway.CreateParams{})
	if err != nil {
		writeGatewayDetail(w, err)
		return
	}
	x.d.Log.InfoContext(r.Context(), "compat_session_created", "api", "sbs", "session", s.ID, "tenant", p.Tenant)
	err = r.Context().Err()
	if err == nil {
		err = writeBareJSON(w, http.StatusOK, sbsCreated{SessionID: s.ID})
	}
	if err == nil {
		if ferr := http.NewResponseController(w).Flush(); ferr != nil {
			err = fmt.Errorf("flush answer: %w", ferr)
		}
	}
	if err != nil {
		rest.Rollback(r, x.d.Sessions, x.d.Log, p, s.ID, err)
	}
}

// delete serves DELETE /sessions/{id}: 204, no body.
func (x *sbsAPI) delete(w http.ResponseWriter, r *http.Request) {
	if err := x.d.Sessions.Delete(r.Context(), principal(r), chi.URLParam(r, "id")); err != nil {
		writeGatewayDetail(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// step serves POST /sessions/{id}/step. The body is validated first (422),
// then sandbox_id against the URL (422), then the session is looked up
// (404), as FastAPI validates a body before the handler runs.
func (x *sbsAPI) step(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	st, status, detail := parseSBSStep(w, r)
	if status != 0 {
		writeDetail(w, status, detail)
		return
	}
	if st.SandboxID != id {
		writeDetail(w, http.StatusUnprocessableEntity, []validationIssue{{
			Type: "value_error", Loc: []any{"body", "sandbox_id"},
			Msg:   "Value error, sandbox_id must equal the session_id of the URL",
			Input: st.SandboxID,
		}})
		return
	}
	s, err := x.d.Sessions.Get(r.Context(), principal(r), id)
	if err != nil {
		writeGatewayDetail(w, err)
		return
	}
	if !s.Live() {
		writeDetail(w, http.StatusConflict, "Session is not running")
		return
	}
	if err := holdSession(r.Context(), s); err != nil { // a long step is activity while it runs
		writeGatewayDetail(w, err)
		return
	}

	timeout := x.d.Plane.Bounds.StepTimeout
	req := dataplane.Request{Timeout: timeout, MaxOutputBytes: min(rest.DefaultCommandOutput, x.d.Plane.Bounds.MaxOutputBytes),
		NoDirect: x.d.Plane.Bounds.CommandShell}
	switch st.Type {
	case "bash":
		req.Command = st.Source
	case "python":
		req.Argv = []string{"python3", "-c", st.Source}
	}
	release, ok := x.d.acquireDetail(w, r, s.Tenant, req.MaxOutputBytes, "steps")
	if !ok {
		return
	}
	defer release()
	res, err := dataplane.Run(r.Context(), s, req)
	if err != nil {
		x.d.Log.WarnContext(r.Context(), "compat_step_failed", "api", "sbs", "session", s.ID, "err", err)
		writeDetail(w, http.StatusInternalServerError, "the step could not be started")
		return
	}
	_ = writeBareJSON(w, http.StatusOK, sbsResult(res, timeout))
}

// sbsResult renders a step's result: stdout as output, stderr as error;
// a timed-out step has exit code 124 and error says so; a step a signal
// ended has its negated number, as Python's subprocess reports it.
func sbsResult(res dataplane.Result, timeout time.Duration) sbsStepResult {
	out := sbsStepResult{Output: outputText(res.Stdout), Error: outputText(res.Stderr)}
	switch {
	case res.TimedOut:
		out.ExitCode = dataplane.TimeoutExitCode
		if out.Error != "" && !strings.HasSuffix(out.Error, "\n") {
			out.Error += "\n"
		}
		out.Error += fmt.Sprintf("Step timed out after %g seconds; the process was killed.", timeout.Seconds())
	case res.ExitCode != nil:
		out.ExitCode = *res.ExitCode
	default:
		out.ExitCode = -signalNumber(res.ExitSignal)
		if out.ExitCode == 0 {
			out.ExitCode = -1
		}
	}
	return out
}

// parseSBSStep reads and validates a step's body as the seed's pydantic
// model would: sandbox_id a string, type "bash" or "python", payload an
// object holding cmd (bash) or code (python), a string. Other fields are
// ignored, as pydantic does. It returns a status and detail for a bad one.
func parseSBSStep(w http.ResponseWriter, r *http.Request) (sbsStep, int, any) {
	var st sbsStep
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, rest.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return st, http.StatusRequestEntityTooLarge, fmt.Sprintf("body exceeds %d bytes", rest.MaxBodyBytes)
		}
		return st, http.StatusBadRequest, "the body could not be read"
	}
	invalid := func(issues ...validationIssue) (sbsStep, int, any) {
		return st, http.StatusUnprocessableEntity, issues
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		return invalid(validationIssue{Type: "missing", Loc: []any{"body"}, Msg: "Field required", Input: nil})
	}
	var body any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&body); err != nil || dec.More() {
		pos := dec.InputOffset()
		var se *json.SyntaxError
		switch {
		case errors.As(err, &se):
			pos = se.Offset
		case errors.Is(err, io.ErrUnexpectedEOF):
			pos = int64(len(raw))
		}
		msg := "trailing data"
		if err != nil {
			msg = err.Error()
		}
		return invalid(validationIssue{Type: "json_invalid", Loc: []any{"body", pos}, Msg: "JSON decode error",
			Input: map[string]any{}, Ctx: map[string]any{"error": msg}})
	}
	obj, ok := body.(map[string]any)
	if !ok {
		return invalid(validationIssue{Type: "model_attributes_type", Loc: []any{"body"},
			Msg: "Input should be a valid dictionary or object to extract fields from", Input: body})
	}
	var issues []validationIssue
	str := func(v any, loc ...any) (string, bool) {
		s, ok := v.(string)
		if !ok {
			issues = append(issues, validationIssue{Type: "string_type", Loc: loc, Msg: "Input should be a valid string", Input: v})
		}
		return s, ok
	}
	missing := func(input any, loc ...any) {
		issues = append(issues, validationIssue{Type: "missing", Loc: loc, Msg: "Field required", Input: input})
	}
	if v, ok := obj["sandbox_id"]; !ok {
		missing(obj, "body", "sandbox_id")
	} else {
		st.SandboxID, _ = str(v, "body", "sandbox_id")
	}
	if v, ok := obj["type"]; !ok {
		missing(obj, "body", "type")
	} else if s, _ := v.(string); s == "bash" || s == "python" {
		st.Type = s
	} else {
		issues = append(issues, validationIssue{Type: "literal_error", Loc: []any{"body", "type"},
			Msg: "Input should be 'bash' or 'python'", Input: v, Ctx: map[string]any{"expected": "'bash' or 'python'"}})
	}
	v, ok := obj["payload"]
	payload, isObj := v.(map[string]any)
	switch {
	case !ok:
		missing(obj, "body", "payload")
	case !isObj:
		issues = append(issues, validationIssue{Type: "dict_type", Loc: []any{"body", "payload"},
			Msg: "Input should be a valid dictionary", Input: v})
	case st.Type != "":
		key := map[string]string{"bash": "cmd", "python": "code"}[st.Type]
		if src, ok := payload[key]; !ok {
			missing(payload, "body", "payload", key)
		} else {
			st.Source, _ = str(src, "body", "payload", key)
		}
	}
	if len(issues) > 0 {
		return invalid(issues...)
	}
	return st, 0, nil
}
