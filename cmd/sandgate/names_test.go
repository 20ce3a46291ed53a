package main

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/internal/gwtest"
)

// A session's name goes wherever its id goes: REST paths, CONNECT
// (sandgate proxy NAME, and ssh NAME.sandgate through ssh-config's
// block), the session commands. An id always wins over a name, and
// names are per tenant.
func TestNamesWhereIDsGo(t *testing.T) {
	sshBin := gwtest.RequireTool(t, "ssh")
	g := startGateway(t, "--api-key", "test-token", "--api-key", "other:other-token")

	var dev, other sessionJSON
	if code := g.api(t, http.MethodPost, "/v1/sessions", map[string]any{"name": "dev"}, &dev); code != http.StatusCreated {
		t.Fatalf("create dev: %d", code)
	}
	// A session whose name is dev's id: the id still finds dev.
	if code := g.api(t, http.MethodPost, "/v1/sessions", map[string]any{"name": dev.SessionID}, &other); code != http.StatusCreated {
		t.Fatalf("create the impostor: %d", code)
	}

	var got struct {
		SessionID string `json:"sessionId"`
		Name      string `json:"name"`
	}
	if code := g.api(t, http.MethodGet, "/v1/sessions/dev", nil, &got); code != http.StatusOK || got.SessionID != dev.SessionID {
		t.Fatalf("GET by name: %d %+v", code, got)
	}
	if code := g.api(t, http.MethodGet, "/v1/sessions/"+dev.SessionID, nil, &got); code != http.StatusOK || got.SessionID != dev.SessionID {
		t.Fatalf("GET by id, with a session named like it: %d %+v", code, got)
	}
	// The data plane by name.
	var res struct {
		Stdout   string `json:"stdout"`
		ExitCode int    `json:"exitCode"`
	}
	if code := g.api(t, http.MethodPost, "/v1/sessions/dev/commands", map[string]any{"command": "echo by-name"}, &res); code != http.StatusOK || res.Stdout != "by-name\n" {
		t.Fatalf("command by name: %d %+v", code, res)
	}
	// Another tenant's name is no name of yours.
	if code := gwtest.DoJSON(t, g.URL, "other-token", http.MethodGet, "/v1/sessions/dev", nil, nil); code != http.StatusNotFound {
		t.Errorf("another tenant's name: %d, want 404", code)
	}

	// sandgate proxy NAME and NAME.sandgate, with OpenSSH through the
	// ssh-config block.
	home := t.TempDir()
	env := append(g.clientEnv(), "HOME="+home)
	if _, errOut, code := runClient(t, env, nil, sandgateBin, "ssh-config"); code != 0 {
		t.Fatalf("ssh-config: %d %s", code, errOut)
	}
	cfg := filepath.Join(home, ".ssh", "config")
	for _, host := range []string{"dev.sandgate", dev.SessionID} {
		out, errOut, code := runClient(t, env, nil, sshBin, "-F", cfg, "-o", "BatchMode=yes", "-o", "IdentityFile=/dev/null", host, "echo on-ssh")
		if code != 0 || !strings.HasPrefix(out, "on-") {
			t.Errorf("ssh %s: %d %q %s", host, code, out, errOut)
		}
	}
	// A name the tenant does not have: the proxy says so.
	if _, errOut, code := runClient(t, env, strings.NewReader(""), sandgateBin, "proxy", "nosuch.sandgate"); code != 1 || !strings.Contains(errOut, `"nosuch"`) {
		t.Errorf("proxy to an unknown name: %d %q", code, errOut)
	}

	// The CLI by name; rm by name frees it.
	if out := g.mustCLI(t, "session", "exec", "dev", "--", "echo", "cli"); out != "cli\n" {
		t.Errorf("session exec by name: %q", out)
	}
	if out := g.mustCLI(t, "session", "rm", "dev"); strings.TrimSpace(out) != "dev" {
		t.Errorf("session rm by name: %q", out)
	}
	if code := g.api(t, http.MethodGet, "/v1/sessions/"+dev.SessionID, nil, nil); code != http.StatusGone {
		t.Errorf("dev after rm by name: %d, want 410", code)
	}
	if code := g.api(t, http.MethodGet, "/v1/sessions/dev", nil, nil); code != http.StatusNotFound {
		t.Errorf("the freed name: %d, want 404", code)
	}
	// The audit trail names dev by its id, also for calls that named it
	// (GET, the command, the delete).
	var page struct {
		Events []struct {
			Route   string `json:"route"`
			Method  string `json:"method"`
			Session string `json:"session"`
			Status  int    `json:"status"`
		} `json:"events"`
	}
	if code := g.api(t, http.MethodGet, "/v1/audit?limit=1000", nil, &page); code != http.StatusOK {
		t.Fatalf("audit: %d", code)
	}
	byID := map[string]bool{}
	for _, e := range page.Events {
		if e.Session == "dev" && e.Status != http.StatusNotFound { // the freed name names nothing
			t.Errorf("audit event filed under the name: %+v", e)
		}
		if e.Session == dev.SessionID {
			byID[e.Method+" "+e.Route] = true
		}
	}
	for _, want := range []string{"GET /v1/sessions/{id}", "POST /v1/sessions/{id}/commands", "DELETE /v1/sessions/{id}"} {
		if !byID[want] {
			t.Errorf("no audit event %s for %s: %v", want, dev.SessionID, byID)
		}
	}
	// The impostor is still there, by its own id.
	if code := g.api(t, http.MethodGet, "/v1/sessions/"+other.SessionID, nil, &got); code != http.StatusOK || got.Name != dev.SessionID {
		t.Errorf("the other session: %d %+v", code, got)
	}
}
