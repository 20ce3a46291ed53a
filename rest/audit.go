package rest

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/gateway"
)

// AuditLog is what GET /v1/audit reads (audit.File is one).
type AuditLog interface {
	Query(f audit.Filter) (audit.Page, error)
}

// unaudited are the routes whose calls are not audit events: they carry
// no identity and change nothing.
var unaudited = map[string]bool{"/healthz": true, "/readyz": true, "/openapi.yaml": true, "/openapi.json": true, "/docs": true, "/": true,
	"/ui": true, "/ui/*": true}

// call is what a request's handlers tell the audit middleware, through
// the request's context: who it is from and what file it touched.
type call struct {
	tenant, auth string
	session      string // when the route names it otherwise than {id} (a link)
	route        string // when the route pattern does not name it (a preview origin)
	code         string // the error envelope's code, when one was written
	file         *fileOp
}

// fileOp is a REST file operation, reported with the call.
type fileOp struct {
	op, path string
	bytes    int64 // -1: the bytes of the answer's body
}

type callKey struct{}

func callOf(ctx context.Context) *call {
	c, _ := ctx.Value(callKey{}).(*call)
	return c
}

// auditFile marks r's call as the file operation op on path; bytes < 0
// means the bytes of the answer (a download).
func auditFile(r *http.Request, op, path string, bytes int64) {
	if c := callOf(r.Context()); c != nil {
		c.file = &fileOp{op: op, path: path, bytes: bytes}
	}
}

// auditFileStarted marks r's call as the file operation op on path, and
// records at once that it started (result "started"), so that a write cut
// off by a crash of the gateway still leaves a trace.
func (a *api) auditFileStarted(r *http.Request, op, path string) {
	auditFile(r, op, path, 0)
	c := callOf(r.Context())
	if c == nil {
		return
	}
	session := c.session
	if session == "" {
		session = chi.URLParam(r, "id")
	}
	actx := audit.WithRequest(r.Context(), audit.Request{ID: RequestID(r.Context()), Tenant: c.tenant, Auth: c.auth})
	a.auditor().Record(actx, audit.Event{Kind: audit.KindFile, Source: "rest", Session: session, Op: op, Path: path, Result: audit.ResultStarted})
}

// auditSessionOf names the session r's call is about, when its route
// does not (a create).
func auditSessionOf(r *http.Request, id string) {
	if c := callOf(r.Context()); c != nil {
		c.session = id
	}
}

// sessionResolver turns a session's name into its id (gateway.Manager).
type sessionResolver interface {
	Resolve(ctx context.Context, p gateway.Principal, ref string) string
}

func (a *api) auditor() audit.Auditor { return audit.Or(a.cfg.Audit) }

