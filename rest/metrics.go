package rest

// Metrics receives the API's counts (internal/metrics implements it);
// Config.Metrics nil counts nothing.
type Metrics interface {
	// RateLimited: a request was refused with 429 by a rate limit:
	// "tenant" (requests per principal), "auth_failures" (failed
	// authentications, and invalid links, per address), "link" (fetches
	// of one file link) or "link_ip" (link fetches per address).
	RateLimited(limit string)
}

func (a *api) rateLimited(limit string) {
	if a.cfg.Metrics != nil {
		a.cfg.Metrics.RateLimited(limit)
	}
}
