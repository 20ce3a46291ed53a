package rest

import "github.com/go-chi/chi/v5"

// Placeholder mounts: the compat work replaces this file (one file per
// seed's API: compat_sbs.go, compat_sandkasten.go, compat_agentsandbox.go).

// mountCompat mounts the seeds' own APIs under /compat/<seed>, each behind
// the same authentication and rate limit as /v1.
func (a *api) mountCompat(r chi.Router) {}
