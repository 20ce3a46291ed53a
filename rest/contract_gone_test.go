package rest_test

import (
	"net/http"
	"testing"
)

// goneCall is one request of a session route, path relative to the
// session's /v1/sessions/{id}.
type goneCall struct {
	method, sub string
	body        []byte
	hdr         []string
}

// expectGone deletes a fresh session of g and checks that every call
// answers 410 session_gone (the session's tombstone), and that the same
// calls by another tenant answer 404 not_found.
func expectGone(t *testing.T, g *testGateway, calls ...goneCall) {
	t.Helper()
	s := g.create(t, aliceKey, "")
	base := "/v1/sessions/" + s.SessionID
	expect(t, g.do(t, http.MethodDelete, base, aliceKey, nil), http.StatusNoContent, "")
	for _, c := range calls {
		expect(t, g.do(t, c.method, base+c.sub, aliceKey, c.body, c.hdr...), http.StatusGone, "session_gone")
	}
}
