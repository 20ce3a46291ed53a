package rest_test

import (
	"net/http"
	"testing"

	"github.com/sandgate/sandgate/gateway"
)

// TestContractPause: /pause and /resume as the spec has them, on the
// workdir driver, which cannot pause (cmd/sandgate's TestPauseAndResume
// pauses on the linux driver).
func TestContractPause(t *testing.T) {
	cov := newCoverage()
	g := newGateway(t, gwOptions{cov: cov})
	s := g.create(t, aliceKey, "")
	expect(t, g.do(t, http.MethodPost, "/v1/sessions/"+s.SessionID+"/pause", aliceKey, nil), http.StatusBadRequest, "pause_unsupported")
	r := g.do(t, http.MethodPost, "/v1/sessions/"+s.SessionID+"/resume", aliceKey, nil)
	expect(t, r, http.StatusOK, "")
	if got := r.session(t); got.Status != gateway.StatusRunning {
		t.Errorf("resume of a running session: %+v", got)
	}
	expect(t, g.do(t, http.MethodPost, "/v1/sessions/sbx-aaaaaaaaaaaaaaaaaaaa/pause", aliceKey, nil), http.StatusNotFound, "not_found")
	expect(t, g.do(t, http.MethodPost, "/v1/sessions/sbx-aaaaaaaaaaaaaaaaaaaa/resume", aliceKey, nil), http.StatusNotFound, "not_found")
	// Another tenant's session is not found either.
	expect(t, g.do(t, http.MethodPost, "/v1/sessions/"+s.SessionID+"/pause", bobKey, nil), http.StatusNotFound, "not_found")
	// A stopped session cannot be paused, nor resumed (its next use starts it).
	expect(t, g.do(t, http.MethodPost, "/v1/sessions/"+s.SessionID+"/stop", aliceKey, nil), http.StatusOK, "")
	expect(t, g.do(t, http.MethodPost, "/v1/sessions/"+s.SessionID+"/resume", aliceKey, nil), http.StatusConflict, "session_stopped")
}
