package rest

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/workspace"
)

// Mount is an API served beside /v1 by the same handler (the seeds'
// compat APIs, rest/compat): Handler serves the paths under Prefix,
// behind the same request id, audit, authentication (a sandgate bearer
// token; a failure answers with the native error envelope) and rate
// limit as /v1. The /v1 API knows nothing else of it.
type Mount struct {
	Prefix  string
	Handler http.Handler
	// Before, when set, runs before authentication, for this prefix only
	// (a seed's own credential header turned into a bearer token).
	Before func(http.Handler) http.Handler
	// Credential, when set, authenticates this prefix's requests by a
	// credential of the API's own (E2B's per-sandbox access token): it
	// returns the caller, or false, and the request is then
	// authenticated as any other (a bearer token, or a 401).
	Credential func(r *http.Request) (gateway.Principal, bool)
}

// APIKeyAsBearer is a Before for a seed whose clients authenticate with
// X-API-Key (a sandgate token): a request without an Authorization header
// has its X-API-Key turned into a bearer token, and the header is dropped
// either way.
func APIKeyAsBearer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := r.Header["X-Api-Key"]; ok {
			key := strings.TrimSpace(r.Header.Get("X-API-Key"))
			r = r.Clone(r.Context())
			if key != "" && r.Header.Get("Authorization") == "" {
				r.Header.Set("Authorization", "Bearer "+key)
			}
			r.Header.Del("X-API-Key")
		}
		next.ServeHTTP(w, r)
	})
}

// mount serves ms on r.
func (a *api) mount(r chi.Router, ms []Mount) {
	for _, m := range ms {
		auth := a.authenticate
		if m.Credential != nil {
			auth = a.credential(m.Credential)
		}
		chain := []func(http.Handler) http.Handler{auth, a.limit}
		if m.Before != nil {
			chain = append([]func(http.Handler) http.Handler{m.Before}, chain...)
		}
		r.With(chain...).Mount(m.Prefix, m.Handler)
	}
}

// credential is authenticate for a Mount with a Credential of its own,
// which is tried first.
func (a *api) credential(check func(*http.Request) (gateway.Principal, bool)) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		authed := a.authenticate(next)
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if p, ok := check(r); ok {
				next.ServeHTTP(w, r.WithContext(gateway.WithPrincipal(withCaller(r, p), p)))
				return
			}
			authed.ServeHTTP(w, r)
		})
	}
}

// SessionOwners finds a session's tenant without a principal
// (gateway.Manager.Owner): a Sessions that has it can serve presigned
// links.
type SessionOwners interface {
	Owner(id string) (string, bool)
}

// Links hands out links to a session's files for an API other than /v1
// (Agent Sandbox's artifact URLs): the gateway's own presigned links
// (GET /links/{token}, signed with Key), or the object store's.
type Links struct {
	// Key signs the links: Config.LinkKey, the same key.
	Key []byte
	// PublicURL is Config.PublicURL.
	PublicURL string
	// Artifacts, when set, presigns object-store URLs of the files under
	// /workspace (Config.Workspaces, when it is one).
	Artifacts ArtifactPresigner
	Log       *slog.Logger
}

// FileURL is a link to the file p of s, expiring in expiresIn seconds: a
// presigned URL of the object store when there is one, else the
// gateway's own link.
func (l Links) FileURL(r *http.Request, s *gateway.Session, p string, expiresIn int) string {
	if u, ok := l.presignArtifact(r.Context(), s, p, time.Duration(expiresIn)*time.Second); ok {
		return u
	}
	token := signLink(l.Key, s.Tenant, s.ID, p, linkExpiry(expiresIn))
	return l.BaseURL(r) + "/links/" + token
}

// presignArtifact is an object-store link to s's file rel (relative to
// /workspace), or false when there is none: no object store, a session on
// an image (whose relative paths start at the image's working directory),
// or a store that failed (logged; the gateway's own link serves).
func (l Links) presignArtifact(ctx context.Context, s *gateway.Session, rel string, ttl time.Duration) (string, bool) {
	sb := s.Sandbox()
	if l.Artifacts == nil || sb == nil || s.ImageDigest != "" {
		return "", false
	}
	u, err := l.Artifacts.PresignArtifact(ctx, sb, rel, ttl)
	if err != nil {
		if !errors.Is(err, workspace.ErrNoPresign) && l.Log != nil {
			l.Log.Warn("artifact_presign_failed", "session", s.ID, "err", err)
		}
		return "", false
	}
	return u, true
}

// BaseURL is the base of the URLs the gateway hands out: PublicURL
// (serve --public-url), or else the address the request's connection
// reached the gateway at, never the request's Host header, which the
// client chooses.
func (l Links) BaseURL(r *http.Request) string {
	if l.PublicURL != "" {
		return strings.TrimSuffix(l.PublicURL, "/")
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	// An accepted connection's local address is concrete (the interface
	// it came in on), even on a listener of 0.0.0.0.
	if addr, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		return scheme + "://" + addr.String()
	}
	return scheme + "://localhost"
}
