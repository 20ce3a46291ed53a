package workspace

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/sandbox"
)

// dirSandbox is a session whose /workspace is a plain directory: the
// engine only reads and writes that directory (and freezes, when
// freeze is set).
type dirSandbox struct {
	dir    string
	freeze func() // called while "frozen"
}

func (d *dirSandbox) Workdir() string { return d.dir }
func (d *dirSandbox) Start(context.Context, sandbox.Cmd) (sandbox.Process, error) {
	return nil, errors.New("dirSandbox runs nothing")
}
func (d *dirSandbox) Destroy(context.Context) error { return nil }

type freezingSandbox struct{ dirSandbox }

func (f *freezingSandbox) Freeze(context.Context) (func() error, error) {
	f.freeze()
	return func() error { return nil }, nil
}

func newServiceCfg(t *testing.T, cfg Config) *Service {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestCaptureRefusesSizeBomb: a sparse file whose length is far over
// the workspace's limit is kept by its data (nothing is read of its
// holes, and it costs the store nothing); files really holding more than
// the limit together fail the snapshot with an error naming them.
func TestCaptureRefusesSizeBomb(t *testing.T) {
	s := newServiceCfg(t, Config{MaxBytes: 1 << 20})
	ctx := context.Background()
	dir := t.TempDir()
	sb := &dirSandbox{dir: dir}
	write(t, filepath.Join(dir, "small"), "hello")
	f, err := os.Create(filepath.Join(dir, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Truncate(filepath.Join(dir, "sparse"), 512<<10); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Snapshot(ctx, "t", "s1", sb, true); err != nil {
		t.Fatalf("a workspace under the limit: %v", err)
	}

	bomb := filepath.Join(dir, "bomb")
	write(t, bomb, "")
	if err := os.Truncate(bomb, 1<<40); err != nil {
		t.Fatal(err)
	}
	info, err := s.Snapshot(ctx, "t", "s1", sb, true)
	if err != nil {
		t.Fatalf("1 TiB sparse file: %v; want it kept by its data", err)
	}
	if info.SizeBytes != 5 {
		t.Errorf("snapshot size %d, want the 5 bytes the files hold", info.SizeBytes)
	}
	if n := storeBytes(t, s); n > 1<<20 {
		t.Errorf("the store holds %d bytes after the 1 TiB sparse file", n)
	}
	if err := os.Remove(bomb); err != nil {
		t.Fatal(err)
	}

	write(t, filepath.Join(dir, "zz"), strings.Repeat("x", 600<<10))
	write(t, filepath.Join(dir, "zy"), strings.Repeat("y", 600<<10))
	_, err = s.Snapshot(ctx, "t", "s1", sb, true)
	var ge *gateway.Error
	if !errors.As(err, &ge) || ge.Code != "snapshot_failed" || !strings.Contains(ge.Message, `the files up to "zz"`) || !errors.Is(err, errTooLarge) {
		t.Fatalf("files over the limit together: %v", err)
	}
}

// storeBytes is what the local store's objects hold.
func storeBytes(t *testing.T, s *Service) int64 {
	t.Helper()
	var n int64
	err := filepath.WalkDir(filepath.Join(s.local.dir, "objects"), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		if err == nil {
			n += fi.Size()
		}
		return err
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	return n
}

// TestCaptureLetsCollectRun: a capture does not hold the collection's
// lock while it scans (here: while the session is frozen, between its two
// scans), and a collection meanwhile keeps the objects it stored but no
// doc names yet: the snapshot restores whole.
func TestCaptureLetsCollectRun(t *testing.T) {
	s := newService(t)
	ctx := context.Background()
	dir := t.TempDir()
	for _, n := range []string{"a", "b/c", "d"} {
		write(t, filepath.Join(dir, n), "content of "+n)
	}
	ran := false
	sb := &freezingSandbox{dirSandbox{dir: dir}}
	sb.freeze = func() {
		if !s.gcMu.TryLock() {
			t.Error("gcMu is held while the workspace is scanned")
			return
		}
		s.gcMu.Unlock()
		before := storeBytes(t, s)
		if err := s.collect(ctx); err != nil {
			t.Error(err)
		}
		if after := storeBytes(t, s); before == 0 || after != before {
			t.Errorf("a collection during the capture took its objects: %d bytes, then %d", before, after)
		}
		ran = true
	}
	info, err := s.Snapshot(ctx, "t", "s1", sb, false)
	if err != nil || !ran {
		t.Fatalf("snapshot: %v (collect ran: %v)", err, ran)
	}
	dst := t.TempDir()
	if err := s.Attach(ctx, "t", "s2", gateway.WorkspaceRef{FromSnapshot: info.SnapshotID}, &dirSandbox{dir: dst}, true); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "b", "c")); err != nil || string(b) != "content of b/c" {
		t.Errorf("restored: %q %v", b, err)
	}
	if len(s.pins) != 0 {
		t.Errorf("pins left: %v", s.pins)
	}
}

// TestRestoreRefusesTruncatedObject: an object the local store lost the
// end of (a power cut before it reached the disk) fails the restore; it
// is never a short file.
func TestRestoreRefusesTruncatedObject(t *testing.T) {
	s := newService(t)
	ctx := context.Background()
	dir := t.TempDir()
	write(t, filepath.Join(dir, "f"), "some bytes that matter")
	info, err := s.Snapshot(ctx, "t", "s1", &dirSandbox{dir: dir}, true)
	if err != nil {
		t.Fatal(err)
	}
	m, _, err := s.scan(ctx, dir, scanCache{}, 1<<30, &pinSet{})
	if err != nil {
		t.Fatal(err)
	}
	obj := filepath.Join(s.local.dir, objectKey(m.Entries[0].Hash))
	for _, cut := range []int64{0, 4} {
		if err := os.Truncate(obj, cut); err != nil {
			t.Fatal(err)
		}
		err := s.Attach(ctx, "t", "s2", gateway.WorkspaceRef{FromSnapshot: info.SnapshotID}, &dirSandbox{dir: t.TempDir()}, true)
		if !errors.Is(err, errCorrupt) {
			t.Errorf("object cut to %d bytes: restore says %v", cut, err)
		}
	}
}

// TestRestoreCapsTotal: a manifest whose files add up to more than the
// workspace's limit is refused before anything is read.
func TestRestoreCapsTotal(t *testing.T) {
	s := newServiceCfg(t, Config{MaxBytes: 1 << 20})
	h := strings.Repeat("a", 64)
	m := &Manifest{Entries: []Entry{{Path: "x", Mode: 0o644, Size: 1 << 19, Hash: h}, {Path: "y", Mode: 0o644, Size: 1 << 20, Hash: h}}}
	if err := s.restore(context.Background(), m, t.TempDir()); !errors.Is(err, errTooLarge) {
		t.Errorf("restore: %v", err)
	}
}

// TestSnapshotAfterDetachLeavesNothing: a snapshot racing the session's
// delete (after its Detach) leaves no attachment behind.
func TestSnapshotAfterDetachLeavesNothing(t *testing.T) {
	s := newService(t)
	ctx := context.Background()
	sb := &dirSandbox{dir: t.TempDir()}
	write(t, filepath.Join(sb.dir, "f"), "x")
	if err := s.Attach(ctx, "t", "s1", gateway.WorkspaceRef{}, sb, false); err != nil {
		t.Fatal(err)
	}
	s.Detach(ctx, "s1")
	if _, err := s.Snapshot(ctx, "t", "s1", sb, true); err != nil {
		t.Fatal(err)
	}
	if len(s.sessions) != 0 {
		t.Errorf("sessions left: %v", s.sessions)
	}
	// A live session without a workspace is attached by its first
	// snapshot: the next one reads only what changed.
	if _, err := s.Snapshot(ctx, "t", "s2", sb, true); err != nil {
		t.Fatal(err)
	}
	if s.sessions["s2"] == nil {
		t.Error("a live session's snapshot did not attach it")
	}
}

// corruptDoc writes b as doc key in store b.
func putRaw(t *testing.T, b Backend, key string, data []byte) {
	t.Helper()
	if err := b.Put(context.Background(), key, bytes.NewReader(data), int64(len(data))); err != nil {
		t.Fatal(err)
	}
}

func docJSON(t *testing.T, d *doc) []byte {
	t.Helper()
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func jsonDecode(resp *http.Response, v any) error { return json.NewDecoder(resp.Body).Decode(v) }

// TestReplacedVersionsAreCollected: a named workspace rewritten by one
// session after another keeps in its store only what its last version
// names (and what a snapshot names): the objects of the versions it
// replaced are collected in the background, not kept until the
// workspace is deleted (the soak's leak: the store grew with each
// session).
func TestReplacedVersionsAreCollected(t *testing.T) {
	s := newServiceCfg(t, Config{CollectInterval: 50 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); s.Run(ctx) }()
	defer func() { cancel(); <-ran }()
	if _, err := s.CreateWorkspace(ctx, "t", "w"); err != nil {
		t.Fatal(err)
	}
	objects := func() int {
		keys, err := s.local.List(ctx, "objects/")
		if err != nil {
			t.Fatal(err)
		}
		return len(keys)
	}
	session := func(i int) {
		id := "s" + strconv.Itoa(i)
		sb := &dirSandbox{dir: t.TempDir()}
		if err := s.Claim(ctx, "t", id, gateway.WorkspaceRef{Name: "w"}); err != nil {
			t.Fatal(err)
		}
		if err := s.Attach(ctx, "t", id, gateway.WorkspaceRef{Name: "w"}, sb, true); err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(sb.dir, "log"), strings.Repeat("version "+strconv.Itoa(i)+"\n", 100))
		write(t, filepath.Join(sb.dir, "same"), "unchanged")
		s.Detach(ctx, id)
	}
	session(0)
	one := objects()
	// A snapshot of the first version keeps its objects.
	snapSB := &dirSandbox{dir: t.TempDir()}
	write(t, filepath.Join(snapSB.dir, "log"), strings.Repeat("version 0\n", 100))
	write(t, filepath.Join(snapSB.dir, "same"), "unchanged")
	snap, err := s.Snapshot(ctx, "t", "snap", snapSB, true)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 5; i++ {
		session(i)
	}
	deadline := time.Now().Add(10 * time.Second)
	// The last version's objects, and the snapshot's: the first version's
	// log and the snapshot's own manifest page ("same" is shared).
	want := one + 2
	for objects() > want && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := objects(); n > want {
		t.Errorf("%d objects in the store after 6 versions of one workspace; its first version alone took %d", n, one)
	}
	dst := t.TempDir()
	if err := s.Attach(ctx, "t", "check", gateway.WorkspaceRef{FromSnapshot: snap.SnapshotID}, &dirSandbox{dir: dst}, true); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "log")); err != nil || !strings.HasPrefix(string(b), "version 0\n") {
		t.Errorf("the snapshot's files after the collection: %.20q %v", b, err)
	}
	s.Detach(ctx, "check")
}
