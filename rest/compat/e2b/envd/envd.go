// Package envd serves E2B's envd API for one sandgate session: the Connect
// RPC services process.Process and filesystem.Filesystem, the HTTP file
// endpoints GET/POST /files and GET /health, as E2B's SDKs call them at the
// sandbox URL. The e2b package's router authenticates each request,
// resolves its session and hands it to Server.ServeSession.
package envd

import (
	"log/slog"
	"net/http"

	"github.com/sandgate/sandgate/dataplane"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/rest"
)

// Deps are the engines envd serves from: the ones /v1 serves from.
type Deps struct {
	// Sessions is the session manager.
	Sessions rest.Sessions
	// Plane is the data plane (commands, processes, files).
	Plane *dataplane.Plane
	Log   *slog.Logger
}

// Server serves envd's API for sessions handed to it.
type Server struct {
	d Deps
}

// New returns a Server over d.
func New(d Deps) *Server {
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	return &Server{d: d}
}

// ServeSession serves one envd request for sess, already authenticated
// and resolved by the caller (the e2b router), whose principal is p.
// r.URL.Path is relative to the sandbox URL's root:
// /process.Process/Start, /filesystem.Filesystem/ListDir, /files, /health.
func (s *Server) ServeSession(w http.ResponseWriter, r *http.Request, sess *gateway.Session, p gateway.Principal) {
	_, _ = sess, p
	rest.WriteError(w, http.StatusNotImplemented, "not_implemented", "envd is not implemented yet")
}
