package rest

import (
	"net/http"
	"net/url"
	"strings"
)

// sshWebSocket serves GET /v1/sessions/{id}/ssh: the SSH byte stream of a
// CONNECT tunnel, carried in a WebSocket's binary messages for front ends
// that do not pass CONNECT. The tunnel server (cfg.Connect) does the rest,
// with the same admission, limits, audit and byte counts as a CONNECT; the
// Origin is checked here, since only the API knows the gateway's own.
func (a *api) sshWebSocket(w http.ResponseWriter, r *http.Request) {
	if !a.sameOrigin(r) {
		WriteError(w, http.StatusForbidden, "origin_not_allowed",
			"WebSocket Origin "+r.Header.Get("Origin")+" is not the gateway's own")
		return
	}
	a.cfg.Connect.ServeHTTP(w, r)
}

// sameOrigin reports whether r's Origin is absent (a client that is no
// browser) or the gateway's own: that of --public-url when it is set, or
// else one whose host is the host the request was sent to. A page on any
// other origin (another site, or a preview origin, preview.go) may not
// open a WebSocket with the credentials its browser holds.
func (a *api) sameOrigin(r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return true
	}
	o, err := url.Parse(origin)
	if err != nil || o.Host == "" || (o.Scheme != "http" && o.Scheme != "https") {
		return false
	}
	if a.cfg.PublicURL != "" {
		pub, err := url.Parse(a.cfg.PublicURL)
		return err == nil && strings.EqualFold(pub.Scheme, o.Scheme) && strings.EqualFold(pub.Host, o.Host)
	}
	return strings.EqualFold(o.Host, r.Host)
}