// auditCalls records every call (but the unaudited routes) once it is
// answered: tenant, route pattern, session, status and request id, and
// the file operation it made, if any. A call that ends without a caller
// (no tenant: a 401, an unknown route, a bad link) is volume anyone can
// send, so it is not recorded one by one (see unauthSampler): it is
// counted, sampled when it carried a credential, and summed up.
func (a *api) auditCalls(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.unauth.flush(a, time.Now())
		// Before the handlers: compat's X-API-Key becomes an Authorization.
		credential := credentialNone
		if r.Header.Get("Authorization") != "" || r.Header.Get("Proxy-Authorization") != "" ||
			r.Header.Get("X-API-Key") != "" || r.Header.Get("X-Access-Token") != "" || // E2B's sandbox token
			r.Header.Get("E2B-Traffic-Access-Token") != "" || // the same token, as the code interpreter's calls carry it
			strings.HasPrefix(r.URL.Path, "/links/") || a.isPreviewHost(r.Host) {
			credential = credentialInvalid
		}
		c := &call{}
		sw := &statusWriter{ResponseWriter: w, call: c}
		ctx := context.WithValue(r.Context(), callKey{}, c)
		next.ServeHTTP(sw, r.WithContext(ctx))
		route := ""
		if rc := chi.RouteContext(r.Context()); rc != nil {
			route = rc.RoutePattern()
		}
		if c.route != "" {
			route = c.route
		}
		if unaudited[route] {
			return
		}
		if route == "" {
			route = "(unknown)"
		}
		status := sw.status
		if status == 0 && r.Method == http.MethodConnect {
			status = http.StatusOK // hijacked: the tunnel answered 200 itself
		}
		session := ""
		if rc := chi.RouteContext(r.Context()); rc != nil {
			session = rc.URLParam("id")
		}
		if c.session != "" {
			session = c.session
		} else if res, ok := a.cfg.Sessions.(sessionResolver); ok && session != "" && c.tenant != "" {
			// The path may name the session: the trail keeps its id.
			session = res.Resolve(r.Context(), gateway.Principal{Tenant: c.tenant}, session)
		}
		// The request's own context has no tenant yet: authenticate set it
		// on c, below this middleware.
		actx := audit.WithRequest(r.Context(), audit.Request{ID: RequestID(r.Context()), Tenant: c.tenant, Auth: c.auth})
		result := "ok"
		if status >= 400 {
			result = c.code
			if result == "" {
				result = strconv.Itoa(status)
			}
		}
		if c.tenant == "" {
			sampled := a.unauth.admit(time.Now(), remoteIP(r), credential)
			if m, ok := a.cfg.Metrics.(UnauthenticatedMetrics); ok {
				m.UnauthenticatedCall(credential, sampled)
			}
			if !sampled {
				return
			}
		}
		a.auditor().Record(actx, audit.Event{Kind: audit.KindREST, Method: r.Method, Route: route, Session: session,
			Status: status, Result: result})
		if f := c.file; f != nil {
			n := f.bytes
			if n < 0 {
				n = 0
				if status < 300 {
					n = sw.bytes
				}
			}
			a.auditor().Record(actx, audit.Event{Kind: audit.KindFile, Source: "rest", Session: session, Op: f.op,
				Path: f.path, Bytes: n, Result: result})
		}
	})
}

// UnauthenticatedMetrics counts the calls that ended without a caller;
// Config.Metrics may implement it (internal/metrics does).
type UnauthenticatedMetrics interface {
	// UnauthenticatedCall: credential is "none" (no token, no link) or
	// "invalid" (one that did not verify); audited: an event was written.
	UnauthenticatedCall(credential string, audited bool)
}

const (
	credentialNone    = "none"
	credentialInvalid = "invalid"
)

// Bounds of the unauthenticated calls recorded one by one, per minute.
const (
	unauthPerAddr = 10
	unauthPerMin  = 100
)

// unauthSampler decides which unauthenticated calls are recorded: none
// that carried no credential, and of those whose token or link failed at
// most unauthPerAddr a minute per client address and unauthPerMin in all.
// The rest are summed up per minute: one "(unauthenticated)" event per
// kind of credential with its count, and one log line, written at the
// first call after the minute. An anonymous flood thus writes at most
// unauthPerMin+2 lines a minute, and cannot rotate tenants' events away.
type unauthSampler struct {
	mu         sync.Mutex
	window     time.Time      // the current minute's start (zero: none yet)
	perAddr    map[string]int // events written this minute, per address
	written    int
	suppressed map[string]int64 // per credential
}

// admit reports whether an unauthenticated call from addr is recorded.
func (s *unauthSampler) admit(now time.Time, addr, credential string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.window.IsZero() {
		s.window = now
	}
	if credential == credentialInvalid && s.written < unauthPerMin && s.perAddr[addr] < unauthPerAddr {
		if s.perAddr == nil {
			s.perAddr = map[string]int{}
		}
		s.perAddr[addr]++
		s.written++
		return true
	}
	if s.suppressed == nil {
		s.suppressed = map[string]int64{}
	}
	s.suppressed[credential]++
	return false
}

