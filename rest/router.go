package rest

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/go-chi/httprate"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/dataplane"
	"github.com/sandgate/sandgate/gateway"
)

// Sessions is what the API needs from the session manager. Create returns
// an empty password when it replays an earlier create with the same
// Idempotency-Key (see gateway.Manager.Create); Delete also rolls back a
// create whose answer could not be delivered.
type Sessions interface {
	Create(ctx context.Context, p gateway.Principal, cp gateway.CreateParams) (*gateway.Session, string, error)
	Get(ctx context.Context, p gateway.Principal, id string) (*gateway.Session, error)
	List(ctx context.Context, p gateway.Principal, limit, offset int) ([]*gateway.Session, int)
	Delete(ctx context.Context, p gateway.Principal, id string) error
	Update(ctx context.Context, p gateway.Principal, id string, up gateway.UpdateParams) (*gateway.Session, error)
}

// Verifier turns a bearer token into a principal.
type Verifier interface {
	Verify(token string) (gateway.Principal, error)
}

// Config wires the API.
type Config struct {
	Sessions Sessions
	Verifier Verifier
	Log      *slog.Logger
	// RateLimit is requests per minute per principal; 0 disables it.
	RateLimit int
	// SSHUsername is the username advertised to clients ("sandbox").
	SSHUsername string
	// HostKeys are the gateway's SSH host keys, authorized_keys format.
	HostKeys []string
	// Connect serves CONNECT /v1/sessions/{id} and /sessions/{id}, already
	// authenticated (the principal is in the request context).
	Connect http.Handler
	// Isolation, when set ("none" for the workdir driver), is shown in
	// every session answer, with Unenforced: the resource limits
	// (memoryMiB, cpus, pids, diskMiB) the sandbox driver does not enforce.
	Isolation  string
	Unenforced []string
	// Images lists the images sessions may use (nil: the default root only).
	Images Images
	// Ready reports whether the gateway can serve, with details for
	// operators (shown only to authenticated callers); nil means always ready.
	Ready func() (map[string]any, error)
	// DataPlane bounds commands, files and processes over REST.
	DataPlane DataPlane
	// Mounts are other APIs served beside /v1 (cmd/sandgate mounts the
	// seeds' compat APIs): see Mount.
	Mounts []Mount
	// Plane, when set, is the data plane's state, shared with the other
	// APIs the gateway serves (see Mounts); DataPlane is then ignored.
	// nil: New makes one of DataPlane.
	Plane *dataplane.Plane
	// LinkKey signs presigned file links (links.go); nil: a random key,
	// so links die with the process.
	LinkKey []byte
	// Metrics counts rate-limit refusals (nil: not counted; metrics.go).
	Metrics Metrics
	// NoPorts turns preview URLs off (ports.go): 403 ports_disabled, as
	// serve does when --ssh-allow-local-forward=false.
	NoPorts bool
	// PublicURL is the gateway's URL as clients reach it (serve
	// --public-url): the base of presigned links and preview origins. ""
	// uses the address the request's connection reached, never the
	// request's Host header (preview.go).
	PublicURL string
	// PreviewDomain is the domain preview origins are one label under
	// (serve --preview-domain; "": DefaultPreviewDomain, localhost).
	PreviewDomain string
	// Audit receives an event per call, file operation and kernel call
	// (nil: none kept; audit.go).
	Audit audit.Auditor
	// AuditLog answers GET /v1/audit (nil: 404 audit_unavailable).
	AuditLog AuditLog
	// Workspaces keeps named workspaces and snapshots (nil: none;
	// workspaces.go).
	Workspaces Workspaces
	// Stopping is closed when the gateway's shutdown drain ends: a REST
	// command still running is then ended and answered (503
	// shutting_down with its output so far; a stream gets a closing error
	// line). nil: never.
	Stopping <-chan struct{}
	// Console, when set, serves the web console's files under /ui/
	// (cmd/sandgate passes package console's handler; nil: no console).
	Console http.Handler
	// ServerTiming shows each step of a create in the Server-Timing
	// header of POST /v1/sessions (serve --server-timing); false: only
	// the total, as the steps tell whether the warm pool had a sandbox,
	// which other tenants' creates empty. It also times a command's
	// start and run, and says whether the shell ran it, in the header
	// of a command's JSON answer (not a stream's, nor a shell's).
	// A fork's answer times its checkpoint, restores and images' removal.
	ServerTiming bool
}

