package compat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/sandgate/sandgate/dataplane"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/rest"
	"github.com/sandgate/sandgate/rest/compat/e2b"
	"github.com/sandgate/sandgate/sandbox"
)

// Package compat serves the seeds' own APIs, each a thin mapping onto the
// native engines (the session manager and the data plane), one file per
// seed:
//
//	/compat/sbs            sbs.go           session-based-sandbox (seed 000)
//	/compat/sandkasten     sandkasten.go    Sandkasten (seed 003)
//	/compat/agent-sandbox  agentsandbox.go  Agent Sandbox (seed 001)
//	/compat/e2b            e2b/             E2B's SDKs (issue 40)
//
// They are not in the OpenAPI spec: their shapes are the seeds'. See
// docs/compat.md. cmd/sandgate mounts them (New) on the /v1 API's handler
// (rest.Config.Mounts), behind its authentication, rate limit and audit.

// Deps are what the seeds' APIs serve from: the engines the /v1 API
// serves too.
type Deps struct {
	// Sessions is the session manager.
	Sessions rest.Sessions
	// Plane is the data plane's state (shells, kernels, files, the
	// budget of commands' answers, and its bounds).
	Plane *dataplane.Plane
	// Links hands out the file links of Agent Sandbox's artifacts.
	Links rest.Links
	// AgentSandbox configures Agent Sandbox's API (agentstore.go).
	AgentSandbox AgentSandboxConfig
	// ImageAliases are the names --image-alias gives: E2B templates of
	// these names get that image (package e2b).
	ImageAliases []string
	Log          *slog.Logger

	// agentStore is Agent Sandbox's sync with its object store (nil:
	// none), made by NewWithClose.
	agentStore *agentStore
}

// New returns the seeds' APIs, each under its prefix /compat/<seed>.
// Add a seed's API here. It is NewWithClose for callers with no
// background work to wait for (no Agent Sandbox object store).
func New(d Deps) []rest.Mount {
	mounts, _ := NewWithClose(d)
	return mounts
}

// NewWithClose is New, and the function that ends the APIs' background
// work (Agent Sandbox's cleanups of ended sandboxes' stored files): it
// waits for it, for at most ctx, then cancels it. Call it after the
// session manager's shutdown.
func NewWithClose(d Deps) ([]rest.Mount, func(context.Context) error) {
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	closeFn := func(context.Context) error { return nil }
	if d.AgentSandbox.Store != nil {
		var maxFetch int64
		if d.Plane != nil {
			maxFetch = d.Plane.Bounds.MaxFetchBytes
		}
		d.agentStore = newAgentStore(d.AgentSandbox, maxFetch, d.Log)
		closeFn = d.agentStore.Close
	}
	dp := &d
	mounts := []rest.Mount{
		{Prefix: "/compat/sbs", Handler: router(newSBS(dp).mount)},
		{Prefix: "/compat/sandkasten", Handler: router(newSandkasten(dp).mount)},
		{Prefix: "/compat/agent-sandbox", Handler: router(dp.mountAgentSandbox), Before: agentSandboxAPIKey},
	}
	rt := &routerAPI{d: dp}
	mounts = append(mounts, rest.Mount{Prefix: SandboxRouterPrefix, Handler: router(rt.mount), Credential: rt.credential})
	if ss, ok := d.Sessions.(e2b.Sessions); ok {
		mounts = append(mounts, e2b.New(e2b.Deps{Sessions: ss, Plane: d.Plane, Key: d.Links.Key, ImageAliases: d.ImageAliases, Log: d.Log})...)
	}
	return mounts, closeFn
}

// router is a router with the routes mount adds.
func router(mount func(chi.Router)) http.Handler {
	r := chi.NewRouter()
	mount(r)
	return r
}

// principal is the authenticated caller of r (rest's authentication put
// it in the request's context).
func principal(r *http.Request) gateway.Principal {
	p, _ := gateway.PrincipalFrom(r.Context())
	return p
}

// isNotFound reports whether err is the session manager's not_found: the
// session does not exist, ended, or is another tenant's.
func isNotFound(err error) bool {
	var ge *gateway.Error
	return errors.As(err, &ge) && (ge.Kind == gateway.KindNotFound || ge.Kind == gateway.KindGone)
}

// session finds the running session of the request's {id} for a
// data-plane call, answering 404 (not the caller's, or gone: the seeds'
// clients know no session_gone) or 409 (not running) itself; the call
// counts as activity until it returns (gateway.Session.Hold).
func (d *Deps) session(w http.ResponseWriter, r *http.Request) (*gateway.Session, bool) {
	s, err := d.Sessions.Get(r.Context(), principal(r), chi.URLParam(r, "id"))
	if err != nil {
		writeCompatError(w, err)
		return nil, false
	}
	if !s.Live() {
		rest.WriteError(w, http.StatusConflict, "session_not_running", "the session is not running; delete it")
		return nil, false
	}
	if err := holdSession(r.Context(), s); err != nil {
		writeCompatError(w, err)
		return nil, false
	}
	return s, true
}

// openFS is the session's SFTP server for one request, as /v1's file
// calls open it.
func (d *Deps) openFS(w http.ResponseWriter, r *http.Request, s *gateway.Session) (*dataplane.FS, bool) {
	fsys, err := d.Plane.Files.Open(r.Context(), s.ID, s.Tenant, s, false)
	if err != nil {
		d.fileError(w, r, err)
		return nil, false
	}
	return fsys, true
}

// fileError answers a file operation's failure as /v1 does.
func (d *Deps) fileError(w http.ResponseWriter, r *http.Request, err error) {
	rest.WriteDataError(w, r, d.Sessions, d.Log, err)
}

// holdSession makes s count as active until ctx (a request's, which
// ends when its handler returns) ends: what a call does in s, however
// long, is activity, and the idle timeout never ends s under it
// (gateway.Session.Hold), as dataSession does for /v1.
//
// A paused session resumes (gateway.Session.Wake), as for /v1: its
// error, if it cannot, is holdSession's.
func holdSession(ctx context.Context, s *gateway.Session) error {
	context.AfterFunc(ctx, s.Hold())
	return s.Wake(ctx)
}

// writeCompatError is WriteGatewayError for the compat APIs, whose
// clients know no session_gone: a gone session is not_found there.
func writeCompatError(w http.ResponseWriter, err error) {
	if errors.Is(err, gateway.ErrGone) {
		err = gateway.ErrNotFound
	}
	rest.WriteGatewayError(w, err)
}

// outputText renders a command's output stream as text, as the seeds'
// APIs carry it: output that is not UTF-8 has its invalid bytes replaced
// by U+FFFD (as Python's errors="replace" does).
func outputText(o dataplane.Output) string {
	if !o.IsBase64 {
		return o.Text
	}
	return strings.ToValidUTF8(string(o.Bytes()), "\uFFFD")
}

// signalNumber is the number of a signal the data plane names ("KILL"),
// or 0 when it has no number for it.
func signalNumber(name string) int {
	if sig, ok := sandbox.ParseSignal(name); ok {
		return int(sig)
	}
	return 0
}

// writeBareJSON writes v as the JSON answer with status, without the
// newline rest.WriteJSON ends it with: as FastAPI answers (the seed's curl line
// adds its own echo).
func writeBareJSON(w http.ResponseWriter, status int, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode answer: %w", err)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	if _, err := w.Write(b); err != nil {
		return fmt.Errorf("write answer: %w", err)
	}
	return nil
}
