package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/gwtest"
	"github.com/sandgate/sandgate/internal/readyfile"
)

// fakeS3 is an S3-compatible server (internal/s3test/fakes3: gofakes3
// over a bbolt file) in a process of its own, so a test can kill it and
// start it again on the same address with the same objects.
type fakeS3 struct {
	bin, db, addr, URL string
	cmd                *exec.Cmd
	done               chan struct{}
	exit               error // the process's end, once done is closed
	killed             bool  // by kill, not on its own
}

func startFakeS3(t *testing.T) *fakeS3 {
	t.Helper()
	dir := t.TempDir()
	f := &fakeS3{bin: filepath.Join(dir, "fakes3"), db: filepath.Join(dir, "s3.db"), addr: "127.0.0.1:0"}
	build := exec.Command("go", "build", "-o", f.bin, "../../internal/s3test/fakes3")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build fakes3: %v\n%s", err, out)
	}
	f.start(t)
	f.addr = strings.TrimPrefix(f.URL, "http://")
	t.Cleanup(func() {
		f.kill()
		if f.exit != nil && !f.killed {
			t.Errorf("fakes3 ended on its own during the test: %v (its stderr is in the test's output)", f.exit)
		}
	})
	// Credentials are checked by nobody here, but signed by the gateway.
	t.Setenv("AWS_ACCESS_KEY_ID", "test-key")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test-secret")
	return f
}

func (f *fakeS3) start(t *testing.T) {
	t.Helper()
	ready := filepath.Join(t.TempDir(), "ready")
	f.cmd = exec.Command(f.bin, "-listen", f.addr, "-db", f.db, "-ready-file", ready)
	f.cmd.Stderr = os.Stderr
	if err := f.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f.done, f.killed = make(chan struct{}), false
	go func(cmd *exec.Cmd, done chan struct{}) { f.exit = cmd.Wait(); close(done) }(f.cmd, f.done)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	url, err := readyfile.Wait(ctx, ready, f.done)
	if err != nil {
		t.Fatalf("fakes3 did not start: %v", err)
	}
	f.URL = url
}

func (f *fakeS3) kill() {
	select {
	case <-f.done:
	default:
		f.killed = true
		_ = f.cmd.Process.Signal(syscall.SIGKILL)
		<-f.done
	}
}

type s3Stats struct {
	Requests map[string]int `json:"requests"`
	PutBytes int64          `json:"putBytes"`
}

