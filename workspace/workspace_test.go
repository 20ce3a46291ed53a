package workspace

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newService(t *testing.T) *Service {
	t.Helper()
	s, err := New(Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o640); err != nil {
		t.Fatal(err)
	}
}

// TestScanRestoreHostile: a workspace's symlinks are kept as links, never
// followed out of it; special files are skipped (a FIFO would block a
// reader); a restore makes the same tree.
func TestScanRestoreHostile(t *testing.T) {
	s := newService(t)
	ctx := context.Background()
	src := t.TempDir()
	outside := t.TempDir()
	write(t, filepath.Join(outside, "secret"), "host secret")
	write(t, filepath.Join(src, "a", "b", "file"), "hello")
	for name, target := range map[string]string{"esc": filepath.Join(outside, "secret"), "escdir": outside, "rel": "a/b/file"} {
		if err := os.Symlink(target, filepath.Join(src, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := syscall.Mkfifo(filepath.Join(src, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	m, st, err := s.scan(ctx, src, scanCache{}, 1<<30, &pinSet{})
	if err != nil {
		t.Fatal(err)
	}
	if st.Files != 1 || m.Bytes() != 5 {
		t.Errorf("scan: %+v, %d bytes; want one file of 5 bytes", st, m.Bytes())
	}
	links := map[string]string{}
	for _, e := range m.Entries {
		if e.Link != "" {
			links[e.Path] = e.Link
		}
		if e.Path == "fifo" {
			t.Error("the FIFO is in the manifest")
		}
	}
	if len(links) != 3 || links["rel"] != "a/b/file" {
		t.Errorf("links: %v", links)
	}
	dst := t.TempDir()
	if err := s.restore(ctx, m, dst); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "rel")); err != nil || string(b) != "hello" {
		t.Errorf("restored: %q %v", b, err)
	}
	if fi, err := os.Lstat(filepath.Join(dst, "a", "b", "file")); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("mode: %v %v", fi, err)
	}
	if target, err := os.Readlink(filepath.Join(dst, "esc")); err != nil || target != filepath.Join(outside, "secret") {
		t.Errorf("escaping link: %q %v", target, err)
	}
}

// TestRestoreRefusesBadManifests: a manifest read back from an object
// store is input: paths leave nothing, and bad hashes are refused.
func TestRestoreRefusesBadManifests(t *testing.T) {
	s := newService(t)
	outside := t.TempDir()
	for name, m := range map[string]*Manifest{
		"dotdot":   {Entries: []Entry{{Path: "../x", Mode: 0o644, Hash: "00"}}},
		"absolute": {Entries: []Entry{{Path: "/x", Mode: 0o644}}},
		"hash":     {Entries: []Entry{{Path: "x", Mode: 0o644, Hash: "../../etc/passwd"}}},
		"through-link": {Entries: []Entry{
			{Path: "l", Mode: os.ModeSymlink | 0o777, Link: outside},
			{Path: "l/x", Mode: os.ModeDir | 0o755},
		}},
	} {
		t.Run(name, func(t *testing.T) {
			if err := s.restore(context.Background(), m, t.TempDir()); err == nil {
				t.Error("restore accepted it")
			}
		})
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Errorf("written outside: %v", entries)
	}
}

// TestScanIsIncremental: a second scan reads only the changed file.
func TestScanIsIncremental(t *testing.T) {
	s := newService(t)
	src := t.TempDir()
	for _, n := range []string{"a", "b", "c", "d"} {
		write(t, filepath.Join(src, n), n)
	}
	time.Sleep(2 * racyWindow) // older than the racy window: cacheable
	cache := scanCache{}
	if _, st, err := s.scan(context.Background(), src, cache, 1<<30, &pinSet{}); err != nil || st.Hashed != 4 {
		t.Fatalf("first scan: %+v %v", st, err)
	}
	write(t, filepath.Join(src, "b"), "changed")
	m, st, err := s.scan(context.Background(), src, cache, 1<<30, &pinSet{})
	if err != nil || st.Hashed != 1 || st.HashedBytes != 7 {
		t.Errorf("second scan: %+v %v; want only b read", st, err)
	}
	if m.Bytes() != 10 {
		t.Errorf("size %d, want 10", m.Bytes())
	}
}

// TestScanOrder: a manifest is in path order even where a directory's
// walk is not ("a/x" sorts after "a-b"), and restores.
func TestScanOrder(t *testing.T) {
	s := newService(t)
	src := t.TempDir()
	for _, p := range []string{"a/x", "a-b", "a.c/y", "b"} {
		write(t, filepath.Join(src, p), p)
	}
	m, _, err := s.scan(context.Background(), src, scanCache{}, 1<<30, &pinSet{})
	if err != nil {
		t.Fatal(err)
	}
	d := &doc{}
	if err := s.setEntries(d, m.Entries, &pinSet{}); err != nil {
		t.Fatal(err)
	}
	es, err := s.entries(context.Background(), d)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.restore(context.Background(), &Manifest{Entries: es}, t.TempDir()); err != nil {
		t.Fatal(err)
	}
}
