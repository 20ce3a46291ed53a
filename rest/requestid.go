package rest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"

	"github.com/sandgate/sandgate/audit"
)

// RequestIDHeader carries a request's id: the client's, when it sent a
// valid one, else one the gateway makes. Every answer has it, and the
// gateway's log lines about the request name it.
const RequestIDHeader = "X-Request-Id"

// RequestID is the id of the request ctx belongs to ("" outside one).
func RequestID(ctx context.Context) string {
	return audit.RequestFrom(ctx).ID
}

// requestID gives every request an id (see RequestIDHeader) before
// anything else runs, so that errors, panics and tunnels carry it too:
// it is in the context as an audit.Request, which audit events and log
// lines (through audit.LogHandler) of the request take it from.
func requestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(RequestIDHeader)
		if !validRequestID(id) {
			id = newRequestID()
		}
		w.Header().Set(RequestIDHeader, id)
		next.ServeHTTP(w, r.WithContext(audit.WithRequest(r.Context(), audit.Request{ID: id})))
	})
}

// validRequestID accepts 1 to 128 characters of [A-Za-z0-9._:-]: enough
// for UUIDs and trace ids, nothing that could break a log line or header.
func validRequestID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-') {
			return false
		}
	}
	return true
}

func newRequestID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