func (f *fakeS3) stats(t *testing.T) s3Stats {
	t.Helper()
	resp, err := http.Get(f.URL + "/_stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st s3Stats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

// list is the test bucket's listing of prefix, as XML (gofakes3 checks
// no signature: a plain ListObjectsV2).
func (f *fakeS3) list(t *testing.T, prefix string) string {
	t.Helper()
	resp, err := http.Get(f.URL + "/sandgate-test?list-type=2&max-keys=1000&prefix=" + prefix)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("list %s: %d %s", prefix, resp.StatusCode, b)
	}
	return string(b)
}

// keys counts the objects under prefix in the test bucket.
func (f *fakeS3) keys(t *testing.T, prefix string) int {
	t.Helper()
	return strings.Count(f.list(t, prefix), "<Key>")
}

func (f *fakeS3) args() []string {
	return []string{"--object-store", "s3://sandgate-test/ws", "--object-store-endpoint", f.URL}
}

// wsRun runs command in session id as tok and returns its stdout; a
// non-zero exit fails the test.
func wsRun(t *testing.T, g *gatewayProc, tok, id, command string) string {
	t.Helper()
	var out struct {
		ExitCode *int   `json:"exitCode"`
		Stdout   string `json:"stdout"`
		Stderr   string `json:"stderr"`
	}
	code := gwtest.DoJSON(t, g.URL, tok, http.MethodPost, "/v1/sessions/"+id+"/commands", map[string]any{"command": command, "timeout": 120}, &out)
	if code != http.StatusOK || out.ExitCode == nil || *out.ExitCode != 0 {
		t.Fatalf("command %q: %d %v %s", command, code, out.ExitCode, out.Stderr)
	}
	return out.Stdout
}

type wsInfo struct {
	Name      string `json:"name"`
	SizeBytes int64  `json:"sizeBytes"`
	Files     int    `json:"files"`
	InUseBy   string `json:"inUseBy"`
	Sync      *struct {
		LastSyncedAt *time.Time `json:"lastSyncedAt"`
		PendingBytes int64      `json:"pendingBytes"`
		LastError    string     `json:"lastError"`
	} `json:"sync"`
}

func listWorkspaces(t *testing.T, g *gatewayProc, tok string) map[string]wsInfo {
	t.Helper()
	var out struct{ Workspaces []wsInfo }
	if code := gwtest.DoJSON(t, g.URL, tok, http.MethodGet, "/v1/workspaces", nil, &out); code != http.StatusOK {
		t.Fatalf("list workspaces: %d\n%s", code, g.stderr.String())
	}
	m := map[string]wsInfo{}
	for _, w := range out.Workspaces {
		m[w.Name] = w
	}
	return m
}

// waitSynced waits until workspace name shows nothing left to upload.
func waitSynced(t *testing.T, g *gatewayProc, tok, name string) wsInfo {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		w := listWorkspaces(t, g, tok)[name]
		if w.Sync != nil && w.Sync.LastSyncedAt != nil && w.Sync.PendingBytes == 0 && w.Sync.LastError == "" && w.InUseBy == "" {
			return w
		}
		if time.Now().After(deadline) {
			t.Fatalf("workspace %s not synced: %+v\n%s", name, w, g.stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func createWith(t *testing.T, g *gatewayProc, tok string, body map[string]any) (string, int, string) {
	t.Helper()
	var out struct {
		SessionID string `json:"sessionId"`
		Error     struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	code := gwtest.DoJSON(t, g.URL, tok, http.MethodPost, "/v1/sessions", body, &out)
	return out.SessionID, code, out.Error.Code
}

func deleteSession(t *testing.T, g *gatewayProc, tok, id, query string) {
	t.Helper()
	if code := gwtest.DoJSON(t, g.URL, tok, http.MethodDelete, "/v1/sessions/"+id+query, nil, nil); code != http.StatusNoContent {
		t.Fatalf("delete %s: %d", id, code)
	}
}

// TestWorkspaceSurvivesSessionAndDisk: a named workspace keeps its files
// when its session is deleted; one live session holds it at a time; it
// is private to its tenant; and after a restart with the data dir wiped
// it comes back from the object store.
func TestWorkspaceSurvivesSessionAndDisk(t *testing.T) {
	s3 := startFakeS3(t)
	keys := []string{"--api-key", "alice:tok-a", "--api-key", "bob:tok-b"}
	g := startGateway(t, append(append(keys, s3.args()...), "--workspace-sync-interval", "1h")...)
	logOnFailure(t, g)
	var w wsInfo
	if code := gwtest.DoJSON(t, g.URL, "tok-a", http.MethodPost, "/v1/workspaces", map[string]any{"name": "proj"}, &w); code != http.StatusCreated || w.Name != "proj" {
		t.Fatalf("create workspace: %d %+v", code, w)
	}
	if code := gwtest.DoJSON(t, g.URL, "tok-a", http.MethodPost, "/v1/workspaces", map[string]any{"name": "proj"}, nil); code != http.StatusConflict {
		t.Errorf("second create: %d, want 409", code)
	}
	id, code, _ := createWith(t, g, "tok-a", map[string]any{"workspace": "proj"})
	if code != http.StatusCreated {
		t.Fatalf("create session: %d", code)
	}
	wsRun(t, g, "tok-a", id, "mkdir -p src && echo kept > src/a.txt && ln -s src/a.txt link && head -c 100000 /dev/urandom > big.bin && sha256sum big.bin > big.sum")
	if _, code, ecode := createWith(t, g, "tok-a", map[string]any{"workspace": "proj"}); code != http.StatusConflict || ecode != "workspace_busy" {
		t.Errorf("second holder: %d %s, want 409 workspace_busy", code, ecode)
	}
	// Tenant isolation: bob sees no "proj" and cannot mount or delete it.
	if _, code, ecode := createWith(t, g, "tok-b", map[string]any{"workspace": "proj"}); code != http.StatusNotFound || ecode != "workspace_not_found" {
		t.Errorf("other tenant mounts: %d %s, want 404 workspace_not_found", code, ecode)
	}
	if l := listWorkspaces(t, g, "tok-b"); len(l) != 0 {
		t.Errorf("other tenant lists %v", l)
	}
	if code := gwtest.DoJSON(t, g.URL, "tok-b", http.MethodDelete, "/v1/workspaces/proj", nil, nil); code != http.StatusNotFound {
		t.Errorf("other tenant deletes: %d, want 404", code)
	}
	if code := gwtest.DoJSON(t, g.URL, "tok-a", http.MethodDelete, "/v1/workspaces/proj", nil, nil); code != http.StatusConflict {
		t.Errorf("delete of a held workspace: %d, want 409", code)
	}
	deleteSession(t, g, "tok-a", id, "")
	waitSynced(t, g, "tok-a", "proj")
	if n := s3.keys(t, "ws/objects/"); n != 4 { // three files and one manifest page
		t.Errorf("objects in the store after the sync: %d, want 4", n)
	}

	id2, code, _ := createWith(t, g, "tok-a", map[string]any{"workspace": "proj"})
	if code != http.StatusCreated {
		t.Fatalf("create again: %d", code)
	}
	if out := wsRun(t, g, "tok-a", id2, "cat link && sha256sum -c big.sum"); out != "kept\nbig.bin: OK\n" {
		t.Errorf("after session delete: %q", out)
	}
	deleteSession(t, g, "tok-a", id2, "")
	waitSynced(t, g, "tok-a", "proj")
	g.stop(t)

	// A new gateway on an empty data dir: the object store has it all.
	g2 := startGateway(t, append(keys, s3.args()...)...)
	if l := listWorkspaces(t, g2, "tok-a"); l["proj"].Files != 3 {
		t.Fatalf("workspaces after the disk was lost: %+v", l)
	}
	id3, code, _ := createWith(t, g2, "tok-a", map[string]any{"workspace": "proj"})
	if code != http.StatusCreated {
		t.Fatalf("create on the new gateway: %d", code)
	}
	if out := wsRun(t, g2, "tok-a", id3, "cat src/a.txt && sha256sum -c big.sum"); out != "kept\nbig.bin: OK\n" {
		t.Errorf("from the object store: %q", out)
	}
	// keepWorkspace=false removes it, here and in the object store.
	deleteSession(t, g2, "tok-a", id3, "?keepWorkspace=false")
	if l := listWorkspaces(t, g2, "tok-a"); len(l) != 0 {
		t.Errorf("workspaces after keepWorkspace=false: %+v", l)
	}
	if _, code, _ := createWith(t, g2, "tok-a", map[string]any{"workspace": "proj"}); code != http.StatusNotFound {
		t.Errorf("mount of a removed workspace: %d, want 404", code)
	}
	// Its files and manifest pages go too, from the store and the disk.
	deadline := time.Now().Add(60 * time.Second)
	for s3.keys(t, "ws/objects/")+s3.keys(t, "ws/tenants/") > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the object store still holds %d objects, %d docs", s3.keys(t, "ws/objects/"), s3.keys(t, "ws/tenants/"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if objs, _ := filepath.Glob(filepath.Join(g2.DataDir, "workspaces", "store", "objects", "*", "*")); len(objs) != 0 {
		t.Errorf("objects left in the data dir: %d", len(objs))
	}
}

// TestWorkspaceIncrementalSync: after a 1 KB edit, a sync uploads one
// object and the manifest, counted at the server.
func TestWorkspaceIncrementalSync(t *testing.T) {
	s3 := startFakeS3(t)
	g := startGateway(t, s3.args()...)
	if code := g.api(t, http.MethodPost, "/v1/workspaces", map[string]any{"name": "inc"}, nil); code != http.StatusCreated {
		t.Fatalf("create workspace: %d", code)
	}
	id, code, _ := createWith(t, g, g.Token, map[string]any{"workspace": "inc"})
	if code != http.StatusCreated {
		t.Fatal(code)
	}
	wsRun(t, g, g.Token, id, "for i in $(seq 1 1000); do head -c 2000 /dev/urandom > f$i; done")
	deleteSession(t, g, g.Token, id, "")
	waitSynced(t, g, g.Token, "inc")
	before := s3.stats(t)

	id, _, _ = createWith(t, g, g.Token, map[string]any{"workspace": "inc"})
	wsRun(t, g, g.Token, id, "head -c 1024 /dev/urandom > f7")
	deleteSession(t, g, g.Token, id, "")
	waitSynced(t, g, g.Token, "inc")
	after := s3.stats(t)
	puts, bytes := after.Requests["PUT"]-before.Requests["PUT"], after.PutBytes-before.PutBytes
	t.Logf("incremental sync after a 1 KB edit: %d PUTs, %d bytes", puts, bytes)
	// The edited file's object, the one manifest page that lists it (the
	// 1000 paths make several pages), then the doc listing the pages.
	if puts != 3 || bytes > 40000 {
		t.Errorf("after a 1 KB edit: %d PUTs, %d bytes; want 3, and not the whole manifest (~110 KB)", puts, bytes)
	}
}

// TestWorkspaceObjectStoreDown: with the object store killed mid-sync,
// commands keep working, the session shows the error and what is
// pending; once it is back the sync completes.
func TestWorkspaceObjectStoreDown(t *testing.T) {
	s3 := startFakeS3(t)
	g := startGateway(t, append(s3.args(), "--workspace-sync-interval", "300ms", "--log-level", "debug")...)
	logOnFailure(t, g)
	if code := g.api(t, http.MethodPost, "/v1/workspaces", map[string]any{"name": "down"}, nil); code != http.StatusCreated {
		t.Fatalf("create workspace: %d", code)
	}
	id, code, _ := createWith(t, g, g.Token, map[string]any{"workspace": "down"})
	if code != http.StatusCreated {
		t.Fatal(code)
	}
	wsRun(t, g, g.Token, id, "head -c 30000000 /dev/urandom > big.bin")
	s3.kill()
	wsRun(t, g, g.Token, id, "echo more > more.txt")
	type syncView struct {
		WorkspaceSync *struct {
			LastSyncedAt *time.Time `json:"lastSyncedAt"`
			PendingBytes int64      `json:"pendingBytes"`
			LastError    string     `json:"lastError"`
		} `json:"workspaceSync"`
	}
	var s syncView
	deadline := time.Now().Add(60 * time.Second)
	for {
		s = syncView{}
		g.api(t, http.MethodGet, "/v1/sessions/"+id, nil, &s)
		if s.WorkspaceSync != nil && s.WorkspaceSync.LastError != "" && s.WorkspaceSync.PendingBytes > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no sync error shown with the store down: %+v", s.WorkspaceSync)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("while down: %+v", *s.WorkspaceSync)
	if out := wsRun(t, g, g.Token, id, "cat more.txt"); out != "more\n" {
		t.Errorf("command while the store is down: %q", out)
	}
	s3.start(t)
	deadline = time.Now().Add(90 * time.Second)
	for {
		s = syncView{}
		g.api(t, http.MethodGet, "/v1/sessions/"+id, nil, &s)
		if w := s.WorkspaceSync; w != nil && w.LastError == "" && w.PendingBytes == 0 && w.LastSyncedAt != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sync did not complete once the store was back: %+v", s.WorkspaceSync)
		}
		time.Sleep(100 * time.Millisecond)
	}
	deleteSession(t, g, g.Token, id, "")
	waitSynced(t, g, g.Token, "down")
	g.stop(t)
	// What the store holds is whole: a gateway with a new disk reads it.
	g2 := startGateway(t, s3.args()...)
	id, _, _ = createWith(t, g2, g2.Token, map[string]any{"workspace": "down"})
	if out := wsRun(t, g2, g2.Token, id, "cat more.txt; stat -c %s big.bin"); out != "more\n30000000\n" {
		t.Errorf("after the outage: %q", out)
	}
}

// checkerPy verifies files written by writerPy: each ends with the
// SHA-256 of what comes before it.
const checkerPy = `
import hashlib, os, sys
bad = 0
n = 0
for name in sorted(os.listdir('data')):
    b = open('data/' + name, 'rb').read()
    n += 1
    if len(b) < 32 or hashlib.sha256(b[:-32]).digest() != b[-32:]:
        bad += 1
print(n, bad)
`

// writerPy rewrites, in place, one file after another, each with one
// pwrite of its whole content and checksum trailer: a snapshot that is not
// point-in-time may catch a file half-written.
const writerPy = `
import hashlib, os
os.makedirs('data', exist_ok=True)
size = 256 * 1024
def content():
    b = os.urandom(size - 32)
    return b + hashlib.sha256(b).digest()
for i in range(40):
    with open('data/f%02d' % i, 'wb') as f:
        f.write(content())
open('ready', 'w').close()
i = 0
while True:
    fd = os.open('data/f%02d' % (i % 40), os.O_WRONLY)
    os.pwrite(fd, content(), 0)
    os.close(fd)
    i += 1
`

// TestSnapshotConsistentAndFork: snapshots taken while a process
// rewrites files never hold a half-written one, and three sessions forked
// from one snapshot start equal and diverge.
func TestSnapshotConsistentAndFork(t *testing.T) {
	requireLinuxDriver(t)
	gwtest.RequireTool(t, "python3")
	g := startGateway(t, "--sandbox", "linux", "--api-key", "alice:test-token", "--api-key", "bob:tok-b")
	id := g.createSession(t).SessionID
	wsRun(t, g, g.Token, id, fmt.Sprintf("cat > /tmp/w.py <<'EOF'\n%s\nEOF\n(nohup python3 /tmp/w.py >/dev/null 2>&1 &)\nwhile [ ! -e ready ]; do sleep 0.05; done", writerPy))
	var snaps []string
	for range 3 {
		var sn struct {
			SnapshotID   string  `json:"snapshotId"`
			SizeBytes    int64   `json:"sizeBytes"`
			Consistent   bool    `json:"consistent"`
			FrozenMillis float64 `json:"frozenMillis"`
		}
		if code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/snapshots", nil, &sn); code != http.StatusCreated || !sn.Consistent || sn.SizeBytes < 40*256*1024 {
			t.Fatalf("snapshot: %d %+v", code, sn)
		}
		t.Logf("snapshot %s: %d bytes, frozen %.2f ms", sn.SnapshotID, sn.SizeBytes, sn.FrozenMillis)
		snaps = append(snaps, sn.SnapshotID)
	}
	checker := fmt.Sprintf("cat > /tmp/c.py <<'EOF'\n%s\nEOF\npython3 /tmp/c.py", checkerPy)
	for _, sn := range snaps[:2] {
		fid, code, _ := createWith(t, g, g.Token, map[string]any{"fromSnapshot": sn})
		if code != http.StatusCreated {
			t.Fatalf("create from %s: %d", sn, code)
		}
		if out := wsRun(t, g, g.Token, fid, checker); out != "40 0\n" {
			t.Errorf("snapshot %s: files, half-written = %q", sn, out)
		}
		deleteSession(t, g, g.Token, fid, "")
	}
	// Fork: three sessions from the last snapshot, each its own copy.
	var forks []string
	for i := range 3 {
		fid, code, _ := createWith(t, g, g.Token, map[string]any{"fromSnapshot": snaps[2]})
		if code != http.StatusCreated {
			t.Fatalf("fork %d: %d", i, code)
		}
		forks = append(forks, fid)
		wsRun(t, g, g.Token, fid, fmt.Sprintf("echo %d > mine && rm data/f0%d", i, i))
	}
	for i, fid := range forks {
		out := wsRun(t, g, g.Token, fid, "cat mine; ls data | wc -l; ls data | grep -c -x -E 'f0[012]'; "+checker)
		wantOut := fmt.Sprintf("%d\n39\n2\n39 0\n", i)
		if out != wantOut {
			t.Errorf("fork %d: %q, want %q", i, out, wantOut)
		}
	}
	for _, fid := range forks {
		deleteSession(t, g, g.Token, fid, "")
	}
	// A snapshot is its tenant's own.
	if _, code, ecode := createWith(t, g, "tok-b", map[string]any{"fromSnapshot": snaps[0]}); code != http.StatusNotFound || ecode != "snapshot_not_found" {
		t.Errorf("other tenant forks: %d %s, want 404 snapshot_not_found", code, ecode)
	}
}

// logOnFailure shows g's log when the test fails.
func logOnFailure(t *testing.T, g *gatewayProc) {
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(g.stderr.String())
		}
	})
}