// MaxBodyBytes bounds request bodies.
const MaxBodyBytes = 64 << 10

// New returns the HTTP handler of the whole API.
func New(cfg Config) http.Handler {
	if cfg.HostKeys == nil {
		cfg.HostKeys = []string{}
	}
	if len(cfg.LinkKey) == 0 {
		cfg.LinkKey = NewLinkKey()
	}
	plane := cfg.Plane
	if plane == nil {
		plane = dataplane.NewPlane(cfg.DataPlane)
	}
	a := &api{cfg: cfg, authFailures: newFailureLimiter(cfg.RateLimit), dp: plane}
	if stale := a.dp.Files.StaleUploads(); len(stale) > 0 {
		go a.sweepUploads(stale) // files.go
	}
	a.linkLimits = newLinkLimits(a.dp.Bounds)
	a.ports = newPortsProxy(a)
	a.restoreProcesses()
	if m, ok := cfg.Sessions.(interface{ SetAdopter(gateway.Adopter) }); ok {
		// A pause by checkpoint hands the commands under way (an SSH
		// exec) to the background processes (docs/pause.md).
		m.SetAdopter(func(s *gateway.Session, h gateway.Handoff) (string, error) {
			return a.dp.Processes.Adopt(s, a.processConfig(), h)
		})
	}
	r := chi.NewRouter()
	r.Use(requestID, a.auditCalls, a.recoverer, middleware.GetHead)
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		WriteError(w, http.StatusNotFound, "unknown_endpoint", "no such endpoint: "+r.Method+" "+r.URL.Path)
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, req *http.Request) {
		if allow := allowedMethods(r, req.URL.Path); allow != "" {
			w.Header().Set("Allow", allow)
		}
		WriteError(w, http.StatusMethodNotAllowed, "method_not_allowed", fmt.Sprintf("method %s not allowed here", req.Method))
	})
	r.Get("/healthz", func(w http.ResponseWriter, r *http.Request) {
		_ = WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	r.Get("/readyz", a.readyz)
	// Presigned links (links.go) carry their own authorization.
	r.Get("/links/{token}", a.fetchLink)
	r.HandleFunc("/links/ports/{token}", portRedirect) // ports.go
	r.HandleFunc("/links/ports/{token}/*", a.proxyPortLink)
	docs := &apiDocs{}
	r.Get("/openapi.yaml", docs.yaml)
	r.Get("/openapi.json", docs.jsonSpec)
	r.Get("/docs", docs.page)
	r.Get("/", docs.home) // docs.go: the landing page
	if cfg.Console != nil {
		// The web console's files (package console): they carry no
		// credential; the console calls /v1 like any client.
		r.Get("/ui", http.RedirectHandler("/ui/", http.StatusMovedPermanently).ServeHTTP)
		r.Get("/ui/*", cfg.Console.ServeHTTP)
	}

	a.limit = a.rateLimit() // one budget per tenant, /v1 and /compat together
	authed := r.With(a.authenticate, a.limit)
	authed.Route("/v1", func(r chi.Router) {
		r.Post("/sessions", a.create)
		r.Get("/sessions", a.list)
		r.Get("/sessions/{id}", a.get)
		r.Patch("/sessions/{id}", a.update)
		r.Delete("/sessions/{id}", a.delete)
		r.Post("/sessions/{id}/stop", a.stop)
		r.Post("/sessions/{id}/pause", a.pause)
		r.Post("/sessions/{id}/resume", a.resume)
		r.Post("/sessions/{id}/fork", a.fork) // fork.go
		r.Post("/sessions/{id}/snapshots", a.createSnapshot)
		r.Post("/workspaces", a.createWorkspace)
		r.Get("/workspaces", a.listWorkspaces)
		r.Delete("/workspaces/{name}", a.deleteWorkspace)
		r.Get("/snapshots", a.listSnapshots)
		r.Delete("/snapshots/{id}", a.deleteSnapshot)
		// The data plane (dataplane.go): commands, files, processes.
		r.Post("/sessions/{id}/commands", a.runCommand)
		r.Get("/sessions/{id}/commands", a.listCommands)
		r.Delete("/sessions/{id}/shells/{name}", a.deleteShell)
		r.Get("/sessions/{id}/files", a.getFile)
		r.Put("/sessions/{id}/files", a.putFile)
		r.Delete("/sessions/{id}/files", a.deleteFile)
		r.Post("/sessions/{id}/files/fetch", a.fetchFiles)
		r.Post("/sessions/{id}/files/link", a.createLink)
		r.Get("/sessions/{id}/logs", a.sessionLogs)
		r.Get("/sessions/{id}/stats", a.sessionStats)                        // stats.go
		r.Get("/sessions/{id}/egress", a.sessionEgress)                      // egress.go
		r.Get("/sessions/{id}/egress/pending", a.sessionPending)             // approvals.go
		r.Post("/sessions/{id}/egress/pending/{pendingId}", a.decidePending) // approvals.go
		r.Get("/sessions/{id}/timeline", a.sessionTimeline)                  // timeline.go
		// Preview URLs (ports.go).
		r.HandleFunc("/sessions/{id}/ports/link", a.portLink) // every method: "link" is no port
		r.HandleFunc("/sessions/{id}/ports/{port}", portRedirect)
		r.HandleFunc("/sessions/{id}/ports/{port}/*", a.proxyPort)
		r.Post("/sessions/{id}/processes", a.startProcess)
		r.Get("/sessions/{id}/processes", a.listProcesses)
		r.Get("/sessions/{id}/processes/{pid}", a.getProcess)
		r.Get("/sessions/{id}/processes/{pid}/output", a.processOutput)
		r.Post("/sessions/{id}/processes/{pid}/stdin", a.processStdin)
		r.Post("/sessions/{id}/processes/{pid}/signal", a.processSignal)
		// The persistent Python kernel (python.go).
		r.Post("/sessions/{id}/python", a.runPython)
		r.Post("/sessions/{id}/python/reset", a.resetPython)
		r.Get("/host-keys", a.hostKeys)
		r.Get("/images", a.listImages)
		r.Get("/audit", a.listAudit)
		if cfg.Connect != nil {
			r.Connect("/sessions/{id}", cfg.Connect.ServeHTTP)
			r.Get("/sessions/{id}/ssh", a.sshWebSocket)      // sshws.go
			r.Get("/sessions/{id}/terminal", a.sshWebSocket) // a PTY shell (tunnel/terminal.go)
			r.Post("/sessions/{id}/tickets", a.createTicket) // tickets.go
		}
	})
	if cfg.Connect != nil {
		authed.Connect("/sessions/{id}", cfg.Connect.ServeHTTP)
	}
	// Other APIs (the seeds', rest/compat), behind the same
	// authentication and rate limit (mount.go).
	a.mount(r, cfg.Mounts)

	// Preview origins (preview.go) are told apart by the Host header: any
	// path on them is the sandbox's, none of the API's.
	pv := chi.NewRouter()
	pv.Use(requestID, a.auditCalls, a.recoverer)
	pv.HandleFunc("/*", a.servePreview)
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if _, ok := a.previewHost(req.Host); ok {
			pv.ServeHTTP(w, req)
			return
		}
		r.ServeHTTP(w, req)
	})
}

