package rest_test

import (
	"fmt"
	"net/http"
	"testing"
)

// TestContractFork: /fork as the spec has it, on the workdir driver,
// which cannot fork (cmd/sandgate's TestForkCarriesKernel forks on the
// linux driver, with CRIU).
func TestContractFork(t *testing.T) {
	cov := newCoverage()
	g := newGateway(t, gwOptions{cov: cov})
	s := g.create(t, aliceKey, "")
	fork := "/v1/sessions/" + s.SessionID + "/fork"
	expect(t, g.do(t, http.MethodPost, fork, aliceKey, []byte(`{"count": 2}`)), http.StatusBadRequest, "fork_unsupported")
	expect(t, g.do(t, http.MethodPost, fork, aliceKey, nil), http.StatusBadRequest, "fork_unsupported")
	for _, n := range []int{0, 9} {
		expect(t, g.do(t, http.MethodPost, fork, aliceKey, []byte(fmt.Sprintf(`{"count": %d}`, n))), http.StatusBadRequest, "invalid_count")
	}
	expect(t, g.do(t, http.MethodPost, fork, aliceKey, []byte(`{"count": 1, "other": 1}`)), http.StatusBadRequest, "")
	expect(t, g.do(t, http.MethodPost, "/v1/sessions/sbx-aaaaaaaaaaaaaaaaaaaa/fork", aliceKey, nil), http.StatusNotFound, "not_found")
	// Another tenant's session is not found either.
	expect(t, g.do(t, http.MethodPost, fork, bobKey, nil), http.StatusNotFound, "not_found")
}
