package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/gwtest"
)

// A streamed command's answer begins (its headers go) as soon as the
// command runs, not with its first output: a client that bounds its wait
// for the headers (the TypeScript SDK's timeoutMs) must not kill a
// command that is quiet for longer, in a persistent shell too.
func TestStreamedCommandHeadersBeforeOutput(t *testing.T) {
	g := startGateway(t)
	logOnFailure(t, g)
	id := g.createSession(t).SessionID
	client := &http.Client{Transport: &http.Transport{ResponseHeaderTimeout: 2 * time.Second}}
	for _, body := range []string{`{"command": "sleep 5; echo done"}`, `{"command": "sleep 5; echo done", "shell": "quiet"}`} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, g.URL+"/v1/sessions/"+id+"/commands", bytes.NewReader([]byte(body)))
		req.Header.Set("Authorization", "Bearer "+g.Token)
		req.Header.Set("Accept", "application/x-ndjson")
		res, err := client.Do(req)
		if err != nil {
			cancel()
			t.Fatalf("%s: the headers did not come before the first output: %v", body, err)
		}
		var lines []string
		sc := bufio.NewScanner(res.Body)
		for sc.Scan() {
			lines = append(lines, sc.Text())
		}
		res.Body.Close()
		cancel()
		if res.StatusCode != http.StatusOK || !strings.HasPrefix(res.Header.Get("Content-Type"), "application/x-ndjson") ||
			len(lines) != 2 || lines[0] != `{"stdout":"done\n"}` || !strings.Contains(lines[1], `"exitCode":0`) {
			t.Errorf("%s: %d %q %q", body, res.StatusCode, res.Header.Get("Content-Type"), lines)
		}
	}
}

// With --agent-sandbox-delete-on-delete, a push deletes a stored file
// only when the workspace's listing is complete: a file the listing
// missed (cut at its bound, here by 10000 directories listed first) is
// not deleted, and a later complete listing finds it still stored.
func TestAgentSandboxIncompleteListingKeepsObjects(t *testing.T) {
	gwtest.RequireTool(t, "python3")
	s3 := startFakeS3(t)
	g := startGateway(t, append(s3.args(), "--agent-sandbox-delete-on-delete")...)
	logOnFailure(t, g)
	noRaces(t, g)
	key := func(p string) string { return seedKey("default", "carol", "s1", p) }
	agentExecute(t, g, "carol", "s1", "import os\nos.makedirs('z')\nopen('z/keep.txt', 'w').write('keep')")
	if code, body := s3.object(t, key("z/keep.txt")); code != http.StatusOK || body != "keep" {
		t.Fatalf("z/keep.txt's object: %d %q", code, body)
	}
	// a/ lists before z/ (breadth first, by name): its 10000 directories
	// fill the listing, which never reaches z/keep.txt.
	if o := agentExecute(t, g, "carol", "s1", "import os\nfor i in range(10000): os.makedirs('a/%05d' % i)"); o.Error != "" {
		t.Fatalf("mkdirs: %+v", o)
	}
	if code, body := s3.object(t, key("z/keep.txt")); code != http.StatusOK || body != "keep" {
		t.Errorf("z/keep.txt's object after an incomplete listing: %d %q, want kept", code, body)
	}
	// Complete again: the file is still there, and so is its object.
	agentExecute(t, g, "carol", "s1", "import shutil\nshutil.rmtree('a')")
	agentExecute(t, g, "carol", "s1", "open('other.txt', 'w').write('o')")
	if code, body := s3.object(t, key("z/keep.txt")); code != http.StatusOK || body != "keep" {
		t.Errorf("z/keep.txt's object after a complete listing: %d %q, want kept", code, body)
	}
}

// agentSessionID is the id of the live native session of Agent
// Sandbox's sandbox (user, session) of g's tenant.
func agentSessionID(t *testing.T, g *gatewayProc, user, session string) string {
	t.Helper()
	var list struct {
		Sessions []struct {
			SessionID string `json:"sessionId"`
		} `json:"sessions"`
	}
	name := "as-" + seedHash("user:"+user) + "-" + seedHash("sess:"+session)
	if code := g.api(t, http.MethodGet, "/v1/sessions?name="+name, nil, &list); code != http.StatusOK || len(list.Sessions) != 1 {
		t.Fatalf("list %s: %d %+v", name, code, list)
	}
	return list.Sessions[0].SessionID
}

// putWorkspaceFile writes body to the workspace file p of session id
// through the native files API (no sync with the store).
func putWorkspaceFile(t *testing.T, g *gatewayProc, id, p, body string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPut, g.URL+"/v1/sessions/"+id+"/files?path="+p, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+g.Token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode/100 != 2 {
		t.Fatalf("put %s: %d %s", p, res.StatusCode, b)
	}
}

