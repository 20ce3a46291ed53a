package gateway_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
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
		{"A": "nul\x00"}, {"SSH_AUTH_SOCK": "/tmp/agent"}, many, {"BIG": string(make([]byte, gateway.MaxEnvBytes))},
	} {
		_, _, err := m.Create(context.Background(), alice, gateway.CreateParams{Env: env})
		wantCode(t, err, gateway.KindInvalid, "invalid_env")
	}
	// A variable named as one of the session's secrets is the secret's.
	path := filepath.Join(t.TempDir(), "secrets")
	if err := os.WriteFile(path, []byte("GH_TOKEN=s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sec, err := gateway.OpenSecrets(path)
	if err != nil {
		t.Fatal(err)
	}
	m2, _ := newManager(t, gateway.Config{Secrets: sec})
	_, _, err = m2.Create(context.Background(), alice, gateway.CreateParams{
		Env: map[string]string{"GH_TOKEN": "shadow"}, Secrets: []gateway.SecretRef{{Name: "GH_TOKEN"}},
	})
	wantCode(t, err, gateway.KindInvalid, "invalid_env")
}
