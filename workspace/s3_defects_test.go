package workspace

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/internal/readyfile"
)

// fakeS3 runs the real S3-compatible test server (internal/s3test/fakes3)
// in a process of its own, for the test's life.
type fakeS3 struct {
	URL  string
	tr   *http.Transport
	cmd  *exec.Cmd
	done chan struct{}
}

func startFakeS3(t *testing.T) *fakeS3 {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "fakes3")
	if out, err := exec.Command("go", "build", "-o", bin, "../internal/s3test/fakes3").CombinedOutput(); err != nil {
		t.Fatalf("build fakes3: %v\n%s", err, out)
	}
	ready := filepath.Join(dir, "ready")
	f := &fakeS3{tr: &http.Transport{}, done: make(chan struct{})}
	f.cmd = exec.Command(bin, "-listen", "127.0.0.1:0", "-db", filepath.Join(dir, "s3.db"), "-ready-file", ready)
	f.cmd.Stderr = os.Stderr
	if err := f.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var exit error
	go func() { exit = f.cmd.Wait(); close(f.done) }()
	t.Cleanup(func() {
		f.tr.CloseIdleConnections()
		select {
		case <-f.done:
			t.Errorf("fakes3 ended on its own during the test: %v (its stderr is in the test's output)", exit)
		default:
			_ = f.cmd.Process.Signal(syscall.SIGKILL)
			<-f.done
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	u, err := readyfile.Wait(ctx, ready, f.done)
	if err != nil {
		t.Fatalf("fakes3 did not start: %v", err)
	}
	f.URL = u
	return f
}

func (f *fakeS3) backend(t *testing.T) Backend {
	t.Helper()
	env := map[string]string{"AWS_ACCESS_KEY_ID": "test-key", "AWS_SECRET_ACCESS_KEY": "test-secret"}
	b, err := NewS3Backend(S3Config{URL: "s3://sandgate-test/ws", Endpoint: f.URL, Transport: f.tr}, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (f *fakeS3) putCount(t *testing.T) int {
	t.Helper()
	resp, err := http.Get(f.URL + "/_stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st struct {
		Requests map[string]int `json:"requests"`
	}
	if err := jsonDecode(resp, &st); err != nil {
		t.Fatal(err)
	}
	return st.Requests[http.MethodPut]
}

// snapshotOf captures files into a new snapshot of tenant and pushes
// it to the object store.
func snapshotOf(t *testing.T, s *Service, tenant string, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for p, c := range files {
		write(t, filepath.Join(dir, p), c)
	}
	info, err := s.Snapshot(context.Background(), tenant, tenant+"-snapper", &dirSandbox{dir: dir}, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	return info.SnapshotID
}

// TestHostileBucket: what an object store hands back is checked and
// bounded: an object larger than its entry says is refused after
// reading one byte past it, a doc over the size or page bounds is
// refused, and one tenant's bad doc does not stop the collection of
// what another tenant deleted.
func TestHostileBucket(t *testing.T) {
	f := startFakeS3(t)
	ctx := context.Background()
	remote := f.backend(t)
	s := newServiceCfg(t, Config{Remote: remote})
	id := snapshotOf(t, s, "good", map[string]string{"f": "hello"})
	key := snapshotKey("good", id)
	d, err := s.readDoc(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	es, err := s.entries(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	// The object store's copy of the 5-byte file becomes 8 MiB.
	putRaw(t, remote, objectKey(es[0].Hash), bytes.Repeat([]byte("x"), 8<<20))

	// A gateway with a wiped disk reads it back.
	fresh := newServiceCfg(t, Config{Remote: remote})
	err = fresh.Attach(ctx, "good", "s1", gateway.WorkspaceRef{FromSnapshot: id}, &dirSandbox{dir: t.TempDir()}, true)
	if !errors.Is(err, errCorrupt) || !strings.Contains(err.Error(), "larger than its 5 bytes") {
		t.Errorf("oversized object: %v", err)
	}
	if n := storeBytes(t, fresh); n > 1<<20 {
		t.Errorf("%d bytes of objects kept from a refused read", n)
	}

	for name, data := range map[string][]byte{
		"huge":  bytes.Repeat([]byte(" "), maxDocBytes+1),
		"pages": docJSON(t, &doc{Pages: make([]page, maxPages+1)}),
		"json":  []byte("{not json"),
	} {
		k := snapshotKey("evil", "snap_"+strings.Repeat("0", 23)+string(rune('a'+len(name))))
		putRaw(t, remote, k, data)
		if _, err := fresh.readDoc(ctx, k); !errors.Is(err, errCorrupt) {
			t.Errorf("%s doc: %v", name, err)
		}
	}
	bigPage := docJSON(t, &doc{Pages: []page{{Hash: strings.Repeat("b", 64), Size: maxPageBytes + 1}}})
	putRaw(t, remote, snapshotKey("evil", "snap_"+strings.Repeat("1", 24)), bigPage)

	// Another tenant's workspace is deleted: its objects go, although
	// the bad docs are there.
	other := snapshotOf(t, s, "other", map[string]string{"g": "only in other's snapshot"})
	od, err := s.readDoc(ctx, snapshotKey("other", other))
	if err != nil {
		t.Fatal(err)
	}
	oes, err := s.entries(ctx, od)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.remove(ctx, snapshotKey("other", other)); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(ctx); err != nil {
		t.Fatalf("flush with bad docs in the bucket: %v", err)
	}
	if _, err := remote.Get(ctx, objectKey(oes[0].Hash)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the deleted snapshot's object is still in the bucket: %v", err)
	}
	if _, err := os.Stat(filepath.Join(s.local.dir, objectKey(oes[0].Hash))); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the deleted snapshot's object is still in the local store: %v", err)
	}
}

// TestDeleteSticks: a deleted workspace stays deleted while the object
// store still holds it, across a restart, until the queued remote delete
// ran; keepWorkspace=false alike.
func TestDeleteSticks(t *testing.T) {
	f := startFakeS3(t)
	ctx := context.Background()
	remote := f.backend(t)
	dir := t.TempDir()
	s := newServiceCfg(t, Config{Dir: dir, Remote: remote})
	for _, name := range []string{"deleted", "dropped"} {
		if _, err := s.CreateWorkspace(ctx, "t", name); err != nil {
			t.Fatal(err)
		}
	}
	sb := &dirSandbox{dir: t.TempDir()}
	write(t, filepath.Join(sb.dir, "f"), "data")
	if err := s.Claim(ctx, "t", "s1", gateway.WorkspaceRef{Name: "dropped"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Attach(ctx, "t", "s1", gateway.WorkspaceRef{Name: "dropped"}, sb, true); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// Keep the remote docs as they are now: the delete below removes them
	// from the store at once when it answers; put back, they stand for a
	// store that refused (or never saw) that delete.
	saved := map[string][]byte{}
	for _, name := range []string{"deleted", "dropped"} {
		r, err := remote.Get(ctx, workspaceKey("t", name))
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(r)
		r.Close()
		if err != nil {
			t.Fatal(err)
		}
		saved[name] = b
	}
	// Deleted here; the pusher does not run (the store is unreachable,
	// or the gateway stops first).
	if err := s.DeleteWorkspace(ctx, "t", "deleted"); err != nil {
		t.Fatal(err)
	}
	s.DropOnEnd("s1", true)
	s.Detach(ctx, "s1")
	for name, b := range saved {
		if err := remote.Put(ctx, workspaceKey("t", name), bytes.NewReader(b), int64(len(b))); err != nil {
			t.Fatal(err)
		}
	}
	for _, svc := range []*Service{s, newServiceCfg(t, Config{Dir: dir, Remote: remote})} {
		list, err := svc.ListWorkspaces(ctx, "t")
		if err != nil || len(list) != 0 {
			t.Errorf("list after delete: %+v %v", list, err)
		}
		for _, name := range []string{"deleted", "dropped"} {
			if err := svc.Claim(ctx, "t", "s2", gateway.WorkspaceRef{Name: name}); !isCode(err, "workspace_not_found") {
				t.Errorf("claim of %s after delete: %v", name, err)
			}
			r, err := remote.Get(ctx, workspaceKey("t", name))
			if err != nil {
				t.Errorf("the remote copy of %s is gone before the push: %v", name, err)
			} else {
				r.Close()
			}
		}
	}
	// The restarted gateway's pusher deletes them remotely.
	restarted := newServiceCfg(t, Config{Dir: dir, Remote: remote})
	if err := restarted.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"deleted", "dropped"} {
		if _, err := remote.Get(ctx, workspaceKey("t", name)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s is still in the object store: %v", name, err)
		}
	}
	if tombs, err := restarted.local.List(ctx, "tombstones/"); err != nil || len(tombs) != 0 {
		t.Errorf("tombstones left: %v %v", tombs, err)
	}
	// A new workspace of the same name is a new one.
	if _, err := restarted.CreateWorkspace(ctx, "t", "deleted"); err != nil {
		t.Fatal(err)
	}
	if list, err := restarted.ListWorkspaces(ctx, "t"); err != nil || len(list) != 1 {
		t.Errorf("list after re-create: %+v %v", list, err)
	}
}

func isCode(err error, code string) bool {
	var ge *gateway.Error
	return errors.As(err, &ge) && ge.Code == code
}

// TestArtifactUploadExpires: an artifact uploaded longer ago than
// artifactReuse is uploaded again (a lifecycle rule may have expired it);
// a recent one is linked again without a new upload.
func TestArtifactUploadExpires(t *testing.T) {
	f := startFakeS3(t)
	ctx := context.Background()
	s := newServiceCfg(t, Config{Remote: f.backend(t)})
	sb := &dirSandbox{dir: t.TempDir()}
	write(t, filepath.Join(sb.dir, "out.txt"), "result")
	link := func() {
		t.Helper()
		if _, err := s.PresignArtifact(ctx, sb, "out.txt", time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	link()
	puts := f.putCount(t)
	link()
	if n := f.putCount(t); n != puts {
		t.Errorf("a recent artifact was uploaded again: %d PUTs, want %d", n, puts)
	}
	s.mu.Lock()
	for k := range s.uploaded {
		s.uploaded[k] = time.Now().Add(-artifactReuse)
	}
	s.mu.Unlock()
	link()
	if n := f.putCount(t); n != puts+1 {
		t.Errorf("an old artifact was not uploaded again: %d PUTs, want %d", n, puts+1)
	}
}
