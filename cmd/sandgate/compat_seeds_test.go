package main

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// Issue 39 item 4, session-based-sandbox: --step-timeout 0 or negative
// would end every /compat/sbs step at once (the seed's
// SBS_STEP_TIMEOUT_SEC is at least 1); serve refuses it as a usage error.
func TestStepTimeoutRefusesNonPositive(t *testing.T) {
	for _, v := range []string{"0", "0s", "-5s"} {
		out, errOut, code := runClient(t, cleanEnv(), nil, sandgateBin, "serve", "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0",
			"--sandbox", "workdir", "--api-key", "k", "--step-timeout", v)
		if code != 2 || !strings.Contains(errOut, "--step-timeout must be positive") {
			t.Errorf("--step-timeout %s: exit %d, stdout %q, stderr %q", v, code, out, errOut)
		}
	}
	// Its environment twin is checked the same way.
	env := append(cleanEnv(), "SANDGATE_STEP_TIMEOUT=0s")
	if _, errOut, code := runClient(t, env, nil, sandgateBin, "serve", "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0",
		"--sandbox", "workdir", "--api-key", "k"); code != 2 || !strings.Contains(errOut, "--step-timeout must be positive") {
		t.Errorf("SANDGATE_STEP_TIMEOUT=0s: exit %d, stderr %q", code, errOut)
	}
}

// skRow is Sandkasten's session row.
type skRow struct {
	ID           string    `json:"id"`
	Image        string    `json:"image"`
	Status       string    `json:"status"`
	CreatedAt    time.Time `json:"created_at"`
	ExpiresAt    time.Time `json:"expires_at"`
	LastActivity time.Time `json:"last_activity"`
}

// Issue 39 item 4, Sandkasten: a session the idle timeout ended answers
// as the seed's store keeps it, status expired, and its exec says
// session_expired; not 404.
func TestSandkastenExpiredState(t *testing.T) {
	g := startGateway(t, "--idle-timeout", "2s")
	var s skRow
	if code := g.api(t, http.MethodPost, "/compat/sandkasten/v1/sessions", map[string]any{"ttl_seconds": 600}, &s); code != http.StatusCreated {
		t.Fatalf("create: %d", code)
	}
	deadline := time.Now().Add(60 * time.Second)
	var got skRow
	for {
		got = skRow{}
		code := g.api(t, http.MethodGet, "/compat/sandkasten/v1/sessions/"+s.ID, nil, &got)
		if code != http.StatusOK {
			t.Fatalf("get: %d (want 200 while running and after it expired)", code)
		}
		if got.Status != "running" || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if got.Status != "expired" || got.ID != s.ID || got.Image != s.Image || !got.CreatedAt.Equal(s.CreatedAt) ||
		got.ExpiresAt.IsZero() || got.ExpiresAt.After(s.ExpiresAt) || got.LastActivity.IsZero() {
		t.Fatalf("after the idle timeout: %+v (created %+v)", got, s)
	}
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	if code := g.api(t, http.MethodPost, "/compat/sandkasten/v1/sessions/"+s.ID+"/exec", map[string]any{"cmd": "true"}, &e); code != http.StatusGone ||
		e.Error.Code != "session_expired" || !strings.Contains(e.Error.Message, "idle") {
		t.Errorf("exec in the expired session: %d %+v", code, e)
	}
	var ok map[string]bool
	if code := g.api(t, http.MethodDelete, "/compat/sandkasten/v1/sessions/"+s.ID, nil, &ok); code != http.StatusOK || !ok["ok"] {
		t.Errorf("destroy the expired session: %d %v", code, ok)
	}
}
