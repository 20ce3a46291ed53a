package compat

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/sandgate/sandgate/dataplane"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/rest"
)

// SandboxRouterPrefix serves what agent-sandbox's sandbox-router sends a
// sandbox: requests that name it in X-Sandbox-ID (a SandboxClaim's
// status.sandbox.name, which for a sandgate-fulfilled claim is the
// session's id) and carry the runtime's paths at the root (GET /, POST
// /execute). cmd/sandgate moves such requests under this prefix
// (RouterPath), so a router's users can point at the gateway.
const SandboxRouterPrefix = "/compat/sandbox-router"

// SandboxIDHeader is the router's header naming the sandbox.
const SandboxIDHeader = "X-Sandbox-ID"

// RouterPath is the path a request naming a sandbox in X-Sandbox-ID is
// served at, or "" when it is not such a request (it has no X-Sandbox-ID,
// or its path is one of the gateway's own).
func RouterPath(r *http.Request) string {
	if r.Header.Get(SandboxIDHeader) == "" {
		return ""
	}
	p := r.URL.Path
	for _, own := range []string{"/v1/", "/compat/", "/links/", "/healthz", "/readyz", "/metrics", "/openapi."} {
		if strings.HasPrefix(p, own) {
			return ""
		}
	}
	return SandboxRouterPrefix + p
}

type routerAPI struct{ d *Deps }

func (x *routerAPI) mount(r chi.Router) {
	r.Get("/", x.health)
	r.Post("/execute", x.execute)
}

// credential authenticates a router request by the token of the session
// X-Sandbox-ID names (the claim's Secret's token: the session's SSH
// password) as the session's tenant; otherwise the request is
// authenticated as any other (an API key or a JWT).
func (x *routerAPI) credential(r *http.Request) (gateway.Principal, bool) {
	owners, ok := x.d.Sessions.(rest.SessionOwners)
	tok, bearer := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	id := r.Header.Get(SandboxIDHeader)
	if !ok || !bearer || tok == "" || len(tok) > 256 {
		return gateway.Principal{}, false
	}
	tenant, known := owners.Owner(id)
	if !known {
		return gateway.Principal{}, false
	}
	s, err := x.d.Sessions.Get(r.Context(), gateway.Principal{Tenant: tenant}, id)
	if err != nil || !s.CheckPassword(tok) {
		return gateway.Principal{}, false
	}
	return gateway.Principal{Tenant: tenant, Method: "session_token"}, true
}

// session is the caller's session that X-Sandbox-ID names, or it answers.
func (x *routerAPI) session(w http.ResponseWriter, r *http.Request) (*gateway.Session, bool) {
	p, _ := gateway.PrincipalFrom(r.Context())
	s, err := x.d.Sessions.Get(r.Context(), p, r.Header.Get(SandboxIDHeader))
	if err != nil {
		rest.WriteGatewayError(w, err)
		return nil, false
	}
	return s, true
}

// health is the runtime's GET /.
func (x *routerAPI) health(w http.ResponseWriter, r *http.Request) {
	if _, ok := x.session(w, r); !ok {
		return
	}
	_ = rest.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok", "message": "Sandbox Runtime is active."})
}

type routerExecRequest struct {
	Command *string `json:"command"`
}

// execute is the runtime's POST /execute {"command"}: the command runs as
// a fresh process (bash -c), as an SSH exec, and the answer is
// {"stdout", "stderr", "exit_code"}.
func (x *routerAPI) execute(w http.ResponseWriter, r *http.Request) {
	s, ok := x.session(w, r)
	if !ok {
		return
	}
	var req routerExecRequest
	if status, code, msg := rest.DecodeJSON(w, r, &req); status != 0 {
		rest.WriteError(w, status, code, msg)
		return
	}
	if req.Command == nil || strings.ContainsRune(*req.Command, 0) {
		rest.WriteError(w, http.StatusBadRequest, "invalid_command", "command is required, without NUL characters")
		return
	}
	dreq := dataplane.Request{Command: *req.Command, Timeout: x.d.Plane.Bounds.MaxTimeout,
		MaxOutputBytes: min(rest.DefaultCommandOutput, x.d.Plane.Bounds.MaxOutputBytes), NoDirect: x.d.Plane.Bounds.CommandShell}
	release, err := x.d.Plane.Budget.Acquire(r.Context(), s.Tenant, dataplane.CommandCost(dreq.MaxOutputBytes, false))
	if err != nil {
		if r.Context().Err() == nil {
			rest.WriteGatewayError(w, err)
		}
		return
	}
	defer release()
	res, err := dataplane.Run(r.Context(), s, dreq)
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			x.d.Log.WarnContext(r.Context(), "compat_exec_failed", "api", "sandbox-router", "session", s.ID, "err", err)
		}
		rest.WriteGatewayError(w, dataplane.Failure(err, "the command could not be started"))
		return
	}
	code := 0
	if res.ExitCode != nil {
		code = *res.ExitCode
	} else {
		code = 128 + signalNumber(res.ExitSignal)
	}
	_ = rest.WriteJSON(w, http.StatusOK, map[string]any{"stdout": outputText(res.Stdout), "stderr": outputText(res.Stderr), "exit_code": code})
}
