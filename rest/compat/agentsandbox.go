package compat

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/sandgate/sandgate/dataplane"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/rest"
)

// Agent Sandbox's API (seed 001), under /compat/agent-sandbox:
//
//	POST /v1/execute             {"user_id","session_id","code","inputs","presign_expires_in"} -> {"output","artifacts"}
//	POST /v1/sandbox/reset       {"user_id","session_id"} -> {"status","output","container_id"}
//	POST /v1/sandbox/stop        {"user_id","session_id"} -> {"status"}
//	POST /v1/files/upload-urls   {"user_id","session_id","urls","dest_dir"} -> {"status","uploaded","errors"}
//	GET  /v1/files/list?user_id=U&session_id=S -> {"files": [{"path","size_bytes","mtime"}]}
//	GET  /v1/files/download-url?user_id=U&session_id=S&path=P&expires_in=N -> {"status","path","expires_in","download_url"}
//
// The sandbox of a (tenant, user_id, session_id) is a native session
// named after the two ids (agentSandboxName), created on first use, found
// again by name, and created anew when it has gone (expired, failed or
// stopped). Code runs in the session's persistent Python kernel
// "default"; files are the session's workspace, read through the native
// files engine; download URLs are the native presigned links. The seed's
// X-API-Key header carries a sandgate token here (agentSandboxAPIKey).
// Errors have the seed's (FastAPI's) shapes: {"detail": ...}, with 422
// for a body or query that does not validate; execute and reset answer a
// sandbox that cannot run code with the seed's 200 {"error": ...} and
// {"status": "error", "message": ...}.

// Agent Sandbox's defaults and limits, from the seed.
const (
	// agentSandboxTTL is SANDBOX_TTL_SECONDS: a sandbox's lifetime.
	agentSandboxTTL = 1800
	// agentSandboxExpiry is PRESIGN_EXPIRES_SECONDS, the default expiry
	// of a download URL.
	agentSandboxExpiry = 300
	// agentSandboxMaxURLs bounds upload-urls' urls.
	agentSandboxMaxURLs = dataplane.MaxFetchURLs
	// agentSandboxTimeoutMsg is the traceback of code that timed out.
	agentSandboxTimeoutMsg = "TimeoutError: execution timed out"
	// agentSandboxTruncated ends an output cut at the output cap.
	agentSandboxTruncated = "\n...[truncated]...\n"
)

// agentSandboxAPI serves Agent Sandbox's API.
type agentSandboxAPI struct {
	d *Deps
	// store syncs the sandboxes' files with the object store (nil:
	// none; agentstore.go).
	store *agentStore
}

// mountAgentSandbox mounts Agent Sandbox's routes (compat.go).
func (d *Deps) mountAgentSandbox(r chi.Router) {
	x := &agentSandboxAPI{d: d, store: d.agentStore}
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		writeDetail(w, http.StatusNotFound, "Not Found")
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		writeDetail(w, http.StatusMethodNotAllowed, "Method Not Allowed")
	})
	r.Post("/v1/execute", x.execute)
	r.Post("/v1/sandbox/reset", x.reset)
	r.Post("/v1/sandbox/stop", x.stop)
	r.Post("/v1/files/upload-urls", x.uploadURLs)
	r.Get("/v1/files/list", x.list)
	r.Get("/v1/files/download-url", x.downloadURL)
}

// agentSandboxHealth is the seed's health check, GET /health: it answers
// {"status": "ok"} to anyone, without a key, as the seed's does.
const agentSandboxHealth = "/compat/agent-sandbox/health"

// agentSandboxAPIKey lets the seed's clients authenticate as they did,
// with X-API-Key: a request without an Authorization header has its
// X-API-Key (a sandgate token) turned into a bearer token. It runs before
// authentication, on this prefix only, and answers the health check
// (agentSandboxHealth) itself.
func agentSandboxAPIKey(next http.Handler) http.Handler {
	withKey := rest.APIKeyAsBearer(next)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == agentSandboxHealth && r.Method == http.MethodGet {
			_ = writeBareJSON(w, http.StatusOK, agentStatus{Status: "ok"})
			return
		}
		withKey.ServeHTTP(w, r)
	})
}

// agentIdentity is the seed's tenant key within a sandgate tenant.
type agentIdentity struct {
	UserID, SessionID string
}

// name is the native session name of the identity's sandbox:
// "as-" + 16 hex digits of SHA-256("user:"+user_id) + "-" + 16 of
// SHA-256("sess:"+session_id), as the seed names its containers.
func (id agentIdentity) name() string {
	return "as-" + sha16("user:"+id.UserID) + "-" + sha16("sess:"+id.SessionID)
}

func sha16(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:16]
}