// An execute's inputs never replace newer work with the store's stale
// copy: a file changed since the last sync is kept, one deleted since is
// not brought back (--agent-sandbox-delete-on-delete off: its object
// stays), and one as the last sync left it is pulled.
func TestAgentSandboxPullKeepsNewerFiles(t *testing.T) {
	gwtest.RequireTool(t, "python3")
	s3 := startFakeS3(t)
	g := startGateway(t, s3.args()...)
	logOnFailure(t, g)
	noRaces(t, g)
	key := func(p string) string { return seedKey("default", "dave", "s1", p) }
	agentExecute(t, g, "dave", "s1", "for n in ('new.txt', 'gone.txt', 'same.txt'): open(n, 'w').write('v1')")
	for _, p := range []string{"new.txt", "gone.txt", "same.txt"} {
		if code, body := s3.object(t, key(p)); code != http.StatusOK || body != "v1" {
			t.Fatalf("%s's object: %d %q", p, code, body)
		}
	}
	// new.txt changes in the workspace without a sync; gone.txt is
	// deleted (and pushed: its object stays); same.txt's object changes.
	agentExecute(t, g, "dave", "s1", "import os\nos.remove('gone.txt')")
	if code, _ := s3.object(t, key("gone.txt")); code != http.StatusOK {
		t.Fatalf("gone.txt's object: %d, want kept", code)
	}
	putWorkspaceFile(t, g, agentSessionID(t, g, "dave", "s1"), "new.txt", "v2 local")
	s3.put(t, key("same.txt"), "v2 stored")
	o := agentExecute(t, g, "dave", "s1", "import os\n(open('new.txt').read(), os.path.exists('gone.txt'), open('same.txt').read())",
		"new.txt", "gone.txt", "same.txt")
	if want := "('v2 local', False, 'v2 stored')\n"; o.Output != want {
		t.Errorf("after the pull: %q, want %q", o.Output, want)
	}
	// An input the workspace never had is pulled.
	s3.put(t, key("fresh.txt"), "stored")
	if o := agentExecute(t, g, "dave", "s1", "open('fresh.txt').read()", "fresh.txt"); o.Output != "'stored'\n" {
		t.Errorf("a missing input: %q", o.Output)
	}
}

// waitPrefixEmpty waits (generously) for the test bucket to hold nothing
// under prefix, and reports whether it did.
func waitPrefixEmpty(t *testing.T, s3 *fakeS3, prefix string) bool {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for s3.keys(t, prefix) > 0 {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(200 * time.Millisecond)
	}
	return true
}

// A native stop (POST /v1/sessions/{id}/stop) stops the sandbox's
// processes, not the sandbox: its stored files stay (default flags,
// --agent-sandbox-delete-on-cleanup on), the next call syncs it again,
// and its end deletes them.
func TestAgentSandboxNativeStopKeepsFiles(t *testing.T) {
	gwtest.RequireTool(t, "python3")
	s3 := startFakeS3(t)
	g := startGateway(t, s3.args()...)
	logOnFailure(t, g)
	noRaces(t, g)
	key := func(p string) string { return seedKey("default", "erin", "s1", p) }
	agentExecute(t, g, "erin", "s1", "open('a.txt', 'w').write('a')")
	id := agentSessionID(t, g, "erin", "s1")
	if code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/stop", nil, nil); code/100 != 2 {
		t.Fatalf("stop: %d", code)
	}
	time.Sleep(2 * time.Second) // a cleanup, were there one, runs after the stop
	if code, body := s3.object(t, key("a.txt")); code != http.StatusOK || body != "a" {
		t.Fatalf("a.txt's object after a native stop: %d %q, want kept", code, body)
	}
	// The sandbox (the same session, started again) syncs as before.
	o := agentExecute(t, g, "erin", "s1", "open('b.txt', 'w').write(open('a.txt').read() + 'b')")
	if len(o.Artifacts) != 1 || !strings.HasPrefix(o.Artifacts[0].DownloadURL, s3.URL+"/") || agentSessionID(t, g, "erin", "s1") != id {
		t.Errorf("after the stop: %+v", o)
	}
	if code, body := s3.object(t, key("b.txt")); code != http.StatusOK || body != "ab" {
		t.Errorf("b.txt's object: %d %q", code, body)
	}
	// Its end (a native delete) deletes its stored files.
	if code := g.api(t, http.MethodDelete, "/v1/sessions/"+id, nil, nil); code/100 != 2 {
		t.Fatalf("delete: %d", code)
	}
	if !waitPrefixEmpty(t, s3, strings.TrimSuffix(key(""), "/")) {
		t.Errorf("objects left after the sandbox's delete:\n%s", s3.list(t, key("")))
	}
}

