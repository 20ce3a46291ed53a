package gateway_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/sandgate/sandgate/gateway"
)

// TestManagerEnv: a session's own environment (a SandboxClaim's env) is in
// every process it starts, kept in its record, and bounded.
func TestManagerEnv(t *testing.T) {
	m, _ := newManager(t, gateway.Config{})
	s, _ := mustCreate(t, m, alice, gateway.CreateParams{Env: map[string]string{"TASK": "claim-env", "B_2": "two words"}})
	if got := output(t, s, "printenv TASK B_2"); got != "claim-env\ntwo words\n" {
		t.Errorf("env in a process: %q", got)
	}
	if rec := s.Snapshot(); rec.Env["TASK"] != "claim-env" {
		t.Errorf("record's env: %v", rec.Env)
	}
	many := map[string]string{}
	for i := range gateway.MaxEnvVars + 1 {
		many[fmt.Sprintf("V%d", i)] = "x"
	}
	for _, env := range []map[string]string{
		{"1BAD": "x"}, {"A-B": "x"}, {"HTTP_PROXY": "http://elsewhere"}, {"https_proxy": "x"}, {"SSL_CERT_FILE": "/tmp/ca"},
		{"A": "nul\x00"}, many, {"BIG": string(make([]byte, gateway.MaxEnvBytes))},
	} {
		_, _, err := m.Create(context.Background(), alice, gateway.CreateParams{Env: env})
		wantCode(t, err, gateway.KindInvalid, "invalid_env")
	}
}
