package gateway

import (
	"net/http"
	"strings"
)

// BearerToken is the bearer token r carries: in Proxy-Authorization for
// a CONNECT request that has one there, else in Authorization; "" when it
// carries none. The REST API and the cluster front both read it here.
func BearerToken(r *http.Request) string {
	if r.Method == http.MethodConnect {
		if t := bearer(r.Header.Get("Proxy-Authorization")); t != "" {
			return t
		}
	}
	return bearer(r.Header.Get("Authorization"))
}

// bearer extracts a bearer token from header value h.
func bearer(h string) string {
	const prefix = "bearer "
	if len(h) <= len(prefix) || !strings.EqualFold(h[:len(prefix)], prefix) {
		return ""
	}
	return strings.TrimSpace(h[len(prefix):])
}