// TestArtifactsPresignedFromObjectStore: with an object store, Agent
// Sandbox's download_url is a presigned URL of the store, which serves
// the file's content with no other credential.
func TestArtifactsPresignedFromObjectStore(t *testing.T) {
	gwtest.RequireTool(t, "python3")
	s3 := startFakeS3(t)
	g := startGateway(t, s3.args()...)
	logOnFailure(t, g)
	var o struct {
		Output    string `json:"output"`
		Artifacts []struct {
			Path        string `json:"path"`
			DownloadURL string `json:"download_url"`
		} `json:"artifacts"`
	}
	if code := g.api(t, http.MethodPost, "/compat/agent-sandbox/v1/execute",
		map[string]any{"user_id": "u", "session_id": "s", "code": "open('out.txt', 'w').write('artifact body')"}, &o); code != http.StatusOK {
		t.Fatalf("execute: %d", code)
	}
	if len(o.Artifacts) != 1 || !strings.HasPrefix(o.Artifacts[0].DownloadURL, s3.URL+"/") {
		t.Fatalf("artifacts: %+v (object store at %s)", o.Artifacts, s3.URL)
	}
	resp, err := http.Get(o.Artifacts[0].DownloadURL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || string(body) != "artifact body" {
		t.Errorf("download: %d %q", resp.StatusCode, body)
	}
}

// sessionSync is the session's workspaceSync.
func sessionSync(t *testing.T, g *gatewayProc, tok, id string) (lastSyncedAt *time.Time, pending int64, lastError string) {
	t.Helper()
	var out struct {
		WorkspaceSync *struct {
			LastSyncedAt *time.Time `json:"lastSyncedAt"`
			PendingBytes int64      `json:"pendingBytes"`
			LastError    string     `json:"lastError"`
		} `json:"workspaceSync"`
	}
	if code := gwtest.DoJSON(t, g.URL, tok, http.MethodGet, "/v1/sessions/"+id, nil, &out); code != http.StatusOK || out.WorkspaceSync == nil {
		t.Fatalf("get session: %d %+v", code, out)
	}
	return out.WorkspaceSync.LastSyncedAt, out.WorkspaceSync.PendingBytes, out.WorkspaceSync.LastError
}

// waitSessionSynced waits for a complete sync of session id's workspace
// that ended after since, and says whether there was one (with the last
// lastError seen).
func waitSessionSynced(t *testing.T, g *gatewayProc, tok, id string, since time.Time) (bool, string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		at, pending, lastErr := sessionSync(t, g, tok, id)
		if at != nil && at.After(since) && pending == 0 && lastErr == "" {
			return true, ""
		}
		if time.Now().After(deadline) {
			return false, lastErr
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestWorkspaceHardLinksAndSparseFiles is issue 35's first finding, as
// reported: a 100 MB file in a 256 MiB workspace, synced; then two hard
// links of it, a new keep.txt and a 1 TiB sparse file. Counted by
// apparent size (300 MB, then more than a TiB) every sync failed
// silently, DELETE answered 204, and the next session read the old
// keep.txt. Now the syncs succeed, and the next session gets keep.txt v2,
// the links as links and the sparse file sparse.
func TestWorkspaceHardLinksAndSparseFiles(t *testing.T) {
	requireLinuxDriver(t)
	s3 := startFakeS3(t)
	g := startGateway(t, append(s3.args(), "--sandbox", "linux", "--workspace-sync-interval", "2s")...)
	logOnFailure(t, g)
	if code := g.api(t, http.MethodPost, "/v1/workspaces", map[string]any{"name": "links"}, nil); code != http.StatusCreated {
		t.Fatalf("create workspace: %d", code)
	}
	body := map[string]any{"workspace": "links", "resources": map[string]any{"diskMiB": 256}}
	id, code, _ := createWith(t, g, g.Token, body)
	if code != http.StatusCreated {
		t.Fatalf("create session: %d", code)
	}
	start := time.Now()
	wsRun(t, g, g.Token, id, "head -c 100000000 /dev/urandom > big.bin && sha256sum big.bin > big.sum && echo v1 > keep.txt")
	if ok, lastErr := waitSessionSynced(t, g, g.Token, id, start); !ok {
		t.Fatalf("the 100 MB file did not sync: lastError %q", lastErr)
	}
	edited := time.Now()
	wsRun(t, g, g.Token, id, "ln big.bin big2.bin && ln big.bin big3.bin && echo v2 > keep.txt && truncate -s 1T sparse.bin")
	if ok, lastErr := waitSessionSynced(t, g, g.Token, id, edited); !ok {
		t.Errorf("no sync after the hard links and the sparse file: lastError %q", lastErr)
	}
	deleteSession(t, g, g.Token, id, "")

	id2, code, _ := createWith(t, g, g.Token, body)
	if code != http.StatusCreated {
		t.Fatalf("create the next session: %d", code)
	}
	out := wsRun(t, g, g.Token, id2, "cat keep.txt; stat -c %h big2.bin; stat -c %s sparse.bin; du -k sparse.bin | cut -f1; sha256sum -c big.sum")
	if want := "v2\n3\n1099511627776\n0\nbig.bin: OK\n"; out != want {
		t.Errorf("the next session: %q, want %q", out, want)
	}
	if w := listWorkspaces(t, g, g.Token)["links"]; w.SizeBytes > 101_000_000 {
		t.Errorf("the workspace counts %d bytes: the 100 MB file more than once?", w.SizeBytes)
	}
	deleteSession(t, g, g.Token, id2, "")
}

// TestSnapshotsUnderWriteLoop is issue 35's fifth finding: snapshots of
// a session whose processes keep writing and renaming files (a `mv`
// loop: a new process every few milliseconds) failed about 1 in 20 with
// 503 snapshot_failed, the freeze not done in time, and nothing logged.
// Now every one succeeds, consistent. SNAPSHOTS sets how many (200 by
// default; the measurement).
func TestSnapshotsUnderWriteLoop(t *testing.T) {
	requireLinuxDriver(t)
	n := 200
	if v, err := strconv.Atoi(os.Getenv("SNAPSHOTS")); err == nil && v > 0 {
		n = v
	}
	g := startGateway(t, "--sandbox", "linux")
	logOnFailure(t, g)
	id := g.createSession(t).SessionID
	wsRun(t, g, g.Token, id, "mkdir -p d && for i in $(seq 20); do echo $i > d/f$i; done; "+
		"(nohup sh -c 'while :; do echo x > a.tmp; mv a.tmp a; mv a b; mv b a.done; for f in d/f*; do mv $f $f.m; mv $f.m $f; done; done' >/dev/null 2>&1 &)")
	var failed []string
	longest := 0.0
	for i := range n {
		var sn struct {
			SnapshotID   string  `json:"snapshotId"`
			Consistent   bool    `json:"consistent"`
			FrozenMillis float64 `json:"frozenMillis"`
			Error        struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		code := g.api(t, http.MethodPost, "/v1/sessions/"+id+"/snapshots", nil, &sn)
		if code != http.StatusCreated || !sn.Consistent {
			failed = append(failed, fmt.Sprintf("#%d: %d %s %s consistent=%v", i, code, sn.Error.Code, sn.Error.Message, sn.Consistent))
			continue
		}
		longest = max(longest, sn.FrozenMillis)
		// The tenant keeps at most 1000 snapshots: delete as we go.
		if code := g.api(t, http.MethodDelete, "/v1/snapshots/"+sn.SnapshotID, nil, nil); code != http.StatusNoContent {
			t.Fatalf("delete snapshot: %d", code)
		}
	}
	log := g.stderr.String()
	t.Logf("%d snapshots under a mv loop: %d failed; longest freeze %.2f ms; freezes tried again %d times, snapshots taken without a freeze %d",
		n, len(failed), longest, strings.Count(log, "workspace_freeze_failed"), strings.Count(log, "workspace_snapshot_unfrozen"))
	if len(failed) > 0 {
		t.Errorf("%d of %d snapshots failed:\n%s", len(failed), n, strings.Join(failed, "\n"))
	}
}