// agentIdentityOf checks user_id and session_id as the seed does: user_id
// is required (blank is refused), session_id defaults to "default".
func agentIdentityOf(userID string, sessionID *string) (agentIdentity, error) {
	u := strings.TrimSpace(userID)
	if u == "" {
		return agentIdentity{}, errors.New("user_id required")
	}
	s := "default"
	if sessionID != nil && *sessionID != "" {
		s = strings.TrimSpace(*sessionID)
	}
	return agentIdentity{UserID: u, SessionID: s}, nil
}

// agentRelPath checks a path as the seed does: relative, no "..", "\"
// read as "/"; it returns the path without empty and "." segments.
func agentRelPath(p string) (string, error) {
	p = strings.TrimSpace(strings.ReplaceAll(p, `\`, "/"))
	if p == "" {
		return "", errors.New("path is required")
	}
	if strings.HasPrefix(p, "/") {
		return "", errors.New("absolute paths are not allowed")
	}
	var parts []string
	for _, seg := range strings.Split(p, "/") {
		switch seg {
		case "..":
			return "", errors.New(".. is not allowed")
		case "", ".":
			continue
		}
		parts = append(parts, seg)
	}
	if len(parts) == 0 {
		return "", errors.New("invalid path")
	}
	rel := strings.Join(parts, "/")
	if _, err := dataplane.CheckPath(rel); err != nil {
		var fe *dataplane.Error
		if errors.As(err, &fe) {
			return "", errors.New(fe.Msg)
		}
		return "", err
	}
	return rel, nil
}

// clampExpiry is the seed's expiry rule: absent or 0 is the default, then
// 1 to 604800 seconds (7 days), a value outside clamped.
func clampExpiry(v *int) int {
	e := agentSandboxExpiry
	if v != nil && *v != 0 {
		e = *v
	}
	return max(1, min(e, rest.MaxLinkExpiry))
}

// agentSandboxCreateWait bounds how long a call waits for a concurrent
// call's create of the same sandbox (name_taken) to finish.
const agentSandboxCreateWait = 2 * time.Minute

// sandbox finds the identity's live sandbox, or creates it when create is
// set; nil, nil when there is none and create is not set. A create that
// finds the name taken by a create in progress (a concurrent first call)
// waits for that one's session. The call (ctx, the request's) holds the
// sandbox until it returns, so that the idle timeout never ends it under
// a long execute (holdSession).
func (x *agentSandboxAPI) sandbox(ctx context.Context, p gateway.Principal, id agentIdentity, create bool) (*gateway.Session, error) {
	name := id.name()
	deadline := time.Now().Add(agentSandboxCreateWait)
	for {
		if ss, _ := rest.ListNamed(ctx, x.d.Sessions, p, name, 1, 0); len(ss) == 1 && ss[0].Live() {
			if err := holdSession(ctx, ss[0]); err != nil {
				return nil, err
			}
			return ss[0], nil
		}
		if !create {
			return nil, nil
		}
		s, _, err := x.d.Sessions.Create(ctx, p, gateway.CreateParams{Name: name, TTL: agentSandboxTTL, Image: x.d.AgentSandbox.Image})
		if err == nil {
			x.d.Log.InfoContext(ctx, "compat_session_created", "api", "agent-sandbox", "session", s.ID, "tenant", p.Tenant, "name", name)
			if err := holdSession(ctx, s); err != nil {
				return nil, err
			}
			return s, nil
		}
		var ge *gateway.Error
		if !errors.As(err, &ge) || ge.Code != "name_taken" || time.Now().After(deadline) {
			return nil, fmt.Errorf("create sandbox %s: %w", name, err)
		}
		select { // a concurrent call creates it: find it once it is made
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// sandboxOrAnswer is sandbox with create set, answering a failure itself.
func (x *agentSandboxAPI) sandboxOrAnswer(w http.ResponseWriter, r *http.Request, id agentIdentity) (*gateway.Session, bool) {
	s, err := x.sandbox(r.Context(), principal(r), id, true)
	if err != nil {
		if r.Context().Err() == nil {
			x.d.Log.WarnContext(r.Context(), "compat_sandbox_unavailable", "api", "agent-sandbox", "err", err)
			writeCompatError(w, err)
		}
		return nil, false
	}
	return s, true
}

// linkURL is a presigned link (links.go) to the file p of s, expiring in
// expiresIn seconds; with an object store, a presigned URL of the store
// (workspaces.go).
func (x *agentSandboxAPI) linkURL(r *http.Request, s *gateway.Session, p string, expiresIn int) string {
	return x.d.Links.FileURL(r, s, p, expiresIn)
}

// watch ties s, the sandbox of id, to the object store, if there is one,
// and returns its prefix there ("" without one).
func (x *agentSandboxAPI) watch(s *gateway.Session, id agentIdentity) string {
	if x.store == nil {
		return ""
	}
	pfx := x.store.prefix(s.Tenant, id)
	x.store.watch(s, pfx)
	return pfx
}

// fileURL is the download URL of the file p of s: the object store's
// presigned URL of its object when the store holds it as it is now
// (stored), as the seed's, else linkURL's; fromStore says which.
func (x *agentSandboxAPI) fileURL(r *http.Request, s *gateway.Session, pfx, p string, stored bool, expiresIn int) (u string, fromStore bool) {
	if x.store != nil && stored {
		u, err := x.store.presign(r.Context(), pfx, p, expiresIn)
		if err == nil {
			return u, true
		}
		x.d.Log.WarnContext(r.Context(), "compat_store_presign_failed", "api", "agent-sandbox", "session", s.ID, "err", err)
	}
	return x.linkURL(r, s, p, expiresIn), false
}

// agentExecuteRequest is the body of POST /v1/execute.
type agentExecuteRequest struct {
	UserID           string
	SessionID        *string
	Code             string
	Inputs           []string
	PresignExpiresIn *int
}

// agentArtifact is a file a run created or changed.
type agentArtifact struct {
	Path        string `json:"path"`
	SizeBytes   int64  `json:"size_bytes"`
	MimeType    string `json:"mime_type"`
	DownloadURL string `json:"download_url"`
}

type agentExecuteResult struct {
	Output    string          `json:"output"`
	Artifacts []agentArtifact `json:"artifacts"`
	// SyncError says the push to the object store failed (the seed's
	// sync_error): absent when it did not.
	SyncError string `json:"sync_error,omitempty"`
}

// agentError is execute's answer when the sandbox cannot run code (the
// seed answers it with 200).
type agentError struct {
	Error string `json:"error"`
}

// fileStamp is what tells a file changed: its size and mtime. In what
// the store holds of a session's files (agentStore.pushed), gone marks a
// file stored and since deleted from the workspace (its object kept,
// without DeleteOnDelete).
type fileStamp struct {
	size  int64
	mtime time.Time
	gone  bool
}

// same reports whether a file as pushed (f) is the file as listed now (g).
func (f fileStamp) same(g fileStamp) bool {
	return !f.gone && !g.gone && f.size == g.size && f.mtime.Equal(g.mtime)
}

// workspaceFiles lists the regular files of the workspace, recursively;
// complete says the list has them all (not cut at the listing's bound,
// no directory skipped as unreadable): only a complete list tells which
// files were deleted.
func workspaceFiles(fsys *dataplane.FS) (files map[string]fileStamp, complete bool, err error) {
	entries, complete, err := fsys.ListTree(".", 0)
	if err != nil {
		return nil, false, fmt.Errorf("list workspace: %w", err)
	}
	out := make(map[string]fileStamp, len(entries))
	for _, e := range entries {
		if e.Type == "file" {
			out[path.Clean(e.Path)] = fileStamp{size: e.SizeBytes, mtime: e.Mtime}
		}
	}
	return out, complete, nil
}

// mimeType is the media type of a file by its extension, without
// parameters ("text/plain", as the seed's Python mimetypes says).
func mimeType(p string) string {
	if t := mime.TypeByExtension(path.Ext(p)); t != "" {
		if mt, _, err := mime.ParseMediaType(t); err == nil {
			return mt
		}
		return t
	}
	return "application/octet-stream"
}

// execute serves POST /v1/execute: code runs in the sandbox's persistent
// kernel; the answer's output is what the seed's daemon prints (stdout,
// the last expression's repr, stderr, then the traceback), its artifacts
// the files the run created or changed.
func (x *agentSandboxAPI) execute(w http.ResponseWriter, r *http.Request) {
	var req agentExecuteRequest
	obj, ok := readPydanticBody(w, r)
	if !ok {
		return
	}
	v := pydanticFields{obj: obj, where: "body"}
	req.UserID = v.str("user_id", true)
	req.SessionID = v.optStr("session_id")
	req.Code = v.str("code", true)
	req.Inputs = v.optStrList("inputs")
	req.PresignExpiresIn = v.optInt("presign_expires_in")
	if !v.answer(w) {
		return
	}
	id, err := agentIdentityOf(req.UserID, req.SessionID)
	if err != nil {
		writeDetail(w, http.StatusBadRequest, err.Error())
		return
	}
	// The inputs are files the seed pulled from its store into the
	// workspace before the run: as its users send them (absolute paths
	// too, agentInputPath), mapped into the workspace; pulled from the
	// object store when there is one, and skipped when missing, as the
	// seed does.
	if len(req.Inputs) > agentMaxInputs {
		writeDetail(w, http.StatusBadRequest, fmt.Sprintf("too many inputs (max %d)", agentMaxInputs))
		return
	}
	inputs := make([]string, 0, len(req.Inputs))
	for _, in := range req.Inputs {
		p, err := agentInputPath(in)
		if err != nil {
			writeDetail(w, http.StatusBadRequest, fmt.Sprintf("inputs: %s: %v", in, err))
			return
		}
		inputs = append(inputs, p)
	}
	s, ok := x.sandboxOrAnswer(w, r, id)
	if !ok {
		return
	}
	pfx := x.watch(s, id)
	if strings.TrimSpace(req.Code) == "" {
		_ = writeBareJSON(w, http.StatusOK, agentExecuteResult{Output: "Empty code\n", Artifacts: []agentArtifact{}})
		return
	}
	fsys, err := x.d.Plane.Files.Open(r.Context(), s.ID, s.Tenant, s, false)
	if err != nil {
		x.d.Log.WarnContext(r.Context(), "compat_execute_failed", "api", "agent-sandbox", "session", s.ID, "err", err)
		_ = writeBareJSON(w, http.StatusOK, agentError{Error: "Sandbox not available"})
		return
	}
	defer fsys.Close()
	if x.store != nil && len(inputs) > 0 {
		if err := x.store.pull(r.Context(), s, fsys, pfx, inputs); err != nil {
			if r.Context().Err() == nil {
				_ = writeBareJSON(w, http.StatusOK, agentError{Error: "inputs: " + err.Error()})
			}
			return
		}
	}
	before, _, err := workspaceFiles(fsys)
	if err != nil {
		x.d.Log.WarnContext(r.Context(), "compat_execute_failed", "api", "agent-sandbox", "session", s.ID, "err", err)
		_ = writeBareJSON(w, http.StatusOK, agentError{Error: "Sandbox not available"})
		return
	}
	capBytes := min(rest.DefaultCommandOutput, x.d.Plane.Bounds.MaxOutputBytes)
	preq := dataplane.PythonRequest{Code: req.Code, Timeout: min(rest.DefaultCommandTimeout, x.d.Plane.Bounds.MaxTimeout), MaxOutputBytes: capBytes}
	release, ok := x.d.acquireDetail(w, r, s.Tenant, preq.MaxOutputBytes, "commands")
	if !ok {
		return
	}
	defer release()
	res, err := x.d.Plane.Kernels.Run(r.Context(), s.ID, s, rest.DefaultKernel, preq)
	if err != nil {
		if r.Context().Err() != nil {
			return // gone
		}
		if errors.Is(err, dataplane.ErrKernelLetGo) {
			// A pause by checkpoint let go of the kernel under the call.
			_ = writeBareJSON(w, http.StatusOK, agentError{Error: "Execution interrupted: " + kernelProblem(err)})
			return
		}
		x.d.Log.WarnContext(r.Context(), "compat_execute_failed", "api", "agent-sandbox", "session", s.ID, "err", err)
		_ = writeBareJSON(w, http.StatusOK, agentError{Error: "Execution failed (kernel unavailable): " + kernelProblem(err)})
		return
	}
	expiresIn := clampExpiry(req.PresignExpiresIn)
	out := agentExecuteResult{Output: agentOutput(res, capBytes), Artifacts: []agentArtifact{}}
	after, complete, err := workspaceFiles(fsys)
	if err != nil {
		// Not knowing the files, nothing is pushed (an empty list would
		// read as every file deleted).
		x.d.Log.WarnContext(r.Context(), "compat_artifacts_failed", "api", "agent-sandbox", "session", s.ID, "err", err)
		after = map[string]fileStamp{}
		if x.store != nil {
			out.SyncError = "the sandbox's files could not be listed: nothing was stored in the object store"
		}
	}
	var stored map[string]bool
	if x.store != nil && err == nil {
		var err error
		if stored, err = x.store.push(r.Context(), s, fsys, pfx, after, complete); err != nil {
			out.SyncError = "the sandbox's files could not all be stored in the object store; the download URLs of those not stored are the gateway's"
		}
	}
	for p, st := range after {
		if old, ok := before[p]; ok && old.size == st.size && old.mtime.Equal(st.mtime) {
			continue
		}
		u, _ := x.fileURL(r, s, pfx, p, stored[p], expiresIn)
		out.Artifacts = append(out.Artifacts, agentArtifact{Path: p, SizeBytes: st.size, MimeType: mimeType(p), DownloadURL: u})
	}
	sort.Slice(out.Artifacts, func(i, j int) bool { return out.Artifacts[i].Path < out.Artifacts[j].Path })
	_ = writeBareJSON(w, http.StatusOK, out)
}

// kernelProblem says in a few words why the kernel could not run code.
func kernelProblem(err error) string {
	var kse *dataplane.KernelStartError
	switch {
	case errors.As(err, &kse):
		return "python3 could not run the kernel: " + kse.Reason
	case errors.Is(err, dataplane.ErrPythonUnavailable):
		return "the sandbox's image has no python3"
	case errors.Is(err, dataplane.ErrKernelBusy):
		return "too many calls wait for this kernel"
	case errors.Is(err, dataplane.ErrKernelClosed):
		return "the kernel was reset while the call waited for it"
	case errors.Is(err, dataplane.ErrKernelLetGo):
		return dataplane.KernelPausedMessage(rest.DefaultKernel)
	case errors.Is(err, gateway.ErrPaused):
		// Paused before its code ran (it waited for the kernel): it
		// did not run.
		if ge, ok := errors.AsType[*gateway.Error](err); ok {
			return ge.Message
		}
	}
	return "the kernel could not be started"
}

// agentOutput renders a run as the seed's daemon did: stdout (where the
// last expression's repr is printed), stderr, then the traceback on its
// own line; cut to half of capBytes when longer than capBytes.
func agentOutput(res dataplane.PythonResult, capBytes int64) string {
	var b strings.Builder
	b.WriteString(outputText(res.Stdout))
	if res.Result != nil {
		b.WriteString(*res.Result + "\n")
	}
	b.WriteString(outputText(res.Stderr))
	tb := ""
	switch {
	case res.TimedOut:
		tb = agentSandboxTimeoutMsg
	case res.Error != nil:
		tb = res.Error.Traceback
		if tb == "" {
			tb = res.Error.Name + ": " + res.Error.Value
		}
	}
	if tb != "" {
		if b.Len() > 0 && !strings.HasSuffix(b.String(), "\n") {
			b.WriteString("\n")
		}
		b.WriteString(tb)
		if !strings.HasSuffix(tb, "\n") {
			b.WriteString("\n")
		}
	}
	s := b.String()
	if int64(len(s)) > capBytes {
		s = strings.ToValidUTF8(s[:capBytes/2], "") + agentSandboxTruncated
	}
	return s
}

// agentSandboxRequest is the body of reset and stop.
type agentSandboxRequest struct {
	UserID    string
	SessionID *string
}

func parseAgentSandboxRequest(w http.ResponseWriter, r *http.Request) (agentIdentity, bool) {
	obj, ok := readPydanticBody(w, r)
	if !ok {
		return agentIdentity{}, false
	}
	v := pydanticFields{obj: obj, where: "body"}
	req := agentSandboxRequest{UserID: v.str("user_id", true), SessionID: v.optStr("session_id")}
	if !v.answer(w) {
		return agentIdentity{}, false
	}
	id, err := agentIdentityOf(req.UserID, req.SessionID)
	if err != nil {
		writeDetail(w, http.StatusBadRequest, err.Error())
		return agentIdentity{}, false
	}
	return id, true
}

type agentResetResult struct {
	Status      string `json:"status"`
	Output      string `json:"output"`
	ContainerID string `json:"container_id"`
}

type agentStatus struct {
	Status string `json:"status"`
}

// reset serves POST /v1/sandbox/reset: the kernel's interpreter ends (its
// variables go), files stay; the sandbox is created if it has none. Its
// container_id is the native session's id.
func (x *agentSandboxAPI) reset(w http.ResponseWriter, r *http.Request) {
	id, ok := parseAgentSandboxRequest(w, r)
	if !ok {
		return
	}
	s, ok := x.sandboxOrAnswer(w, r, id)
	if !ok {
		return
	}
	existed := x.d.Plane.Kernels.Reset(s.ID, rest.DefaultKernel)
	x.d.Log.InfoContext(r.Context(), "compat_kernel_reset", "api", "agent-sandbox", "session", s.ID, "existed", existed)
	_ = writeBareJSON(w, http.StatusOK, agentResetResult{Status: "success", Output: "Kernel reset.\n", ContainerID: s.ID})
}

// stop serves POST /v1/sandbox/stop: the sandbox's session is deleted,
// its workspace with it. Stopping a sandbox that does not exist succeeds.
func (x *agentSandboxAPI) stop(w http.ResponseWriter, r *http.Request) {
	id, ok := parseAgentSandboxRequest(w, r)
	if !ok {
		return
	}
	p := principal(r)
	ss, _ := rest.ListNamed(r.Context(), x.d.Sessions, p, id.name(), 1, 0)
	for _, s := range ss {
		err := x.d.Sessions.Delete(r.Context(), p, s.ID)
		if err != nil && !isNotFound(err) {
			writeCompatError(w, err)
			return
		}
		x.d.Log.InfoContext(r.Context(), "compat_session_deleted", "api", "agent-sandbox", "session", s.ID, "tenant", p.Tenant)
	}
	// As the seed's stop, with or without a sandbox: its stored files go
	// with DELETE_S3_ON_CLEANUP.
	// A failed deletion is said in sync_error: the sandbox is stopped,
	// its files stay in the store.
	ans := agentStopResult{Status: "success"}
	if x.store != nil && x.store.cfg.DeleteOnCleanup {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), agentCleanupTimeout)
		if err := x.store.cleanup(ctx, x.store.prefix(p.Tenant, id)); err != nil {
			ans.SyncError = "the sandbox's files could not all be deleted from the object store"
		}
		cancel()
	}
	_ = writeBareJSON(w, http.StatusOK, ans)
}

// agentStopResult is stop's answer.
type agentStopResult struct {
	Status string `json:"status"`
	// SyncError says the deletion of the sandbox's stored files failed:
	// absent when it did not.
	SyncError string `json:"sync_error,omitempty"`
}

type agentUploadError struct {
	SourceURL string `json:"source_url"`
	Error     string `json:"error"`
}

type agentUploadResult struct {
	Status   string             `json:"status"`
	Uploaded []string           `json:"uploaded"`
	Errors   []agentUploadError `json:"errors"`
	// SyncError says the push of the downloaded files to the object
	// store failed (as execute's): absent when it did not.
	SyncError string `json:"sync_error,omitempty"`
}

// agentFilenameRE finds a filename in a Content-Disposition value, as the
// seed does.
var agentFilenameRE = regexp.MustCompile(`(?i)filename\*?=(?:UTF-8'')?"?([^";]+)"?`)

// agentURLName is the seed's name for a download from its URL: the
// filename of a "Content-Disposition" query parameter, or "" (the native
// fetch then uses the response's Content-Disposition, then the URL path).
func agentURLName(u *url.URL) string {
	q := u.Query()
	cd := q.Get("Content-Disposition")
	if cd == "" {
		cd = q.Get("content-disposition")
	}
	m := agentFilenameRE.FindStringSubmatch(cd)
	if m == nil {
		return ""
	}
	name := strings.TrimSpace(m[1])
	if un, err := url.PathUnescape(name); err == nil {
		name = un
	}
	return name
}

// uploadURLs serves POST /v1/files/upload-urls: each URL is downloaded by
// the gateway (public addresses only, at most MaxFetchBytes each) into
// dest_dir of the workspace.
func (x *agentSandboxAPI) uploadURLs(w http.ResponseWriter, r *http.Request) {
	obj, ok := readPydanticBody(w, r)
	if !ok {
		return
	}
	v := pydanticFields{obj: obj, where: "body"}
	userID := v.str("user_id", true)
	sessionID := v.optStr("session_id")
	urls := v.optStrList("urls")
	_ = v.optInt("presign_expires_in") // accepted, as the seed does, and unused
	destDir := v.optStr("dest_dir")
	if !v.answer(w) {
		return
	}
	id, err := agentIdentityOf(userID, sessionID)
	if err != nil {
		writeDetail(w, http.StatusBadRequest, err.Error())
		return
	}
	if len(urls) > agentSandboxMaxURLs {
		writeDetail(w, http.StatusBadRequest, fmt.Sprintf("too many urls (max %d)", agentSandboxMaxURLs))
		return
	}
	dest := "."
	if destDir != nil {
		d := strings.Trim(strings.TrimSpace(strings.ReplaceAll(*destDir, `\`, "/")), "/")
		if d != "" {
			rel, err := agentRelPath(d)
			if err != nil {
				writeDetail(w, http.StatusBadRequest, "invalid dest_dir")
				return
			}
			dest = rel
		}
	}
	if x.d.Plane.Bounds.DialPublic == nil {
		writeDetail(w, http.StatusServiceUnavailable, "this gateway does not fetch URLs (it has no egress proxy)")
		return
	}
	s, ok := x.sandboxOrAnswer(w, r, id)
	if !ok {
		return
	}
	res := agentUploadResult{Uploaded: []string{}, Errors: []agentUploadError{}}
	var fetchable []string
	for _, u := range urls {
		if err := dataplane.CheckFetch([]string{u}); err != nil {
			msg := err.Error()
			var fe *dataplane.Error
			if errors.As(err, &fe) {
				msg = strings.TrimPrefix(fe.Msg, "urls[0]: ")
			}
			res.Errors = append(res.Errors, agentUploadError{SourceURL: u, Error: msg})
			continue
		}
		fetchable = append(fetchable, u)
	}
	if len(fetchable) > 0 {
		fsys, err := x.d.Plane.Files.Open(r.Context(), s.ID, s.Tenant, s, false)
		if err != nil {
			x.d.fileError(w, r, err)
			return
		}
		defer fsys.Close()
		fe := &dataplane.Fetcher{Dial: x.d.Plane.Bounds.DialPublic, MaxBytes: x.d.Plane.Bounds.MaxFetchBytes, Name: agentURLName}
		fr, err := fe.Fetch(r.Context(), fsys, fetchable, dest)
		if err != nil {
			x.d.fileError(w, r, err)
			return
		}
		res.Uploaded = append(res.Uploaded, fr.Fetched...)
		for _, e := range fr.Errors {
			res.Errors = append(res.Errors, agentUploadError{SourceURL: e.URL, Error: e.Error})
		}
		if pfx := x.watch(s, id); x.store != nil && len(fr.Fetched) > 0 {
			// A failure is logged and said; the next push retries.
			if files, complete, err := workspaceFiles(fsys); err != nil {
				x.d.Log.WarnContext(r.Context(), "compat_store_push_failed", "api", "agent-sandbox", "session", s.ID, "err", err)
				res.SyncError = "the sandbox's files could not be listed: nothing was stored in the object store"
			} else if _, err := x.store.push(r.Context(), s, fsys, pfx, files, complete); err != nil {
				res.SyncError = "the sandbox's files could not all be stored in the object store"
			}
		}
	}
	switch {
	case len(res.Errors) == 0:
		res.Status = "success"
	case len(res.Uploaded) > 0:
		res.Status = "partial_success"
	default:
		res.Status = "error"
	}
	x.d.Log.InfoContext(r.Context(), "compat_upload_urls", "api", "agent-sandbox", "session", s.ID,
		"uploaded", len(res.Uploaded), "errors", len(res.Errors))
	_ = writeBareJSON(w, http.StatusOK, res)
}

type agentFile struct {
	Path      string `json:"path"`
	SizeBytes int64  `json:"size_bytes"`
	Mtime     int64  `json:"mtime"`
}

type agentFileList struct {
	Files []agentFile `json:"files"`
}

// list serves GET /v1/files/list: every regular file of the workspace,
// by path; the sandbox is created if it has none.
func (x *agentSandboxAPI) list(w http.ResponseWriter, r *http.Request) {
	v := pydanticFields{obj: queryObject(r), where: "query"}
	userID := v.str("user_id", true)
	sessionID := v.optStr("session_id")
	if !v.answer(w) {
		return
	}
	id, err := agentIdentityOf(userID, sessionID)
	if err != nil {
		writeDetail(w, http.StatusBadRequest, err.Error())
		return
	}
	s, ok := x.sandboxOrAnswer(w, r, id)
	if !ok {
		return
	}
	fsys, ok := x.d.openFS(w, r, s)
	if !ok {
		return
	}
	defer fsys.Close()
	files, _, err := workspaceFiles(fsys)
	if err != nil {
		x.d.fileError(w, r, err)
		return
	}
	out := agentFileList{Files: make([]agentFile, 0, len(files))}
	for p, st := range files {
		out.Files = append(out.Files, agentFile{Path: p, SizeBytes: st.size, Mtime: st.mtime.Unix()})
	}
	sort.Slice(out.Files, func(i, j int) bool { return out.Files[i].Path < out.Files[j].Path })
	_ = writeBareJSON(w, http.StatusOK, out)
}

type agentDownloadURL struct {
	Status      string `json:"status"`
	Path        string `json:"path"`
	ExpiresIn   int    `json:"expires_in"`
	DownloadURL string `json:"download_url"`
	// SyncError says, with an object store, that the file could not be
	// stored there and download_url is the gateway's own link: absent
	// when it is the store's.
	SyncError string `json:"sync_error,omitempty"`
}

// downloadURL serves GET /v1/files/download-url: a presigned link to a
// regular file of the sandbox, expiring in expires_in seconds (default
// 300, clamped to 1..604800). A sandbox that does not exist, or a path
// that is not a regular file, is 404 "not found".
func (x *agentSandboxAPI) downloadURL(w http.ResponseWriter, r *http.Request) {
	v := pydanticFields{obj: queryObject(r), where: "query"}
	userID := v.str("user_id", true)
	sessionID := v.optStr("session_id")
	rawPath := v.str("path", true)
	expiresIn := v.optInt("expires_in")
	if !v.answer(w) {
		return
	}
	id, err := agentIdentityOf(userID, sessionID)
	if err != nil {
		writeDetail(w, http.StatusBadRequest, err.Error())
		return
	}
	p, err := agentRelPath(rawPath)
	if err != nil {
		writeDetail(w, http.StatusBadRequest, err.Error())
		return
	}
	if _, ok := x.d.Sessions.(rest.SessionOwners); !ok {
		writeDetail(w, http.StatusServiceUnavailable, "this gateway cannot serve presigned links")
		return
	}
	s, err := x.sandbox(r.Context(), principal(r), id, false)
	if err != nil || s == nil {
		writeDetail(w, http.StatusNotFound, "not found")
		return
	}
	fsys, ok := x.d.openFS(w, r, s)
	if !ok {
		return
	}
	defer fsys.Close()
	e, err := fsys.Stat(p)
	if err != nil || e.Type != "file" {
		writeDetail(w, http.StatusNotFound, "not found")
		return
	}
	// With an object store, the file is pushed (with whatever else
	// changed) and the URL is the store's, as the seed's.
	pfx, stored := x.watch(s, id), false
	if x.store != nil {
		if files, complete, err := workspaceFiles(fsys); err == nil {
			synced, _ := x.store.push(r.Context(), s, fsys, pfx, files, complete)
			stored = synced[p]
		} else {
			x.d.Log.WarnContext(r.Context(), "compat_store_push_failed", "api", "agent-sandbox", "session", s.ID, "err", err)
		}
	}
	exp := clampExpiry(expiresIn)
	ans := agentDownloadURL{Status: "success", Path: p, ExpiresIn: exp}
	var fromStore bool
	ans.DownloadURL, fromStore = x.fileURL(r, s, pfx, p, stored, exp)
	if x.store != nil && !fromStore {
		ans.SyncError = "the file could not be stored in the object store: download_url is the gateway's own link"
	}
	_ = writeBareJSON(w, http.StatusOK, ans)
}

// readPydanticBody reads a JSON object body as FastAPI does, answering a
// body that is not one with its 422 (or 413 past rest.MaxBodyBytes).
func readPydanticBody(w http.ResponseWriter, r *http.Request) (map[string]any, bool) {
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, rest.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeDetail(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body exceeds %d bytes", rest.MaxBodyBytes))
			return nil, false
		}
		writeDetail(w, http.StatusBadRequest, "the body could not be read")
		return nil, false
	}
	invalid := func(issue validationIssue) (map[string]any, bool) {
		writeDetail(w, http.StatusUnprocessableEntity, []validationIssue{issue})
		return nil, false
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		return invalid(validationIssue{Type: "missing", Loc: []any{"body"}, Msg: "Field required", Input: nil})
	}
	var body any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&body); err != nil || dec.More() {
		msg := "trailing data"
		if err != nil {
			msg = err.Error()
		}
		return invalid(validationIssue{Type: "json_invalid", Loc: []any{"body", dec.InputOffset()}, Msg: "JSON decode error",
			Input: map[string]any{}, Ctx: map[string]any{"error": msg}})
	}
	obj, ok := body.(map[string]any)
	if !ok {
		return invalid(validationIssue{Type: "model_attributes_type", Loc: []any{"body"},
			Msg: "Input should be a valid dictionary or object to extract fields from", Input: body})
	}
	return obj, true
}

// queryObject is the request's query as FastAPI's scalar Query parameters
// read it: a parameter's last value.
func queryObject(r *http.Request) map[string]any {
	obj := map[string]any{}
	for k, vs := range r.URL.Query() {
		if len(vs) > 0 {
			obj[k] = vs[len(vs)-1]
		}
	}
	return obj
}

// pydanticFields reads an object's fields as a pydantic model does,
// collecting the issues of those that do not validate. Unknown fields are
// ignored, as pydantic does.
type pydanticFields struct {
	obj    map[string]any
	where  string // "body" or "query"
	issues []validationIssue
}

func (f *pydanticFields) issue(typ, field, msg string, input any) {
	f.issues = append(f.issues, validationIssue{Type: typ, Loc: []any{f.where, field}, Msg: msg, Input: input})
}

// str reads a string field; required says it must be given (not null).
func (f *pydanticFields) str(name string, required bool) string {
	v, ok := f.obj[name]
	if !ok || (v == nil && !required) {
		if required {
			input := any(f.obj)
			if f.where == "query" {
				input = nil
			}
			f.issue("missing", name, "Field required", input)
		}
		return ""
	}
	s, ok := v.(string)
	if !ok {
		f.issue("string_type", name, "Input should be a valid string", v)
	}
	return s
}

// optStr reads an optional string field (absent or null: nil).
func (f *pydanticFields) optStr(name string) *string {
	if v, ok := f.obj[name]; !ok || v == nil {
		return nil
	}
	s := f.str(name, false)
	return &s
}

// optStrList reads an optional list of strings (absent or null: nil).
func (f *pydanticFields) optStrList(name string) []string {
	v, ok := f.obj[name]
	if !ok || v == nil {
		return nil
	}
	items, ok := v.([]any)
	if !ok {
		f.issue("list_type", name, "Input should be a valid list", v)
		return nil
	}
	out := make([]string, 0, len(items))
	for i, it := range items {
		s, ok := it.(string)
		if !ok {
			f.issues = append(f.issues, validationIssue{Type: "string_type", Loc: []any{f.where, name, i},
				Msg: "Input should be a valid string", Input: it})
			continue
		}
		out = append(out, s)
	}
	return out
}

// optInt reads an optional integer (absent or null: nil); as pydantic's
// lax mode, a string of an integer and an integral float are integers.
func (f *pydanticFields) optInt(name string) *int {
	v, ok := f.obj[name]
	if !ok || v == nil {
		return nil
	}
	var text string
	switch t := v.(type) {
	case json.Number:
		text = t.String()
	case string:
		text = strings.TrimSpace(t)
	default:
		f.issue("int_type", name, "Input should be a valid integer", v)
		return nil
	}
	n, err := strconv.Atoi(text)
	if err != nil {
		fl, ferr := strconv.ParseFloat(text, 64)
		if ferr != nil || fl != float64(int(fl)) {
			f.issue("int_parsing", name, "Input should be a valid integer, unable to parse string as an integer", v)
			return nil
		}
		n = int(fl)
	}
	return &n
}

// answer writes FastAPI's 422 when a field did not validate; it reports
// whether the fields are good.
func (f *pydanticFields) answer(w http.ResponseWriter) bool {
	if len(f.issues) == 0 {
		return true
	}
	writeDetail(w, http.StatusUnprocessableEntity, f.issues)
	return false
}