// flush writes the summary of a minute that has ended.
func (s *unauthSampler) flush(a *api, now time.Time) {
	s.mu.Lock()
	if s.window.IsZero() || now.Sub(s.window) < time.Minute {
		s.mu.Unlock()
		return
	}
	since, suppressed := s.window, s.suppressed
	s.window, s.perAddr, s.written, s.suppressed = time.Time{}, nil, 0, nil
	s.mu.Unlock()
	if len(suppressed) == 0 {
		return
	}
	args := []any{"since", since.UTC(), "until", now.UTC()}
	for _, credential := range []string{credentialNone, credentialInvalid} {
		n := suppressed[credential]
		if n == 0 {
			continue
		}
		args = append(args, "credential_"+credential, n)
		a.auditor().Record(context.Background(), audit.Event{Kind: audit.KindREST, Route: "(unauthenticated)",
			Result: "not_recorded", Reason: "credential " + credential + " since " + since.UTC().Format(time.RFC3339), Count: n})
	}
	a.cfg.Log.Warn("unauthenticated_calls_not_audited", args...)
}

// remoteIP is r's client address without the port.
func remoteIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// statusWriter notes the status and body bytes of an answer, and the
// error code WriteError puts in it. Unwrap lets http.ResponseController
// reach the connection (Flush, Hijack).
type statusWriter struct {
	http.ResponseWriter
	call   *call
	status int
	bytes  int64
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(p)
	w.bytes += int64(n)
	return n, err
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// noteErrorCode records code as the error of the call w answers.
func noteErrorCode(w http.ResponseWriter, code string) {
	for w != nil {
		if sw, ok := w.(*statusWriter); ok {
			sw.call.code = code
			return
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return
		}
		w = u.Unwrap()
	}
}

// withCaller puts p in the request's audit identity: the call's record and
// the context that events and log lines of the request see.
func withCaller(r *http.Request, p gateway.Principal) context.Context {
	if c := callOf(r.Context()); c != nil {
		c.tenant, c.auth = p.Tenant, p.Method
	}
	return audit.WithRequest(r.Context(), audit.Request{ID: RequestID(r.Context()), Tenant: p.Tenant, Auth: p.Method})
}

// listAudit serves GET /v1/audit?session=&since=&limit=&cursor=: the
// caller tenant's own events, newest first.
func (a *api) listAudit(w http.ResponseWriter, r *http.Request) {
	if a.cfg.AuditLog == nil {
		WriteError(w, http.StatusNotFound, "audit_unavailable", "this gateway keeps no audit log")
		return
	}
	q := r.URL.Query()
	f := audit.Filter{Tenant: principal(r).Tenant, Session: q.Get("session"), Cursor: q.Get("cursor")}
	if len(f.Session) > 128 {
		WriteError(w, http.StatusBadRequest, "invalid_session", "session is at most 128 characters")
		return
	}
	if q.Has("since") { // present but empty is not a time either
		t, err := time.Parse(time.RFC3339Nano, q.Get("since"))
		if err != nil {
			WriteError(w, http.StatusBadRequest, "invalid_since", "since must be an RFC 3339 time, e.g. 2026-01-02T15:04:05Z")
			return
		}
		f.Since = t
	}
	limit, err := queryInt(r, "limit", audit.DefaultQueryLimit, 1, audit.MaxQueryLimit)
	if err != nil {
		WriteError(w, http.StatusBadRequest, "invalid_limit", err.Error())
		return
	}
	f.Limit = limit
	page, err := a.cfg.AuditLog.Query(f)
	if err != nil {
		if errors.Is(err, audit.ErrBadCursor) {
			WriteError(w, http.StatusBadRequest, "invalid_cursor", "cursor must be the nextCursor of an earlier page")
			return
		}
		a.cfg.Log.ErrorContext(r.Context(), "audit_query_failed", "err", err)
		WriteError(w, http.StatusInternalServerError, "internal", "internal error")
		return
	}
	events := page.Events
	if events == nil {
		events = []audit.Event{}
	}
	out := map[string]any{"events": events}
	if page.Next != "" {
		out["nextCursor"] = page.Next
	}
	w.Header().Set("Cache-Control", "no-store")
	_ = WriteJSON(w, http.StatusOK, out)
}

// auditKernel records a Python kernel call.
func (a *api) auditKernel(r *http.Request, s *gateway.Session, kernel, code string, d time.Duration, result string) {
	// Through the session, which takes its secrets' values out of the code.
	s.Audit(r.Context(), audit.Event{Kind: audit.KindCommand, Source: "kernel", Command: code,
		DurationMs: d.Milliseconds(), Result: result, Op: strings.TrimSpace(kernel)})
}
