package workspace

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/sandgate/sandgate/gateway"
)

// TestHardLinksAndSparseFilesAreKept reproduces issue 35's first finding,
// scaled to a 1 MiB workspace: a 600 KiB file synced once, then two more
// names of it, a new keep.txt, a 1 TiB sparse file and a sparse file with
// data past its holes. Counted by apparent size (1.8 MiB and more than a
// TiB) every sync failed silently and the next session read the old
// keep.txt. Now the syncs succeed, the store holds the 600 KiB once, and
// the next session, on a gateway that has only the object store, gets
// the links as links and the sparse files sparse. A file really over the
// limit then shows in lastError, a DELETE's final sync refuses, and
// discard ends the session keeping the last saved version.
func TestHardLinksAndSparseFilesAreKept(t *testing.T) {
	f := startFakeS3(t)
	ctx := context.Background()
	remote := f.backend(t)
	s := newServiceCfg(t, Config{MaxBytes: 1 << 20, Remote: remote})
	if _, err := s.CreateWorkspace(ctx, "t", "w"); err != nil {
		t.Fatal(err)
	}
	sb := &dirSandbox{dir: t.TempDir()}
	attach := func(s *Service, session string, sb *dirSandbox) {
		t.Helper()
		if err := s.Claim(ctx, "t", session, gateway.WorkspaceRef{Name: "w"}); err != nil {
			t.Fatal(err)
		}
		if err := s.Attach(ctx, "t", session, gateway.WorkspaceRef{Name: "w"}, sb, true); err != nil {
			t.Fatal(err)
		}
	}
	attach(s, "s1", sb)
	big := bytes.Repeat([]byte("0123456789abcdef"), 600<<10/16)
	if err := os.WriteFile(filepath.Join(sb.dir, "big.bin"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(sb.dir, "keep.txt"), "v1\n")
	s.syncAll(ctx)
	if st := s.SessionSync("s1"); st.LastError != "" {
		t.Fatalf("first sync: %q", st.LastError)
	}

	for _, l := range []string{"big2.bin", "a/big3.bin"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(sb.dir, l)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Link(filepath.Join(sb.dir, "big.bin"), filepath.Join(sb.dir, l)); err != nil {
			t.Fatal(err)
		}
	}
	write(t, filepath.Join(sb.dir, "keep.txt"), "v2\n")
	write(t, filepath.Join(sb.dir, "sparse.bin"), "")
	if err := os.Truncate(filepath.Join(sb.dir, "sparse.bin"), 1<<40); err != nil {
		t.Fatal(err)
	}
	tail, err := os.Create(filepath.Join(sb.dir, "tail.bin"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tail.WriteAt([]byte("head"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := tail.WriteAt([]byte("tail"), 1<<30); err != nil {
		t.Fatal(err)
	}
	tail.Close()
	s.syncAll(ctx)
	if st := s.SessionSync("s1"); st.LastError != "" {
		t.Fatalf("sync with hard links and sparse files: %q", st.LastError)
	}
	if err := s.FinalSync(ctx, "s1"); err != nil {
		t.Fatalf("final sync: %v", err)
	}
	s.Detach(ctx, "s1")
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if n := storeBytes(t, s); n > 700<<10 {
		t.Errorf("the local store holds %d bytes: the 600 KiB file more than once?", n)
	}
	l, err := s.ListWorkspaces(ctx, "t")
	// tail.bin holds its two blocks of data.
	if want := int64(len(big)) + 3; err != nil || len(l) != 1 || l[0].Files != 6 || l[0].SizeBytes < want+8 || l[0].SizeBytes > want+8<<10 {
		t.Errorf("list: %+v %v; want 6 files holding %d bytes and tail.bin's blocks", l, err, want)
	}

	// A gateway with an empty data dir: the object store has it all.
	s2 := newServiceCfg(t, Config{MaxBytes: 1 << 20, Remote: remote})
	sb2 := &dirSandbox{dir: t.TempDir()}
	attach(s2, "s2", sb2)
	if b, err := os.ReadFile(filepath.Join(sb2.dir, "keep.txt")); err != nil || string(b) != "v2\n" {
		t.Errorf("keep.txt in the next session: %q %v", b, err)
	}
	var first syscall.Stat_t
	if err := syscall.Stat(filepath.Join(sb2.dir, "a/big3.bin"), &first); err != nil || first.Nlink != 3 {
		t.Errorf("a/big3.bin: %v, %d names; want 3", err, first.Nlink)
	}
	for _, l := range []string{"big.bin", "big2.bin"} {
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(sb2.dir, l), &st); err != nil || st.Ino != first.Ino {
			t.Errorf("%s is not a hard link of a/big3.bin: %v", l, err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(sb2.dir, "big2.bin")); err != nil || !bytes.Equal(b, big) {
		t.Errorf("big2.bin's content differs: %v", err)
	}
	var sp syscall.Stat_t
	if err := syscall.Stat(filepath.Join(sb2.dir, "sparse.bin"), &sp); err != nil || sp.Size != 1<<40 || sp.Blocks*512 > 64<<10 {
		t.Errorf("sparse.bin: %v, %d bytes long, %d allocated; want 1 TiB long, nothing allocated", err, sp.Size, sp.Blocks*512)
	}
	tf, err := os.Open(filepath.Join(sb2.dir, "tail.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer tf.Close()
	got := make([]byte, 4)
	if _, err := tf.ReadAt(got, 1<<30); err != nil || string(got) != "tail" {
		t.Errorf("tail.bin at 1 GiB: %q %v", got, err)
	}
	if _, err := tf.ReadAt(got, 0); err != nil || string(got) != "head" {
		t.Errorf("tail.bin at 0: %q %v", got, err)
	}
	if fi, _ := tf.Stat(); fi.Sys().(*syscall.Stat_t).Blocks*512 > 1<<20 {
		t.Errorf("tail.bin has %d bytes allocated: its hole was written", fi.Sys().(*syscall.Stat_t).Blocks*512)
	}

	// Over the limit for real: said in lastError, the final sync
	// refuses, and discard keeps the last saved version.
	if err := os.WriteFile(filepath.Join(sb2.dir, "over.bin"), bytes.Repeat([]byte("x"), 2<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(sb2.dir, "keep.txt"), "v3\n")
	s2.syncAll(ctx)
	if st := s2.SessionSync("s2"); !strings.Contains(st.LastError, `over.bin`) {
		t.Errorf("session's lastError after a failed sync: %q", st.LastError)
	}
	if l, err := s2.ListWorkspaces(ctx, "t"); err != nil || len(l) != 1 || l[0].Sync == nil || !strings.Contains(l[0].Sync.LastError, "over.bin") {
		t.Errorf("workspace list after a failed sync: %+v %v", l, err)
	}
	err = s2.FinalSync(ctx, "s2")
	var ge *gateway.Error
	if !errors.As(err, &ge) || ge.Code != "workspace_sync_failed" || ge.Kind != gateway.KindConflict || !strings.Contains(ge.Message, "over.bin") {
		t.Fatalf("final sync over the limit: %v", err)
	}
	s2.DiscardOnEnd("s2", true)
	s2.Detach(ctx, "s2")
	sb3 := &dirSandbox{dir: t.TempDir()}
	attach(s2, "s3", sb3)
	if b, err := os.ReadFile(filepath.Join(sb3.dir, "keep.txt")); err != nil || string(b) != "v2\n" {
		t.Errorf("keep.txt after discard: %q %v; want the last saved v2", b, err)
	}
	// Removed, it saves again, and lastError is gone.
	s2.Detach(ctx, "s3")
}

// TestRestoreRefusesBadLinksAndExtents: hard links and extents read from
// a store are input: a link to no file before it, and extents out of
// order or past the file's end, are refused.
func TestRestoreRefusesBadLinksAndExtents(t *testing.T) {
	s := newServiceCfg(t, Config{MaxBytes: 1 << 20})
	h := strings.Repeat("a", 64)
	for name, es := range map[string][]Entry{
		"link to nothing":  {{Path: "b", Mode: 0o644, HardLink: "a"}},
		"link to a later":  {{Path: "a", Mode: 0o644, HardLink: "b"}, {Path: "b", Mode: 0o644, Hash: h, Size: 1}},
		"link with data":   {{Path: "a", Mode: 0o644, Hash: h, Size: 1}, {Path: "b", Mode: 0o644, HardLink: "a", Hash: h}},
		"link out":         {{Path: "a", Mode: 0o644, HardLink: "../x"}},
		"extent past end":  {{Path: "a", Mode: 0o644, Size: 10, Hash: h, Sparse: true, Extents: [][2]int64{{8, 4}}}},
		"extents overlap":  {{Path: "a", Mode: 0o644, Size: 10, Hash: h, Sparse: true, Extents: [][2]int64{{0, 4}, {2, 4}}}},
		"extent empty":     {{Path: "a", Mode: 0o644, Size: 10, Hash: h, Sparse: true, Extents: [][2]int64{{0, 0}}}},
		"extents unsparse": {{Path: "a", Mode: 0o644, Size: 10, Hash: h, Extents: [][2]int64{{0, 4}}}},
		"data over limit":  {{Path: "a", Mode: 0o644, Size: 1 << 40, Hash: h, Sparse: true, Extents: [][2]int64{{0, 2 << 20}}}},
	} {
		if err := s.restore(context.Background(), &Manifest{Entries: es}, t.TempDir()); err == nil {
			t.Errorf("%s: restored", name)
		}
	}
}

// TestStoreErrorsAreLogged: a store failure that the API answers as 503
// workspace_store_failed is in the log with its cause.
func TestStoreErrorsAreLogged(t *testing.T) {
	var log bytes.Buffer
	remote := &laggingStore{Backend: newServiceCfg(t, Config{}).local, down: true}
	s := newServiceCfg(t, Config{Remote: remote, Log: slog.New(slog.NewTextHandler(&log, nil))})
	_, err := s.CreateWorkspace(context.Background(), "t", "w")
	var ge *gateway.Error
	if !errors.As(err, &ge) || ge.Code != "workspace_store_failed" {
		t.Fatalf("create with the store down: %v", err)
	}
	if !strings.Contains(log.String(), "workspace_store_failed") || !strings.Contains(log.String(), "store unreachable") {
		t.Errorf("log: %s", log.String())
	}
}

// failingFreezer is a session whose freeze never completes.
type failingFreezer struct {
	dirSandbox
	tries atomic.Int32
}

func (f *failingFreezer) Freeze(context.Context) (func() error, error) {
	f.tries.Add(1)
	return nil, errors.New("the sandbox's processes did not freeze in time")
}

// TestSnapshotWithoutFreeze: a freeze that keeps failing is tried again,
// then the snapshot is taken without one when two scans in a row agree
// (consistent), and refused only when the files change between every
// two scans; every failure is logged with its cause.
func TestSnapshotWithoutFreeze(t *testing.T) {
	var log bytes.Buffer
	var logMu sync.Mutex
	s := newServiceCfg(t, Config{Log: slog.New(slog.NewTextHandler(&lockedWriter{w: &log, mu: &logMu}, nil))})
	ctx := context.Background()
	sb := &failingFreezer{dirSandbox: dirSandbox{dir: t.TempDir()}}
	write(t, filepath.Join(sb.dir, "a"), "steady")
	info, err := s.Snapshot(ctx, "t", "s1", sb, false)
	if err != nil || !info.Consistent || info.Files != 1 {
		t.Fatalf("snapshot of steady files without a freeze: %+v %v", info, err)
	}
	if n := sb.tries.Load(); n != freezeTries {
		t.Errorf("freeze tried %d times, want %d", n, freezeTries)
	}

	// A writer that never rests: the files change between every two
	// scans, so no two agree.
	i := 0
	s.beforeStableScan = func() {
		i++
		write(t, filepath.Join(sb.dir, "counter"), strconv.Itoa(i))
	}
	_, err = s.Snapshot(ctx, "t", "s1", sb, false)
	var ge *gateway.Error
	if !errors.As(err, &ge) || ge.Code != "snapshot_failed" || !errors.Is(err, errUnstable) {
		t.Fatalf("snapshot of changing files without a freeze: %v", err)
	}
	logMu.Lock()
	defer logMu.Unlock()
	for _, want := range []string{"workspace_freeze_failed", "workspace_snapshot_unfrozen", "workspace_snapshot_failed", "did not freeze in time"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("the log has no %q:\n%s", want, log.String())
		}
	}
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestAppendExtentBounds: a file of many data regions keeps at most
// maxExtents, in order, covering every region.
func TestAppendExtentBounds(t *testing.T) {
	var ext [][2]int64
	for i := range int64(5000) {
		ext = appendExtent(ext, i*8192, 4096)
	}
	if len(ext) > maxExtents {
		t.Fatalf("%d extents, more than %d", len(ext), maxExtents)
	}
	e := Entry{Path: "f", Mode: 0o644, Size: 5000 * 8192, Sparse: true, Extents: ext}
	if err := checkEntry(&e); err != nil {
		t.Fatal(err)
	}
	covered := func(off int64) bool {
		for _, x := range ext {
			if off >= x[0] && off < x[0]+x[1] {
				return true
			}
		}
		return false
	}
	for i := range int64(5000) {
		if !covered(i*8192) || !covered(i*8192+4095) {
			t.Fatalf("region %d is not kept", i)
		}
	}
	if got := appendExtent([][2]int64{{0, 10}}, 10, 5); len(got) != 1 || got[0] != [2]int64{0, 15} {
		t.Errorf("touching regions: %v", got)
	}
}
