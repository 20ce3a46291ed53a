package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/gwtest"
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

// agentSeedExample is seed 001's own example request to /v1/execute,
// verbatim from its README: absolute input paths.
const agentSeedExample = `{
  "user_id": "alice",
  "session_id": "session123",
  "code": "x = 5\nprint(x * 2)\nx",
  "inputs": ["/path/to/input1.py", "/path/to/input2.txt"],
  "presign_expires_in": 300
}`

// agentExec is an execute answer.
type agentExec struct {
	Output    string `json:"output"`
	Error     string `json:"error"`
	SyncError string `json:"sync_error"`
	Artifacts []struct {
		Path        string `json:"path"`
		SizeBytes   int64  `json:"size_bytes"`
		DownloadURL string `json:"download_url"`
	} `json:"artifacts"`
}

// agentPost sends body (JSON text) to an Agent Sandbox route with the
// seed's X-API-Key header, and decodes the answer into out.
func agentPost(t *testing.T, g *gatewayProc, route, body string, out any) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, g.URL+"/compat/agent-sandbox"+route, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-Key", g.Token)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if out != nil && json.Unmarshal(b, out) != nil {
		t.Errorf("%s: not JSON: %d %q", route, res.StatusCode, b)
	}
	return res.StatusCode
}

// agentExecute runs code as user/session with inputs.
func agentExecute(t *testing.T, g *gatewayProc, user, session, code string, inputs ...string) agentExec {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"user_id": user, "session_id": session, "code": code, "inputs": inputs})
	var o agentExec
	if status := agentPost(t, g, "/v1/execute", string(body), &o); status != http.StatusOK {
		t.Fatalf("execute %q: %d %+v", code, status, o)
	}
	return o
}

// Issue 39 item 3: seed 001's own example request, absolute inputs and
// all, answers as the seed's README shows (no object store: the inputs
// name workspace files, none there, skipped). Inputs are mapped into the
// workspace: /work/x (the seed's mount), /workspace/x and x are x.
func TestAgentSandboxSeedExample(t *testing.T) {
	gwtest.RequireTool(t, "python3")
	g := startGateway(t)
	logOnFailure(t, g)
	noRaces(t, g)
	var o agentExec
	if status := agentPost(t, g, "/v1/execute", agentSeedExample, &o); status != http.StatusOK || o.Output != "10\n5\n" || o.Error != "" || len(o.Artifacts) != 0 {
		t.Fatalf("the seed's example: %d %+v, want 200 output %q", status, o, "10\n5\n")
	}
	// docs/compat.md shows it with curl, the body verbatim.
	example := docExample(t, "agent-sandbox-seed")
	if !strings.Contains(example, "-d '"+agentSeedExample+"'") {
		t.Errorf("the documented example does not send the seed's request verbatim:\n%s", example)
	}
	if out := runExample(t, g, example); out != `{"output":"10\n5\n","artifacts":[]}`+"\n" {
		t.Errorf("the documented example printed %q", out)
	}
	for _, in := range []string{"/work/../etc/passwd", "a/../../b", "/workspace/.."} {
		var e struct {
			Detail string `json:"detail"`
		}
		body, _ := json.Marshal(map[string]any{"user_id": "alice", "session_id": "session123", "code": "1", "inputs": []string{in}})
		if status := agentPost(t, g, "/v1/execute", string(body), &e); status != http.StatusBadRequest || !strings.Contains(e.Detail, "..") {
			t.Errorf("input %q: %d %+v, want 400 naming ..", in, status, e)
		}
	}
	// The health check answers as the seed's, to anyone.
	res, err := http.Get(g.URL + "/compat/agent-sandbox/health")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || string(b) != `{"status":"ok"}` || res.Header.Get("Content-Type") != "application/json" {
		t.Errorf("GET /health: %d %q %q", res.StatusCode, res.Header.Get("Content-Type"), b)
	}
}

// noRaces fails t if g, a race-detector build (SANDGATE_BIN built with
// -race), reported a data race.
func noRaces(t *testing.T, g *gatewayProc) {
	t.Cleanup(func() {
		if strings.Contains(g.stderr.String(), "WARNING: DATA RACE") {
			t.Errorf("the gateway reported a data race:\n%s", g.stderr.String())
		}
	})
}

// seedHash is the seed's key of an id: 16 hex digits of its SHA-256.
func seedHash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:16]
}

