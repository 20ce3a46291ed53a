package rest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/sandgate/sandgate/dataplane"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sandbox"
)

// The seeds' own APIs, each a thin mapping onto the native engines (the
// session manager and the data plane), one file per seed:
//
//	/compat/sbs            compat_sbs.go         session-based-sandbox (seed 000)
//	/compat/sandkasten     compat_sandkasten.go  Sandkasten (seed 003)
//	/compat/agent-sandbox  compat_agentsandbox.go  Agent Sandbox (seed 001)
//
// They are not in the OpenAPI spec: their shapes are the seeds'. See
// docs/compat.md.

// compatAPI is one seed's API: the prefix it is served under and the
// function that mounts its routes on a router already behind
// authentication and the rate limit.
type compatAPI struct {
	prefix string
	mount  func(r chi.Router)
	// before, when set, runs before authentication, for this prefix only
	// (a seed's own credential header turned into a bearer token).
	before func(http.Handler) http.Handler
}

// compatAPIs lists the seeds' APIs. Add a seed's API here.
func (a *api) compatAPIs() []compatAPI {
	return []compatAPI{
		{prefix: "/compat/sbs", mount: newSBS(a).mount},
		{prefix: "/compat/sandkasten", mount: newSandkasten(a).mount},
		{prefix: "/compat/agent-sandbox", mount: a.mountAgentSandbox, before: agentSandboxAPIKey},
	}
}

// mountCompat mounts the seeds' own APIs under /compat/<seed>, each behind
// the same authentication (a sandgate bearer token) and rate limit as /v1.
// A failed authentication answers with the native error envelope.
func (a *api) mountCompat(r chi.Router) {
	for _, c := range a.compatAPIs() {
		chain := []func(http.Handler) http.Handler{markCompat, a.authenticate, a.limit}
		if c.before != nil {
			chain = append([]func(http.Handler) http.Handler{c.before}, chain...)
		}
		r.With(chain...).Route(c.prefix, c.mount)
	}
}

// isNotFound reports whether err is the session manager's not_found: the
// session does not exist, ended, or is another tenant's.
func isNotFound(err error) bool {
	var ge *gateway.Error
	return errors.As(err, &ge) && (ge.Kind == gateway.KindNotFound || ge.Kind == gateway.KindGone)
}

type compatKey struct{}

// markCompat marks a compat API's request, whose errors know no
// session_gone (see writeCompatError).
func markCompat(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), compatKey{}, true)))
	})
}

// holdSession makes s count as active until ctx (a request's, which
// ends when its handler returns) ends: what a call does in s, however
// long, is activity, and the idle timeout never ends s under it
// (gateway.Session.Hold), as dataSession does for /v1.
func holdSession(ctx context.Context, s *gateway.Session) {
	context.AfterFunc(ctx, s.Hold())
}

// compatRequest reports whether r came through a compat API.
func compatRequest(r *http.Request) bool { return r.Context().Value(compatKey{}) != nil }

// writeCompatError is WriteGatewayError for the compat APIs, whose
// clients know no session_gone: a gone session is not_found there.
func writeCompatError(w http.ResponseWriter, err error) {
	if errors.Is(err, gateway.ErrGone) {
		err = gateway.ErrNotFound
	}
	WriteGatewayError(w, err)
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
// newline writeJSON ends it with: as FastAPI answers (the seed's curl line
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