// With the default flags a sandbox that the idle timeout ends has its
// stored files deleted (the end hook works, not only stop's cleanup).
func TestAgentSandboxExpiryDeletesFiles(t *testing.T) {
	gwtest.RequireTool(t, "python3")
	s3 := startFakeS3(t)
	g := startGateway(t, append(s3.args(), "--idle-timeout", "3s")...)
	logOnFailure(t, g)
	noRaces(t, g)
	key := func(p string) string { return seedKey("default", "fred", "s1", p) }
	agentExecute(t, g, "fred", "s1", "open('a.txt', 'w').write('a')")
	if code, _ := s3.object(t, key("a.txt")); code != http.StatusOK {
		t.Fatalf("a.txt's object: %d", code)
	}
	if !waitPrefixEmpty(t, s3, strings.TrimSuffix(key(""), "/")) {
		t.Errorf("objects left after the idle timeout:\n%s", s3.list(t, key("")))
	}
	if ss := agentSessions(t, g, "fred", "s1"); len(ss) != 0 {
		t.Errorf("the sandbox is still live: %+v", ss)
	}
}

// download-url says when its URL is not the store's: a file that could
// not be pushed (the store is down) gets the gateway's own link and a
// sync_error; one pushed gets the store's URL and none.
func TestAgentSandboxDownloadURLSaysSyncError(t *testing.T) {
	gwtest.RequireTool(t, "python3")
	s3 := startFakeS3(t)
	g := startGateway(t, s3.args()...)
	logOnFailure(t, g)
	type dl struct {
		DownloadURL string  `json:"download_url"`
		SyncError   *string `json:"sync_error"`
	}
	get := func() (int, dl) {
		req, _ := http.NewRequest(http.MethodGet, g.URL+"/compat/agent-sandbox/v1/files/download-url?user_id=gina&session_id=s1&path=a.txt", nil)
		req.Header.Set("X-API-Key", g.Token)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var d dl
		if err := json.NewDecoder(res.Body).Decode(&d); err != nil {
			t.Fatal(err)
		}
		return res.StatusCode, d
	}
	agentExecute(t, g, "gina", "s1", "open('a.txt', 'w').write('a')")
	if code, d := get(); code != http.StatusOK || !strings.HasPrefix(d.DownloadURL, s3.URL+"/") || d.SyncError != nil {
		t.Errorf("a stored file: %d %+v", code, d)
	}
	putWorkspaceFile(t, g, agentSessionID(t, g, "gina", "s1"), "a.txt", "changed")
	s3.kill()
	if code, d := get(); code != http.StatusOK || strings.HasPrefix(d.DownloadURL, s3.URL+"/") || d.SyncError == nil || *d.SyncError == "" {
		t.Errorf("a file the store could not take: %d %+v, want the gateway's link and a sync_error", code, d)
	}
}

// stop says when the deletion of the sandbox's stored files failed (the
// store is down): the sandbox is stopped, the answer carries sync_error.
func TestAgentSandboxStopSaysCleanupFailure(t *testing.T) {
	gwtest.RequireTool(t, "python3")
	s3 := startFakeS3(t)
	g := startGateway(t, s3.args()...)
	logOnFailure(t, g)
	agentExecute(t, g, "hank", "s1", "open('a.txt', 'w').write('a')")
	s3.kill()
	var ans struct {
		Status    string  `json:"status"`
		SyncError *string `json:"sync_error"`
	}
	if code := agentPost(t, g, "/v1/sandbox/stop", `{"user_id":"hank","session_id":"s1"}`, &ans); code != http.StatusOK ||
		ans.Status != "success" || ans.SyncError == nil || *ans.SyncError == "" {
		t.Errorf("stop with the store down: %d %+v, want success and a sync_error", code, ans)
	}
	if ss := agentSessions(t, g, "hank", "s1"); len(ss) != 0 {
		t.Errorf("the sandbox is still live: %+v", ss)
	}
}

// A gateway that shuts down (--keep-sandboxes-on-exit=false: its
// sandboxes end) finishes the cleanup of their stored files before it
// exits, rather than leaving it to goroutines the exit kills.
func TestAgentSandboxShutdownFinishesCleanups(t *testing.T) {
	gwtest.RequireTool(t, "python3")
	s3 := startFakeS3(t)
	g := startGateway(t, s3.args()...)
	logOnFailure(t, g)
	for _, u := range []string{"ivy", "jack", "kim"} {
		agentExecute(t, g, u, "s1", "for i in range(20): open('f%d.txt' % i, 'w').write('x')")
	}
	g.stop(t)
	for _, u := range []string{"ivy", "jack", "kim"} {
		if n := s3.keys(t, strings.TrimSuffix(seedKey("default", u, "s1", ""), "/")); n != 0 {
			t.Errorf("%s: %d objects left after the gateway's shutdown", u, n)
		}
	}
	if !strings.Contains(g.stderr.String(), "compat_store_cleaned") {
		t.Errorf("no cleanup logged:\n%s", g.stderr.String())
	}
}