// agentSessions are the live native sessions of Agent Sandbox's sandbox
// (user, session) of g's tenant, found by their name.
func agentSessions(t *testing.T, g *gatewayProc, user, session string) []struct{ Image string } {
	t.Helper()
	var list struct {
		Sessions []struct{ Image string } `json:"sessions"`
	}
	name := "as-" + seedHash("user:"+user) + "-" + seedHash("sess:"+session)
	if code := g.api(t, http.MethodGet, "/v1/sessions?name="+name, nil, &list); code != http.StatusOK {
		t.Fatalf("list %s: %d", name, code)
	}
	return list.Sessions
}

// seedKey is the object store key of a file of Agent Sandbox's sandbox
// (tenant, user, session), in the seed's layout under the test store's
// prefix "ws" and the default --agent-sandbox-s3-prefix.
func seedKey(tenant, user, session, p string) string {
	return "ws/sandboxes/" + seedHash("tenant:"+tenant) + "/" + seedHash("user:"+user) + "/" + seedHash("sess:"+session) + "/" + p
}

// object is the test bucket's object key: its status and body (gofakes3
// checks no signature).
func (f *fakeS3) object(t *testing.T, key string) (int, string) {
	t.Helper()
	res, err := http.Get(f.URL + "/sandgate-test/" + key)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

func (f *fakeS3) put(t *testing.T, key, body string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPut, f.URL+"/sandgate-test/"+key, strings.NewReader(body))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("put %s: %d", key, res.StatusCode)
	}
}

// Issue 39 items 3 and 4: with --object-store, each Agent Sandbox
// sandbox keeps its files in the store in the seed's layout: the seed's
// example request pulls its (absolute) inputs from there into the
// workspace, an execute pushes what changed (only that), artifacts'
// download URLs are the store's, and stop deletes the stored files
// (--agent-sandbox-delete-on-cleanup, default on). Another tenant's
// identical user and session ids are other keys.
func TestAgentSandboxObjectStore(t *testing.T) {
	gwtest.RequireTool(t, "python3")
	s3 := startFakeS3(t)
	g := startGateway(t, append(s3.args(), "--api-key", "default:test-token", "--api-key", "other:other-token")...)
	logOnFailure(t, g)
	noRaces(t, g)
	key := func(p string) string { return seedKey("default", "alice", "session123", p) }
	s3.put(t, key("path/to/input1.py"), "print('one')\n")
	s3.put(t, key("path/to/input2.txt"), "two\n")

	var o agentExec
	if status := agentPost(t, g, "/v1/execute", agentSeedExample, &o); status != http.StatusOK || o.Output != "10\n5\n" || len(o.Artifacts) != 0 || o.SyncError != "" {
		t.Fatalf("the seed's example: %d %+v", status, o)
	}
	if o := agentExecute(t, g, "alice", "session123", "exec(open('path/to/input1.py').read())\nopen('path/to/input2.txt').read()"); o.Output != "one\n'two\\n'\n" {
		t.Errorf("the pulled inputs: %q", o.Output)
	}
	// A run's new file is pushed, under the seed's key, and its download
	// URL is the store's.
	puts := s3.stats(t).Requests[http.MethodPut]
	o = agentExecute(t, g, "alice", "session123", "open('output.txt', 'w').write('hello, world')")
	if len(o.Artifacts) != 1 || o.Artifacts[0].Path != "output.txt" || !strings.HasPrefix(o.Artifacts[0].DownloadURL, s3.URL+"/sandgate-test/"+key("output.txt")+"?") {
		t.Fatalf("artifacts: %+v (want the store's URL of %s)", o.Artifacts, key("output.txt"))
	}
	if code, body := s3.object(t, key("output.txt")); code != http.StatusOK || body != "hello, world" {
		t.Errorf("stored output.txt: %d %q", code, body)
	}
	res, err := http.Get(o.Artifacts[0].DownloadURL)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || string(b) != "hello, world" {
		t.Errorf("download_url: %d %q", res.StatusCode, b)
	}
	// Incremental: one file changed, one upload; nothing changed, none.
	if n := s3.stats(t).Requests[http.MethodPut] - puts; n != 1 {
		t.Errorf("%d uploads for one new file, want 1", n)
	}
	puts = s3.stats(t).Requests[http.MethodPut]
	agentExecute(t, g, "alice", "session123", "y = 1")
	if n := s3.stats(t).Requests[http.MethodPut] - puts; n != 0 {
		t.Errorf("%d uploads when no file changed, want 0", n)
	}
	// --agent-sandbox-delete-on-delete is off by default: a deleted
	// file's object stays.
	agentExecute(t, g, "alice", "session123", "import os\nos.remove('output.txt')")
	if code, _ := s3.object(t, key("output.txt")); code != http.StatusOK {
		t.Errorf("output.txt's object after the file's delete: %d, want kept", code)
	}
	// Another tenant, the same ids: its own keys.
	other := &gatewayProc{URL: g.URL, Token: "other-token"}
	agentExecute(t, other, "alice", "session123", "open('output.txt', 'w').write('other tenant')")
	if code, body := s3.object(t, seedKey("other", "alice", "session123", "output.txt")); code != http.StatusOK || body != "other tenant" {
		t.Errorf("the other tenant's output.txt: %d %q", code, body)
	}
	// Stop deletes the sandbox's stored files (and only its).
	if status := agentPost(t, g, "/v1/sandbox/stop", `{"user_id":"alice","session_id":"session123"}`, nil); status != http.StatusOK {
		t.Fatalf("stop: %d", status)
	}
	if n := s3.keys(t, strings.TrimSuffix(key(""), "/")); n != 0 {
		t.Errorf("%d objects left under the sandbox's prefix after stop:\n%s", n, s3.list(t, key("")))
	}
	if code, _ := s3.object(t, seedKey("other", "alice", "session123", "output.txt")); code != http.StatusOK {
		t.Errorf("the other tenant's file after alice's stop: %d", code)
	}
}