// allowedMethods lists the methods routes serve at path, for the Allow
// header a 405 must carry (RFC 9110 section 15.5.6). It lists what the
// OpenAPI spec documents as the path's operations; CONNECT, which OpenAPI
// 3.0 cannot describe as one, is listed only on a path that has nothing
// else (the /sessions/{id} alias), so that Allow is never empty.
func allowedMethods(routes chi.Routes, path string) string {
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions, http.MethodHead, http.MethodTrace} {
		if routes.Match(chi.NewRouteContext(), m, path) {
			allow = append(allow, m)
		}
	}
	if len(allow) == 0 && routes.Match(chi.NewRouteContext(), http.MethodConnect, path) {
		allow = append(allow, http.MethodConnect)
	}
	return strings.Join(allow, ", ")
}

type api struct {
	cfg          Config
	authFailures *httprate.RateLimiter // nil: unlimited
	dp           *dataplane.Plane
	limit        func(http.Handler) http.Handler // the per-tenant rate limit
	ports        *portsProxy                     // preview URLs (ports.go)
	unauth       unauthSampler                   // unauthenticated calls' audit (audit.go)
	linkLimits   linkLimits                      // link fetches per link and per address (links.go)
	tickets      tickets                         // one-use WebSocket tickets (tickets.go)
}

// newFailureLimiter bounds failed authentications per client IP, so token
// guessing is limited like authenticated use is.
func newFailureLimiter(perMinute int) *httprate.RateLimiter {
	if perMinute <= 0 {
		return nil
	}
	return httprate.NewRateLimiter(perMinute, time.Minute, httprate.WithKeyFuncs(httprate.KeyByIP))
}

