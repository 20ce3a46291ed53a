package e2b

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/rest/compat/e2b/e2bmeta"
)

// serveSandbox serves the sandbox URL (E2B_SANDBOX_URL): the request's
// E2b-Sandbox-Id names the sandbox, one of the caller's (already
// authenticated: the sandbox's access token or an API key), and its
// E2b-Sandbox-Port the service: envd (49983, or none) or the code
// interpreter (49999). The path after the prefix is the service's.
func (a *api) serveSandbox(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get("E2b-Sandbox-Id")
	if id == "" {
		writeError(w, http.StatusBadRequest, "missing_sandbox_id", "the E2b-Sandbox-Id header names no sandbox")
		return
	}
	port := EnvdPort
	if v := r.Header.Get("E2b-Sandbox-Port"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			writeError(w, http.StatusBadRequest, "invalid_port", fmt.Sprintf("E2b-Sandbox-Port %q is not a port", v))
			return
		}
		port = n
	}
	if port != EnvdPort && port != InterpreterPort {
		writeError(w, http.StatusNotImplemented, "unsupported_port", fmt.Sprintf(
			"port %d is not served at the sandbox URL: only envd (%d) and the code interpreter (%d) are; reach other ports through sandgate's preview URLs (/v1/sessions/{id}/ports/{port})",
			port, EnvdPort, InterpreterPort))
		return
	}
	p := principal(r)
	s, err := a.d.Sessions.Get(r.Context(), p, id)
	if err == nil && (!s.Live() || s.ID != id) {
		err = gateway.ErrNotFound // ended, or a name, which E2B's ids never are
	}
	if err != nil {
		writeGatewayError(w, err)
		return
	}
	hold(r.Context(), s)
	if rec, ok := e2bmeta.Of(s); ok && rec.AutoPause && isPaused(s.Status()) {
		// The call may resume it (a process, a kernel, a file with
		// Resume): it then pauses again at its timeout.
		ctx, cancel := context.WithCancel(r.Context())
		done := make(chan struct{})
		defer func() { cancel(); <-done }()
		go func() {
			defer close(done)
			a.pauseOnResume(ctx, s, rec)
		}()
	}
	// A session paused in place resumes before envd or the interpreter
	// touch it (its frozen processes, file server and kernels would not
	// answer); one that autoPause pauses again at its timeout.
	if err := s.Wake(r.Context()); err != nil {
		writeGatewayError(w, err)
		return
	}
	r = stripPrefix(r, SandboxPrefix)
	if port == InterpreterPort {
		a.serveInterpreter(w, r, s)
		return
	}
	a.envd.ServeSession(w, r, s, p)
}

// stripPrefix is r with its path relative to prefix ("/" at least), and
// a context without the mount's routing state, for the service's router.
func stripPrefix(r *http.Request, prefix string) *http.Request {
	ctx := context.WithValue(r.Context(), chi.RouteCtxKey, nil)
	r2 := r.WithContext(ctx)
	u := *r.URL
	u.Path = "/" + strings.TrimLeft(strings.TrimPrefix(u.Path, prefix), "/")
	u.RawPath = ""
	r2.URL = &u
	return r2
}