// Issue 39 item 4: the seed's cleanup switches are flags. With
// --agent-sandbox-delete-on-delete a file deleted in the sandbox is
// deleted from the store at the next sync; with
// --agent-sandbox-delete-on-cleanup=false a sandbox that ends (here by
// the idle timeout) leaves its stored files. And its sandboxes run on
// --agent-sandbox-image.
func TestAgentSandboxCleanupFlagsAndImage(t *testing.T) {
	gwtest.RequireTool(t, "python3")
	s3 := startFakeS3(t)
	g := startGateway(t, append(s3.args(), "--agent-sandbox-delete-on-delete", "--agent-sandbox-delete-on-cleanup=false",
		"--idle-timeout", "3s", "--agent-sandbox-image", "python:3.12-slim", "--image-alias", "python:3.12-slim=default")...)
	logOnFailure(t, g)
	noRaces(t, g)
	key := func(p string) string { return seedKey("default", "bob", "s1", p) }
	agentExecute(t, g, "bob", "s1", "open('a.txt', 'w').write('a')\nopen('b.txt', 'w').write('b')")
	if ss := agentSessions(t, g, "bob", "s1"); len(ss) != 1 || ss[0].Image != "python:3.12-slim" {
		t.Errorf("the sandbox's session: %+v, want one on python:3.12-slim", ss)
	}
	agentExecute(t, g, "bob", "s1", "import os\nos.remove('b.txt')")
	if code, _ := s3.object(t, key("b.txt")); code != http.StatusNotFound {
		t.Errorf("b.txt's object after the file's delete: %d, want deleted", code)
	}
	// The idle timeout ends the sandbox; its files stay in the store.
	deadline := time.Now().Add(60 * time.Second)
	for len(agentSessions(t, g, "bob", "s1")) > 0 && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	if ss := agentSessions(t, g, "bob", "s1"); len(ss) > 0 {
		t.Fatalf("the sandbox did not end at the idle timeout: %+v", ss)
	}
	time.Sleep(time.Second) // a cleanup, were there one, runs after the end
	if code, body := s3.object(t, key("a.txt")); code != http.StatusOK || body != "a" {
		t.Errorf("a.txt's object after the sandbox ended: %d %q, want kept", code, body)
	}
}

// --agent-sandbox-s3-prefix stays out of the workspace store's own
// directories and never climbs: a bad one is a usage error.
func TestAgentSandboxPrefixChecked(t *testing.T) {
	for _, v := range []string{"", "/", "tenants", "objects/x", "a/../b", "a//b"} {
		out, errOut, code := runClient(t, cleanEnv(), nil, sandgateBin, "serve", "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0",
			"--sandbox", "workdir", "--api-key", "k", "--agent-sandbox-s3-prefix", v)
		if code != 2 || !strings.Contains(errOut, "--agent-sandbox-s3-prefix") {
			t.Errorf("--agent-sandbox-s3-prefix %q: exit %d, stdout %q, stderr %q", v, code, out, errOut)
		}
	}
}