// readyz answers ready or not ready to anyone, and the details (the
// sandbox driver, the limits it enforces, the reason it is not ready) only
// to an authenticated caller: they describe the host. A token that does
// not verify is a 401, as everywhere, so /readyz is no oracle for guessing
// tokens beyond the failed-authentication limit.
func (a *api) readyz(w http.ResponseWriter, r *http.Request) {
	authed := false
	if r.Header.Get("Authorization") != "" {
		if _, ok := a.verify(w, r); !ok {
			return
		}
		authed = true
	}
	out := map[string]any{}
	if a.cfg.Ready != nil {
		details, err := a.cfg.Ready()
		if err != nil {
			msg := "the gateway is not ready"
			if authed {
				msg += ": " + err.Error()
			}
			WriteError(w, http.StatusServiceUnavailable, "not_ready", msg)
			return
		}
		if authed {
			for k, v := range details {
				out[k] = v
			}
		}
	}
	out["status"] = "ready"
	_ = WriteJSON(w, http.StatusOK, out)
}

func (a *api) recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				a.cfg.Log.ErrorContext(r.Context(), "handler_panic", "method", r.Method, "path", r.URL.Path, "panic", fmt.Sprint(v))
				WriteError(w, http.StatusInternalServerError, "internal", "internal error")
			}
		}()
		next.ServeHTTP(w, r)
	})
}

// authenticate puts the request's principal in its context or answers 401.
func (a *api) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p, has, valid := a.ticketPrincipal(r); has { // tickets.go
			if !valid {
				WriteError(w, http.StatusUnauthorized, "invalid_ticket", "the ticket is unknown, used, expired or for another session")
				return
			}
			next.ServeHTTP(w, r.WithContext(gateway.WithPrincipal(withCaller(r, p), p)))
			return
		}
		p, ok := a.verify(w, r)
		if !ok {
			return
		}
		next.ServeHTTP(w, r.WithContext(gateway.WithPrincipal(withCaller(r, p), p)))
	})
}

// verify returns the principal of r's bearer token, or answers 401 (429
// past the failed-authentication limit) and returns false. CONNECT
// requests may carry the token in Proxy-Authorization.
func (a *api) verify(w http.ResponseWriter, r *http.Request) (gateway.Principal, bool) {
	p, err := a.cfg.Verifier.Verify(gateway.BearerToken(r))
	if err == nil {
		return p, true
	}
	if a.authFailures != nil {
		if ip, kerr := httprate.KeyByIP(r); kerr == nil && a.authFailures.OnLimit(w, r, ip) {
			a.rateLimited("auth_failures")
			WriteError(w, http.StatusTooManyRequests, "rate_limited", "too many failed authentications from this address")
			return gateway.Principal{}, false
		}
	}
	if r.Method == http.MethodConnect {
		w.Header().Set("Proxy-Authenticate", `Bearer realm="sandgate"`)
	}
	WriteError(w, http.StatusUnauthorized, "unauthorized", "missing or invalid bearer token")
	return gateway.Principal{}, false
}

func (a *api) rateLimit() func(http.Handler) http.Handler {
	if a.cfg.RateLimit <= 0 {
		return func(next http.Handler) http.Handler { return next }
	}
	return httprate.Limit(a.cfg.RateLimit, time.Minute,
		httprate.WithKeyFuncs(func(r *http.Request) (string, error) {
			p, _ := gateway.PrincipalFrom(r.Context())
			return p.Tenant, nil
		}),
		httprate.WithLimitHandler(func(w http.ResponseWriter, r *http.Request) {
			a.rateLimited("tenant")
			WriteError(w, http.StatusTooManyRequests, "rate_limited",
				fmt.Sprintf("rate limit of %d requests per minute exceeded", a.cfg.RateLimit))
		}),
	)
}

func principal(r *http.Request) gateway.Principal {
	p, _ := gateway.PrincipalFrom(r.Context())
	return p
}

// hostKeys serves the gateway's SSH host keys so clients can pin them
// before they have a session (sandgate ssh-config uses it).
func (a *api) hostKeys(w http.ResponseWriter, r *http.Request) {
	_ = WriteJSON(w, http.StatusOK, map[string]any{"hostKeys": a.cfg.HostKeys})
}