// Sandkasten: a session that failed (its sandbox lost across a restart),
// not yet tombstoned, reads as crashed and its exec and fs answer as the
// seed's for a crashed session, 410 session_crashed, not 409.
func TestSandkastenFailedSessionCrashed(t *testing.T) {
	g := startGateway(t, "--keep-sandboxes-on-exit=true")
	var s skRow
	if code := g.api(t, http.MethodPost, "/compat/sandkasten/v1/sessions", map[string]any{"ttl_seconds": 600}, &s); code != http.StatusCreated {
		t.Fatalf("create: %d", code)
	}
	_ = g.cmd.Process.Signal(syscall.SIGKILL)
	<-g.done
	if err := os.RemoveAll(filepath.Join(g.DataDir, "sessions", s.ID)); err != nil {
		t.Fatal(err)
	}
	g2 := restartWith(t, g, syscall.SIGKILL, "workdir")
	logOnFailure(t, g2)
	var got skRow
	if code := g2.api(t, http.MethodGet, "/compat/sandkasten/v1/sessions/"+s.ID, nil, &got); code != http.StatusOK || got.Status != "crashed" {
		t.Fatalf("get: %d %+v, want crashed", code, got)
	}
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	if code := g2.api(t, http.MethodPost, "/compat/sandkasten/v1/sessions/"+s.ID+"/exec", map[string]any{"cmd": "true"}, &e); code != http.StatusGone ||
		e.Error.Code != "session_crashed" {
		t.Errorf("exec in the failed session: %d %+v, want 410 session_crashed", code, e)
	}
	e.Error.Code = ""
	if code := g2.api(t, http.MethodGet, "/compat/sandkasten/v1/sessions/"+s.ID+"/fs/read?path=x", nil, &e); code != http.StatusGone ||
		e.Error.Code != "session_crashed" {
		t.Errorf("read in the failed session: %d %+v, want 410 session_crashed", code, e)
	}
}

// The store's download URLs are downloads, as the workspace store's
// artifacts' are: Content-Disposition attachment with the file's name,
// and its media type.
func TestAgentSandboxStoreURLIsAttachment(t *testing.T) {
	gwtest.RequireTool(t, "python3")
	s3 := startFakeS3(t)
	g := startGateway(t, s3.args()...)
	logOnFailure(t, g)
	o := agentExecute(t, g, "lena", "s1", "import os\nos.makedirs('out')\nopen('out/report.html', 'w').write('<script>x</script>')")
	if len(o.Artifacts) != 1 || !strings.HasPrefix(o.Artifacts[0].DownloadURL, s3.URL+"/") {
		t.Fatalf("artifacts: %+v", o.Artifacts)
	}
	res, err := http.Get(o.Artifacts[0].DownloadURL)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || string(b) != "<script>x</script>" ||
		res.Header.Get("Content-Disposition") != "attachment; filename=report.html" || res.Header.Get("Content-Type") != "text/html" {
		t.Errorf("download: %d %q %q %q", res.StatusCode, res.Header.Get("Content-Disposition"), res.Header.Get("Content-Type"), b)
	}
}

// --agent-sandbox-image is checked at startup: an image no create could
// get is a usage error (exit 2) naming the flag, not a failure of every
// Agent Sandbox call later.
func TestAgentSandboxImageChecked(t *testing.T) {
	for _, tc := range []struct{ args []string }{
		{[]string{"--sandbox", "workdir", "--agent-sandbox-image", "python:3.12-slim"}},
		{[]string{"--sandbox", "workdir", "--agent-sandbox-image", "Not A Reference!"}},
		{[]string{"--sandbox", "auto", "--agent-sandbox-image", "registry.invalid/none:1", "--image-pull", "never"}},
	} {
		args := append([]string{"serve", "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0", "--api-key", "k"}, tc.args...)
		out, errOut, code := runClient(t, cleanEnv(), nil, sandgateBin, args...)
		if code != 2 || !strings.Contains(errOut, "--agent-sandbox-image") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", tc.args, code, out, errOut)
		}
	}
	// An alias of the default image, or the default itself, is fine.
	g := startGateway(t, "--agent-sandbox-image", "python:3.12-slim", "--image-alias", "python:3.12-slim=default")
	g.stop(t)
}
